# Benchmarks (see README.md, "Benchmarks"). `python3 dev.py bench` installs the environment
# into .venv first (as `python3 dev.py test` does), so both targets work from a fresh clone.
.PHONY: bench bench-smoke

# Every benchmark of bench/ at full scale: bench/results/, and the table in README.md.
bench:
	python3 dev.py bench --scale full

# The same at tiny scale (about a minute and a half on an idle machine): bench/results/smoke/ only.
bench-smoke:
	python3 dev.py bench --scale smoke
