"""The console's SQL box: one read-only statement, run as the role dashboards use.

The statement runs on a connection logged in as ``strata_reader`` (STRATA_READER_PASSWORD),
never as Strata's own role: the role's grants (SELECT on the views and on
public.strata_window_status) are all it can reach, whatever the text says. On top of that
the transaction is READ ONLY and rolled back, the statement is sent alone through the
extended protocol (so ``SELECT 1; DROP ...`` is refused by PostgreSQL itself), a statement
timeout bounds it, and at most ``MAX_ROWS`` rows come back.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import sql

from server.security import READER_ROLE

MAX_ROWS = 1000
TIMEOUT_MS = 10_000


@dataclass(frozen=True)
class QueryResult:
    """A statement's columns and rows (as text), and whether rows were left out."""

    columns: tuple[str, ...]
    rows: tuple[tuple[str | None, ...], ...]
    truncated: bool


class QueryRefused(Exception):  # noqa: N818 - what the user reads
    """The statement did not run, or failed: the message says why."""


def run_read_only(database_url: str, password: str | None, text: str) -> QueryResult:
    """Run ``text`` as the reader role; QueryRefused with PostgreSQL's message if it fails."""
    if password is None:
        raise QueryRefused(
            f"the SQL box runs as the read-only role {READER_ROLE}: set STRATA_READER_PASSWORD "
            "(or STRATA_READER_PASSWORD_FILE) and restart Strata to use it"
        )
    if not text.strip():
        raise QueryRefused("write a query, e.g. SELECT * FROM strata_window_status LIMIT 10")
    try:
        with psycopg.connect(
            database_url, user=READER_ROLE, password=password, connect_timeout=10
        ) as conn:
            conn.read_only = True
            with conn.cursor() as cursor:
                cursor.execute(
                    sql.SQL("SET LOCAL statement_timeout = {}").format(sql.Literal(TIMEOUT_MS))
                )
                # prepare=True: the extended protocol, one statement only, no % parsing.
                cursor.execute(text.encode(), prepare=True)
                if cursor.description is None:
                    return QueryResult((), (), False)
                columns = tuple(d.name for d in cursor.description)
                fetched = cursor.fetchmany(MAX_ROWS + 1)
            conn.rollback()
    except psycopg.Error as err:
        message = err.diag.message_primary or str(err).strip()
        raise QueryRefused(message) from None
    rows = tuple(tuple(None if v is None else str(v) for v in row) for row in fetched[:MAX_ROWS])
    return QueryResult(columns, rows, len(fetched) > MAX_ROWS)
