"""Alembic migrations of Strata's catalog; each runs a frozen copy of the SQL it executes."""
