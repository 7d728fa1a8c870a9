"""The PostgreSQL tables a followed stream joins on read, watched: a statement trigger on
each counts its changes (table_versions, sql/005_feed.sql) in the changing transaction, and
the feed compares the whole view with its announced rows when the counts it saw move.

A stream's ``seen`` count is the sum of its tables' versions, read *before* the view rows
it announced were: announced rows then hold at least every table change it counts, so a
later sum equal to it means no table change is left to announce (versions only grow)."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql

from rewriter.naming import (
    CATALOG_SCHEMA,
    FEED_TABLE_TRIGGER,
    PUBLIC_SCHEMA,
    TABLE_CHANGED_FUNCTION,
)
from server.errors import NoFeed

VERSIONS = sql.Identifier(CATALOG_SCHEMA, "table_versions")
FEEDS = sql.Identifier(CATALOG_SCHEMA, "feeds")
# Relations a statement trigger does not see every change of: a partitioned table's (a
# statement on a partition fires the partition's triggers), a view's (its base tables'),
# a materialized view's (REFRESH) and a foreign table's (its server's).
_KINDS = {"p": "partitioned table", "v": "view", "m": "materialized view", "f": "foreign table"}


def watch(driver: psycopg.Connection[Any], stream: str, tables: tuple[str, ...]) -> list[int]:
    """The oids of ``tables`` (as ``stream``'s view names them), each given the trigger and
    a version row if it has none; NoFeed for one whose changes no trigger sees, or that
    Strata's role may not put a trigger on."""
    oids: list[int] = []
    for name in tables:
        row = driver.execute(
            "SELECT c.oid, c.relkind, (SELECT t.tgenabled FROM pg_trigger t WHERE "
            "t.tgrelid = c.oid AND t.tgname = %s) FROM pg_class c WHERE c.oid = to_regclass(%s)",
            (FEED_TABLE_TRIGGER, _quoted(name)),
        ).fetchone()
        if row is None:
            raise NoFeed(f"{stream!r} joins {name!r}, which no longer exists")
        oid, kind, enabled = row
        if kind != "r":
            raise NoFeed(
                f"{stream!r} joins the {_KINDS.get(kind, 'relation')} {name!r} on read, whose "
                "changes no trigger sees: the change feed follows streams joining tables; "
                "join a table (CREATE TABLE ... AS, kept up to date) to follow it"
            )
        if enabled is None:
            _add_trigger(driver, stream, name)
        elif enabled == "O":  # made by an earlier release: not fired in replica sessions
            _fire_always(driver, name)
        oids.append(int(oid))
    driver.execute(
        sql.SQL("INSERT INTO {} (relation) SELECT unnest(%s::oid[]) ON CONFLICT DO NOTHING").format(
            VERSIONS
        ),
        (oids,),
    )
    return oids


def _add_trigger(driver: psycopg.Connection[Any], stream: str, name: str) -> None:
    statement = sql.SQL(
        "CREATE OR REPLACE TRIGGER {} AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON {} "
        "FOR EACH STATEMENT EXECUTE FUNCTION {}()"
    ).format(
        sql.Identifier(FEED_TABLE_TRIGGER),
        sql.SQL(".").join(sql.Identifier(part) for part in _qualified(driver, name)),
        sql.Identifier(PUBLIC_SCHEMA, TABLE_CHANGED_FUNCTION),
    )
    try:
        with driver.transaction():  # a savepoint: a refusal leaves the caller's transaction
            driver.execute(statement)
    except pg_errors.InsufficientPrivilege:
        role = driver.execute("SELECT current_user").fetchone()
        raise NoFeed(
            f"{stream!r} joins the table {name!r}, whose changes the change feed watches "
            f"with a trigger, and the role {role[0] if role else '?'} Strata runs as may not "
            f"create one: its owner can GRANT TRIGGER ON {name} TO that role"
        ) from None
    _fire_always(driver, name)


def _fire_always(driver: psycopg.Connection[Any], name: str) -> None:
    """Fire the trigger ALWAYS, in sessions with session_replication_role = replica too (a
    logical replication subscription's apply, for one), where Strata's role owns the table
    (ALTER TABLE's privilege; GRANT TRIGGER is not enough): otherwise it fires as created,
    for every other session."""
    statement = sql.SQL("ALTER TABLE {} ENABLE ALWAYS TRIGGER {}").format(
        sql.SQL(".").join(sql.Identifier(part) for part in _qualified(driver, name)),
        sql.Identifier(FEED_TABLE_TRIGGER),
    )
    try:
        with driver.transaction():
            driver.execute(statement)
    except pg_errors.InsufficientPrivilege:
        pass


def _qualified(driver: psycopg.Connection[Any], name: str) -> tuple[str, str]:
    row = driver.execute(
        "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n "
        "ON n.oid = c.relnamespace WHERE c.oid = to_regclass(%s)",
        (_quoted(name),),
    ).fetchone()
    assert row is not None, f"{name} was found a moment ago"
    return str(row[0]), str(row[1])


def _quoted(name: str) -> str:
    """``name`` as plan.tables holds it (``table`` or ``schema.table``, folded as PostgreSQL
    folds) quoted for to_regclass, which would fold it again."""
    return ".".join('"' + part.replace('"', '""') + '"' for part in name.split(".", 1))


def version(driver: psycopg.Connection[Any], oids: list[int]) -> int:
    """The sum of the versions of the tables ``oids`` (every one has its row)."""
    row = driver.execute(
        sql.SQL("SELECT coalesce(sum(version), 0)::bigint FROM {} WHERE relation = ANY(%s)").format(
            VERSIONS
        ),
        (oids,),
    ).fetchone()
    assert row is not None
    return int(row[0])


def moved(driver: psycopg.Connection[Any], stream: str) -> bool:
    """Whether a table ``stream``'s feed watches changed since its rows were announced
    (no lock taken: a poll's cheap look before it locks and compares)."""
    row = driver.execute(
        sql.SQL(
            "SELECT f.tables_version IS DISTINCT FROM (SELECT coalesce(sum(v.version), 0) "
            "FROM {} v WHERE v.relation = ANY(f.tables)) FROM {} f "
            "WHERE f.stream = %s AND f.tables IS NOT NULL"
        ).format(VERSIONS, FEEDS),
        (stream,),
    ).fetchone()
    return bool(row and row[0])


def remember(
    driver: psycopg.Connection[Any], stream: str, oids: list[int] | None, seen: int | None
) -> None:
    """Record the tables ``stream``'s feed watches and the count its announced rows hold."""
    driver.execute(
        sql.SQL("UPDATE {} SET tables = %s, tables_version = %s WHERE stream = %s").format(FEEDS),
        (oids, seen, stream),
    )
