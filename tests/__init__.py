"""Strata's tests: real PostgreSQL and real Spark, started by the suite (conftest.py)."""
