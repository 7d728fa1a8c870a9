"""Strata's server: runs the rewriter's plans. ``api`` (HTTP), ``service`` (stream DDL and
run intake), ``ingest`` (a run's way to committed rows), ``workers`` (background work),
``engines`` (Spark and PostgreSQL), and ``runtime`` (wiring them from ``settings``).
docs/architecture.md says which room holds what."""
