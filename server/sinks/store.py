"""The sinks of the catalog (migration 0018): their definitions, and what this server knows of
their delivery, as GET /streams/{name}, SHOW SINKS and /metrics show it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from server.catalog import metadata
from server.security import redacted_url
from server.sinks.statement import CreateSink

sinks = sa.Table(
    "sinks",
    metadata,
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("stream", sa.Text),
    sa.Column("connector", sa.Text),
    sa.Column("options", postgresql.JSONB),
    sa.Column("sql", sa.Text),
    sa.Column("created_at", sa.DateTime(timezone=True)),
    sa.Column("position", sa.BigInteger),
    sa.Column("state", sa.Text),
    sa.Column("error", sa.Text),
    sa.Column("failures", sa.Integer),
    sa.Column("delivered_at", sa.DateTime(timezone=True)),
    sa.Column("failed_at", sa.DateTime(timezone=True)),
)
feeds = sa.Table(
    "feeds",
    metadata,
    sa.Column("stream", sa.Text, primary_key=True),
    sa.Column("position", sa.BigInteger),
    sa.Column("enabled_at", sa.DateTime(timezone=True)),
    extend_existing=True,
)

# A sink's states: starting (nothing delivered yet), running (its last delivery, or its
# last look for changes, went through), retrying (the last attempt failed; the next one
# comes after a backoff) and broken (the changes it needs next are no longer kept: it
# never skips them; it is retried, slowly, in case its target is reset).
STATES = ("starting", "running", "retrying", "broken")


@dataclass(frozen=True)
class Sink:
    name: str
    stream: str
    connector: str
    options: dict[str, str]
    position: int | None  # the last position delivered, as this server knows it
    state: str
    error: str | None
    failures: int
    delivered_at: datetime | None
    created_at: datetime | None
    latest: int | None = None  # the stream feed's latest position, when followed

    @property
    def url(self) -> str:
        return self.options["url"]

    @property
    def target(self) -> str:
        """Where the sink delivers, without a password."""
        if "topic" in self.options:  # Kafka: brokers, and no password to hide
            return f"kafka {self.options['brokers']} topic {self.options['topic']}"
        shown = redacted_url(self.url)
        return f"{shown} table {self.options['table']}" if "table" in self.options else shown

    @property
    def lag(self) -> int | None:
        """Changes committed and not delivered yet (None before the first delivery)."""
        if self.position is None or self.latest is None:
            return None
        return max(self.latest - self.position, 0)

    def batch_size(self, default: int) -> int:
        given = self.options.get("batch_size")
        return int(given) if given else default

    def describe(self) -> dict[str, object]:
        return {
            "name": self.name,
            "stream": self.stream,
            "connector": self.connector,
            "target": self.target,
            "position": self.position,
            "latest_position": self.latest,
            "lag": self.lag,
            "state": self.state,
            "error": self.error,
            "failures": self.failures,
            "delivered_at": self.delivered_at.isoformat() if self.delivered_at else None,
            "created_at": self.created_at.isoformat() if self.created_at else None,
        }


def insert_sink(connection: sa.Connection, statement: CreateSink, text: str) -> bool:
    """Record a new sink; False if one of that name exists (nothing recorded)."""
    inserted = connection.execute(
        postgresql.insert(sinks)
        .values(
            name=statement.name,
            stream=statement.stream,
            connector=statement.connector,
            options=statement.options,
            sql=text,
            created_at=sa.func.now(),
            state="starting",
            failures=0,
        )
        .on_conflict_do_nothing()
        .returning(sinks.c.name)
    ).first()
    return inserted is not None


def delete_sink(connection: sa.Connection, name: str) -> bool:
    return bool(connection.execute(sa.delete(sinks).where(sinks.c.name == name)).rowcount)


def load_sinks(connection: sa.Connection, stream: str | None = None) -> list[Sink]:
    """The sinks (of ``stream``, or all), by name, with their stream's latest position."""
    query = (
        sa.select(sinks, feeds.c.position.label("latest"))
        .select_from(sinks.outerjoin(feeds, feeds.c.stream == sinks.c.stream))
        .order_by(sinks.c.name)
    )
    if stream is not None:
        query = query.where(sinks.c.stream == stream)
    return [_sink(row._mapping) for row in connection.execute(query)]


def _sink(row: Any) -> Sink:
    options = row["options"]
    return Sink(
        name=row["name"],
        stream=row["stream"],
        connector=row["connector"],
        options=json.loads(options) if isinstance(options, str) else dict(options),
        position=row["position"],
        state=row["state"],
        error=row["error"],
        failures=row["failures"],
        delivered_at=row["delivered_at"],
        created_at=row["created_at"],
        latest=row["latest"],
    )


def record_delivered(connection: sa.Connection, name: str, position: int, moved: bool) -> None:
    """The sink ``name`` has delivered everything up to ``position`` (``moved``: something
    new just now)."""
    values: dict[str, object] = {
        "position": position,
        "state": "running",
        "error": None,
        "failures": 0,
    }
    if moved:
        values["delivered_at"] = sa.func.now()
    connection.execute(sa.update(sinks).where(sinks.c.name == name).values(**values))


def record_failed(
    connection: sa.Connection, name: str, *, state: str, error: str, failures: int
) -> None:
    assert state in STATES
    connection.execute(
        sa.update(sinks)
        .where(sinks.c.name == name)
        .values(state=state, error=error, failures=failures, failed_at=sa.func.now())
    )
