"""CREATE SINK and DROP SINK, as the HTTP API (POST /streams) and the SQL port run them: the
statement checked against the catalog and recorded, under the lock every stream DDL takes
(so a stream is never dropped under a sink being created)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import sqlalchemy as sa

from rewriter.errors import UnknownSource, UnsupportedSQL
from server import catalog
from server.errors import NoFeed, SinkExists, StreamInUse, UnknownSink
from server.feed.record import refusal
from server.sinks.source import key_problem
from server.sinks.statement import CreateSink, DropSink, parse_sink
from server.sinks.store import Sink, delete_sink, insert_sink, load_sinks

if TYPE_CHECKING:
    from server.service import StrataService


# The connectors whose target keeps one row per key (what it keys): a view whose rows the key
# cannot tell apart is refused for them (a table would merge its rows, a compacted topic too).
KEYED_BY = {"postgres": "table", "kafka": "messages"}


@dataclass(frozen=True)
class Outcome:
    """What a sink statement did: its command tag, the sink it created (or found, with IF
    NOT EXISTS) and whether it changed anything."""

    tag: str
    name: str
    sink: Sink | None
    changed: bool


def run_sink_statement(service: StrataService, text: str) -> Outcome:
    """Run CREATE SINK or DROP SINK ``text``."""
    statement = parse_sink(text)
    if service.cluster is not None:
        raise UnsupportedSQL(
            "sinks are not available in a cluster of nodes yet: every node would deliver "
            "every change; declare the sink on a single Strata"
        )
    if isinstance(statement, DropSink):
        return Outcome("DROP SINK", statement.name, None, drop_sink(service.engine, statement))
    created = create_sink(service, statement, text)
    sink = next(s for s in sinks(service.engine) if s.name == statement.name)
    return Outcome("CREATE SINK", statement.name, sink, created)


def create_sink(service: StrataService, statement: CreateSink, text: str) -> bool:
    """Record the sink (the sink worker starts it: a snapshot, then every change); False
    for IF NOT EXISTS of a sink that exists."""
    with service.engine.begin() as connection:
        catalog.lock_ddl(connection)
        record = service.plans.load(connection).get(statement.stream)
        if record is None:
            raise UnknownSource(f"CREATE SINK: stream {statement.stream!r} does not exist")
        refused = refusal(record.plan)
        if refused is not None:
            raise NoFeed(f"a sink delivers a stream's change feed, and {refused}")
        keyed = KEYED_BY.get(statement.connector)
        if keyed is not None:
            problem = key_problem(record.plan)
            if problem is not None:
                raise NoFeed(
                    f"the {statement.connector} connector keys its {keyed} on the view's "
                    f"window and group columns, and {problem}"
                )
        if not insert_sink(connection, statement, text):
            if statement.if_not_exists:
                return False
            raise SinkExists(f"sink {statement.name!r} already exists")
    return True


def drop_sink(engine: sa.Engine, statement: DropSink) -> bool:
    """Forget the sink (False: there was none, IF EXISTS); its target keeps what it was
    given (a PostgreSQL sink's table and its row of strata_sink_positions too)."""
    with engine.begin() as connection:
        catalog.lock_ddl(connection)
        dropped = delete_sink(connection, statement.name)
    if not dropped and not statement.if_exists:
        raise UnknownSink(f"sink {statement.name!r} does not exist")
    return dropped


def guard_drop(connection: sa.Connection, stream: str) -> None:
    """Refuse to drop ``stream`` while sinks deliver it (StreamInUse naming them)."""
    found = [s.name for s in load_sinks(connection, stream)]
    if found:
        raise StreamInUse(
            f"stream {stream!r} is delivered by the sink(s) {', '.join(found)}; drop those "
            "first (DROP SINK name)"
        )


def sinks(engine: sa.Engine, stream: str | None = None) -> list[Sink]:
    with engine.connect() as connection:
        return load_sinks(connection, stream)
