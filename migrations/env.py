"""Alembic environment: migrations run against the URL the server passes in its Config."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, text

from rewriter.naming import CATALOG_SCHEMA

config = context.config


def run_migrations_online() -> None:
    connectable = config.attributes.get("connection")
    if connectable is None:
        engine = create_engine(config.get_main_option("sqlalchemy.url"))
        with engine.connect() as connection:
            _run(connection)
        engine.dispose()
    else:
        _run(connectable)


def _run(connection) -> None:  # type: ignore[no-untyped-def]
    # The version table lives in the catalog schema, which must exist before alembic looks.
    connection.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{CATALOG_SCHEMA}"'))
    connection.commit()
    context.configure(connection=connection, version_table_schema=CATALOG_SCHEMA)
    with context.begin_transaction():
        # A migration that carries streams forward runs the functions of plans today's
        # rewriter makes (migrations/plans.py), which may read a table a later migration
        # makes (the waiting windows, 0030): their bodies are checked when called, as
        # pg_dump's restores do, and nothing calls them before the last migration ran.
        connection.execute(text("SET LOCAL check_function_bodies = off"))
        context.run_migrations()
    connection.commit()


run_migrations_online()
