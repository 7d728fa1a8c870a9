"""What the exactness tests share: rows as NDJSON at times after START, and the check that a
view equals its batch query read in the same snapshot."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from itertools import cycle
from typing import TypeVar

import psycopg

from tests.conftest import Strata

START = datetime(2024, 5, 1, tzinfo=UTC)
T = TypeVar("T")


def at(seconds: float) -> str:
    """The moment ``seconds`` after START, as the runs carry it."""
    return (START + timedelta(seconds=seconds)).isoformat()


def ndjson(rows: Sequence[dict[str, object]]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def canonical(rows: list[tuple]) -> list[tuple]:
    """Rows as a sorted multiset (None sorts first)."""
    return sorted(rows, key=lambda r: tuple((v is not None, str(v)) for v in r))


def same(strata: Strata, view: str, oracle: str) -> int:
    """The view equals its oracle, both read in one snapshot; the number of rows."""
    with psycopg.connect(strata.database_url) as connection:
        connection.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        got = canonical(connection.execute(view).fetchall())  # type: ignore[arg-type]
        want = canonical(connection.execute(oracle).fetchall())  # type: ignore[arg-type]
    assert got == want, f"{view}: {len(got)} rows, the batch query {len(want)}"
    return len(got)


def execute(strata: Strata, statement: str, *params: object) -> None:
    """One statement of the user's own (a table made, changed), committed."""
    with psycopg.connect(strata.database_url, autocommit=True) as connection:
        connection.execute(statement, params or None)  # type: ignore[arg-type]


def cut(rows: Sequence[T], sizes: Sequence[int]) -> Iterator[list[T]]:
    """``rows`` in runs of the ``sizes`` in turn, until none are left."""
    position = 0
    for size in cycle(sizes):
        chunk = list(rows[position : position + size])
        if not chunk:
            return
        position += size
        yield chunk
