"""Reading a stream's change feed: where a subscriber starts (a position, or a snapshot of
the announced rows at one) and the changes after it, in position order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
import sqlalchemy as sa
from psycopg import sql

from server.catalog import PlanCache
from server.errors import NoFeed, PositionGone, UnknownStream
from server.feed import tables
from server.feed.record import (
    CHANGES,
    FEEDS,
    ROWS,
    follow,
    follow_definitions,
    follow_tables,
    redefined,
    refusal,
)

# A change as a subscriber receives it: the columns of feed_changes as one JSON object,
# then as the texts of the SQL port's rows (server/pgwire/subscribe.py: COLUMNS).
_CHANGE = sql.SQL(
    "jsonb_build_object('position', position, 'op', op, 'key', key, 'old', old, "
    "'new', new, 'late', late, 'lateness_seconds', lateness_seconds, 'revision', revision, "
    "'cause', cause, 'runs', runs, 'committed_at', committed_at)::text, "
    "op, key::text, old::text, new::text, CASE WHEN late THEN 't' ELSE 'f' END, "
    "lateness_seconds::text, revision::text, cause"
)


@dataclass(frozen=True)
class Change:
    """One event for a subscriber: a change (``kind`` None) at ``position``, or a
    ``progress`` event (everything up to ``position`` delivered); ``data`` is JSON, and
    ``fields`` the change's columns as text (op, key, old, new, late, lateness_seconds,
    revision, cause; empty for progress)."""

    position: int
    data: str
    kind: str | None = None
    fields: tuple[str | None, ...] = ()


def _driver(connection: sa.Connection) -> psycopg.Connection[Any]:
    driver = connection.connection.driver_connection
    assert isinstance(driver, psycopg.Connection)
    return driver


class Feed:
    """A subscriber's cursor over one stream's feed: ``position`` is the last delivered."""

    def __init__(self, engine: sa.Engine, plans: PlanCache, name: str, position: int) -> None:
        self.engine = engine
        self.plans = plans
        self.name = name
        self.position = position

    def poll(self, limit: int = 1000) -> list[Change]:
        """The next changes after ``position`` (at most ``limit``), which it advances."""
        with self.engine.connect() as connection:
            if redefined(connection, self.name):  # an ALTER swapped in at once
                connection.rollback()
                with connection.begin():
                    follow_definitions(connection, self.plans)
            if tables.moved(_driver(connection), self.name):  # a table it joins changed
                connection.rollback()
                with connection.begin():
                    follow_tables(connection, self.plans, [self.name])
            rows = (
                _driver(connection)
                .execute(
                    sql.SQL(
                        "SELECT position, {} FROM {} WHERE stream = %s AND position > %s "
                        "ORDER BY position LIMIT %s"
                    ).format(_CHANGE, CHANGES),
                    (self.name, self.position, limit),
                )
                .fetchall()
            )
            if rows and rows[0][0] != self.position + 1:  # retention passed us by
                oldest, latest = _bounds(connection, self.name)
                raise PositionGone(
                    f"changes of {self.name!r} after position {self.position} are no longer "
                    f"kept; resume from {oldest} or later, or re-sync with snapshot=true",
                    oldest=oldest,
                    latest=latest,
                )
        changes = [Change(row[0], row[1], None, tuple(row[2:])) for row in rows]
        if changes:
            self.position = changes[-1].position
        return changes

    def progress(self) -> Change:
        """A progress event: everything up to ``position`` is delivered."""
        return Change(self.position, f'{{"position": {self.position}}}', "progress")

    def latest(self) -> int:
        with self.engine.connect() as connection:
            return _bounds(connection, self.name)[1]


def _bounds(connection: sa.Connection, name: str) -> tuple[int, int]:
    """The oldest position a subscriber may resume from, and the latest given."""
    row = (
        _driver(connection)
        .execute(
            sql.SQL("SELECT pruned_through, position FROM {} WHERE stream = %s").format(FEEDS),
            (name,),
        )
        .fetchone()
    )
    assert row is not None, "a followed stream has its feeds row"
    return int(row[0]), int(row[1])


def open_feed(
    engine: sa.Engine, plans: PlanCache, name: str, *, since: int | None, snapshot: bool
) -> tuple[Feed, list[Change]]:
    """A cursor over ``name``'s feed (following it from now if nobody did) from ``since``,
    or from now; with ``snapshot`` (and no ``since``) the current rows first, as inserts at
    the position they are current at. Raises PositionGone for a position not kept."""
    with engine.connect() as connection:
        record = plans.load(connection).get(name)
    if record is None:
        raise UnknownStream(f"stream {name!r} does not exist")
    refused = refusal(record.plan)
    if refused is not None:
        raise NoFeed(refused)
    follow(engine, plans, name)
    with engine.connect() as connection:
        connection = connection.execution_options(
            isolation_level="REPEATABLE READ", postgresql_readonly=True
        )
        with connection.begin():
            oldest, latest = _bounds(connection, name)
            if since is not None:
                if not oldest <= since <= latest:
                    raise PositionGone(
                        f"position {since} of {name!r} is not kept: positions from {oldest} "
                        f"to {latest} are; re-sync with snapshot=true",
                        oldest=oldest,
                        latest=latest,
                    )
                return Feed(engine, plans, name, since), []
            if not snapshot:
                return Feed(engine, plans, name, latest), []
            rows = (
                _driver(connection)
                .execute(
                    sql.SQL(
                        "SELECT jsonb_build_object('position', %s::bigint, 'op', 'insert', "
                        "'key', key, 'old', NULL, 'new', row, 'late', false, "
                        "'lateness_seconds', NULL, 'revision', revision, "
                        "'cause', 'snapshot')::text, 'insert', key::text, NULL, row::text, "
                        "'f', NULL, revision::text, 'snapshot' "
                        "FROM {} WHERE stream = %s AND row IS NOT NULL ORDER BY win, identity"
                    ).format(ROWS),
                    (latest, name),
                )
                .fetchall()
            )
    first = [Change(latest, r[0], None, tuple(r[1:])) for r in rows]
    return Feed(engine, plans, name, latest), first
