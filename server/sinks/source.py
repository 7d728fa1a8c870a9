"""What a sink delivers next: a batch of its stream's changes read from the change feed
(server/feed/) after the position it delivered last, or, before its first delivery, the
stream's rows as a snapshot at the position they are current at."""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from psycopg import sql

from rewriter.naming import PUBLIC_SCHEMA
from rewriter.plan import ParallelAggregatePlan, StreamPlan
from server.catalog import PlanCache
from server.errors import PositionGone
from server.feed import Change, open_feed
from server.feed.record import FEEDS, FollowedPlan, ViewShape, refusal


class SinkBroken(Exception):
    """The changes a sink needs next are no longer kept: it cannot go on without a gap."""


@dataclass(frozen=True)
class Batch:
    """Changes of ``stream`` up to ``position``, after the last one delivered; with
    ``snapshot``, the stream's whole view at ``position`` instead (inserts): the target
    replaces what it holds. ``feed`` tells feeds apart (the time the stream's feed
    started): a position means nothing in another one."""

    stream: str
    changes: list[Change]
    position: int
    snapshot: bool
    feed: str

    @property
    def empty(self) -> bool:
        return not self.changes and not self.snapshot


def feed_of(engine: sa.Engine, stream: str) -> str | None:
    """The identity of ``stream``'s feed (None before it is followed)."""
    with engine.connect() as connection:
        driver = connection.connection.driver_connection
        assert driver is not None
        row = driver.execute(
            sql.SQL("SELECT enabled_at::text FROM {} WHERE stream = %s").format(FEEDS), (stream,)
        ).fetchone()
    return None if row is None else str(row[0])


def read_batch(
    engine: sa.Engine, plans: PlanCache, stream: str, after: int | None, limit: int
) -> Batch:
    """The changes after position ``after`` (at most ``limit``), or with ``after`` None the
    snapshot; SinkBroken when the changes after ``after`` are no longer all kept."""
    try:
        if after is None:
            feed, first = open_feed(engine, plans, stream, since=None, snapshot=True)
            return Batch(stream, first, feed.position, True, feed_of(engine, stream) or "")
        feed, _ = open_feed(engine, plans, stream, since=after, snapshot=False)
        changes = feed.poll(limit)
    except PositionGone as gone:
        raise SinkBroken(
            f"the changes of {stream!r} after position {after} are no longer kept (positions "
            f"{gone.oldest} to {gone.latest} are; see STRATA_FEED_RETENTION): the sink does "
            "not skip them. Drop the sink and create it again to start from a snapshot (a "
            "PostgreSQL sink also re-syncs once its row in strata_sink_positions is deleted)"
        ) from None
    return Batch(stream, changes, feed.position, False, feed_of(engine, stream) or "")


def view_columns(engine: sa.Engine, stream: str) -> list[tuple[str, str]]:
    """The view's columns as PostgreSQL types them: (name, type)."""
    with engine.connect() as connection:
        driver = connection.connection.driver_connection
        assert driver is not None
        rows = driver.execute(
            "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
            "WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped "
            "ORDER BY a.attnum",
            (sql.Identifier(PUBLIC_SCHEMA, stream).as_string(driver),),
        ).fetchall()
    return [(str(name), str(kind)) for name, kind in rows]


def key_problem(plan: StreamPlan) -> str | None:
    """Why the rows of ``plan``'s view cannot be told apart by the columns it shows (a
    table keyed on them would merge rows), or None."""
    refused = refusal(plan)
    if refused is not None:
        return refused
    assert isinstance(plan, FollowedPlan)
    shape = ViewShape.of(plan)
    if not shape.keys:
        return f"{plan.name!r} shows no window or group column to key its rows on"
    if plan.window_size_us and shape.window is None:
        return f"{plan.name!r} does not show its window (window_start or window_end)"
    if isinstance(plan, ParallelAggregatePlan):
        grouped = {name for name, _ in plan.partial_columns if name.startswith("key_")}
        shown = {o.ref for o in plan.outputs if o.role in ("key", "group")}
        if plan.tables:  # its partials are kept per join column; its keys are read_keys
            grouped = set(plan.read_keys)
        if grouped - shown:
            return f"{plan.name!r} does not show every GROUP BY column in its SELECT list"
    return None
