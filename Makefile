# Benchmarks (see docs/benchmarks.md). `python3 dev.py bench` installs the environment
# into .venv first (as `python3 dev.py test` does), so both targets work from a fresh clone.
.PHONY: bench bench-smoke bench-flink

# Every benchmark of bench/ at full scale: bench/results/, and the table in docs/benchmarks.md. Among
# them bench/peer_flink.py, Strata against Apache Flink SQL: its first run on a machine puts
# Flink into .venv-flink (about 850 MB from PyPI; PyFlink's pins cannot share .venv).
bench:
	python3 dev.py bench --scale full

# The same at tiny scale (about a minute and a half on an idle machine): bench/results/smoke/ only.
bench-smoke:
	python3 dev.py bench --scale smoke

# Strata against Apache Flink SQL alone (bench/peer_flink.py, full scale), its rows of the
# table updated and the other benchmarks' kept.
bench-flink:
	python3 dev.py bench --scale full --only peer_flink
