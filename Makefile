# Benchmarks (see README.md, "Benchmarks"). The environment comes from `python3 dev.py test`
# (or `pip install -e ".[bench]"` into .venv).
PYTHON ?= .venv/bin/python

.PHONY: bench bench-smoke

# Every benchmark of bench/ at full scale: bench/results/, and the table in README.md.
bench:
	$(PYTHON) bench/run.py --scale full

# The same at tiny scale (about a minute on an idle machine): bench/results/smoke/ only.
bench-smoke:
	$(PYTHON) bench/run.py --scale smoke
