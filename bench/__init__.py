"""Strata's benchmarks (docs/benchmarks.md).

``python -m bench.run`` runs every module of this package that defines ``benchmark(scale)``
(``bench.harness.results``); each also runs alone, ``python -m bench.<name> --help``. A
benchmark module holds its workload and its baseline; what they share is ``bench.harness``.
"""
