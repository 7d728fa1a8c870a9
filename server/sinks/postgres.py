"""The PostgreSQL sink: a stream's rows kept in a table of another PostgreSQL.

Exactly once: the position a batch brings the table to is stored in the target database,
in the table ``strata_sink_positions`` beside it, **in the same transaction** as the
batch's rows; each delivery starts by reading it there (locked), so a batch is in the table
with its position or not at all, whatever dies when (Strata, the target, the connection).
This server's own copy of the position is for display only.

A batch's changes are folded per key (the last one wins), then applied as one DELETE and
one upsert (INSERT ... ON CONFLICT on the key columns); a snapshot (the first delivery, or
a re-sync) replaces the table's rows. The table is created if missing, with the view's
columns and a unique key on its window and group columns (NULLS NOT DISTINCT, since a
group may be NULL; a primary key on PostgreSQL before 15).
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
import sqlalchemy as sa
from psycopg import sql

from server import faults
from server.catalog import PlanCache
from server.feed.record import FollowedPlan, ViewShape
from server.sinks.source import Batch, SinkBroken, feed_of, read_batch, view_columns
from server.sinks.store import Sink

POSITIONS = "strata_sink_positions"


class TargetProblem(Exception):
    """The target table cannot take the stream's rows as it is (columns missing, say)."""


@dataclass(frozen=True)
class _Table:
    """The target table and what delivery needs of it, for one definition of the stream."""

    name: sql.Composable
    positions: sql.Composable
    keys: tuple[str, ...]
    columns: tuple[str, ...]
    version: int


class PostgresTarget:
    """One PostgreSQL sink's connection to its target, and the table it keeps there."""

    def __init__(self, sink: Sink, timeout: float) -> None:
        self.sink = sink
        self.timeout = timeout
        self._connection: psycopg.Connection | None = None
        self._table: _Table | None = None
        schema, _, table = sink.options["table"].rpartition(".")
        self._names = (schema or None, table)

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
        self._connection, self._table = None, None

    def deliver(
        self, engine: sa.Engine, plans: PlanCache, limit: int, after: int | None = None
    ) -> tuple[int, int]:
        """Deliver the next batch (or nothing); (the position delivered up to, changes).
        ``after``, this server's copy of the position, is not used: the target's counts."""
        try:
            return self._deliver(engine, plans, limit)
        except BaseException:
            self.close()  # a transaction cut short: start from a fresh connection
            raise

    def _deliver(self, engine: sa.Engine, plans: PlanCache, limit: int) -> tuple[int, int]:
        connection = self._connect()
        name, stream = self.sink.name, self.sink.stream
        current = feed_of(engine, stream)
        with connection.transaction():
            table = self._prepare(connection, engine, plans)
            connection.execute(
                sql.SQL(
                    "INSERT INTO {} (sink, stream) VALUES (%s, %s) ON CONFLICT (sink) DO NOTHING"
                ).format(table.positions),
                (name, stream),
            )
            row = connection.execute(
                sql.SQL("SELECT position, feed FROM {} WHERE sink = %s FOR UPDATE").format(
                    table.positions
                ),
                (name,),
            ).fetchone()
            assert row is not None
            stored, feed = row
            # A position of another feed (the stream's of another Strata, say) means
            # nothing here: start again from a snapshot.
            after = stored if stored is not None and feed == current else None
            batch = read_batch(engine, plans, stream, after, limit)
            if batch.empty:
                return (after if after is not None else batch.position), 0
            self._apply(connection, table, batch)
            connection.execute(
                sql.SQL(
                    "UPDATE {} SET position = %s, feed = %s, stream = %s, updated_at = now() "
                    "WHERE sink = %s"
                ).format(table.positions),
                (batch.position, batch.feed, stream, name),
            )
            faults.reach("sink_write", [name], changes=len(batch.changes), position=batch.position)
        return batch.position, len(batch.changes)

    def _connect(self) -> psycopg.Connection:
        if self._connection is None or self._connection.closed:
            self._connection = psycopg.connect(
                self.sink.url,
                autocommit=True,  # transactions are explicit: connection.transaction()
                connect_timeout=max(1, round(self.timeout)),
                application_name=f"strata sink {self.sink.name}"[:63],
            )
            self._table = None
        return self._connection

    def _prepare(
        self, connection: psycopg.Connection, engine: sa.Engine, plans: PlanCache
    ) -> _Table:
        """The target table for the stream's current definition: created if missing,
        checked to hold the view's columns once per definition (an ALTER may add some)."""
        with engine.connect() as strata:
            record = plans.load(strata).get(self.sink.stream)
        assert record is not None, "a stream with sinks cannot be dropped"
        if self._table is not None and self._table.version == record.version:
            return self._table
        plan = record.plan
        assert isinstance(plan, FollowedPlan), "the sink's stream is followed by its feed"
        schema, table = self._names
        target = sql.Identifier(schema, table) if schema else sql.Identifier(table)
        positions = sql.Identifier(schema, POSITIONS) if schema else sql.Identifier(POSITIONS)
        keys = ViewShape.of(plan).keys
        columns = view_columns(engine, self.sink.stream)
        unique = (
            sql.SQL("UNIQUE NULLS NOT DISTINCT")
            if connection.info.server_version >= 150000
            else sql.SQL("PRIMARY KEY")
        )
        connection.execute(
            sql.SQL("CREATE TABLE IF NOT EXISTS {} ({}, CONSTRAINT {} {} ({}))").format(
                target,
                sql.SQL(", ").join(
                    sql.SQL("{} {}").format(sql.Identifier(n), sql.SQL(kind)) for n, kind in columns
                ),
                sql.Identifier(f"{table}_key"[:63]),
                unique,
                sql.SQL(", ").join(map(sql.Identifier, keys)),
            )
        )
        connection.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (sink text PRIMARY KEY, stream text NOT NULL, "
                "feed text, position bigint, updated_at timestamptz NOT NULL DEFAULT now())"
            ).format(positions)
        )
        found = {
            row[0]
            for row in connection.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass "
                "AND attnum > 0 AND NOT attisdropped",
                (target.as_string(connection),),
            )
        }
        missing = [n for n, _ in columns if n not in found]
        if missing:
            raise TargetProblem(
                f"the table {self.sink.options['table']} lacks the column(s) "
                f"{', '.join(missing)} of {self.sink.stream!r} (changed by ALTER STREAM?): "
                "add them, or drop the table for the sink to create it anew"
            )
        self._table = _Table(target, positions, keys, tuple(n for n, _ in columns), record.version)
        return self._table

    @staticmethod
    def _apply(connection: psycopg.Connection, table: _Table, batch: Batch) -> None:
        """The batch's changes, folded per key, as one DELETE and one upsert."""
        final: dict[str, str | None] = {}
        for change in batch.changes:
            op, key, _old, new = change.fields[:4]
            assert key is not None
            if batch.snapshot and key in final:
                raise SinkBroken(
                    f"two rows of {batch.stream!r} share the key {key}: the PostgreSQL sink "
                    "keys its table on the view's window and group columns"
                )
            final[key] = None if op == "delete" else new
        if batch.snapshot:
            connection.execute(sql.SQL("DELETE FROM {}").format(table.name))
        gone = [key for key, row in final.items() if row is None]
        rows = [row for row in final.values() if row is not None]
        if gone:
            connection.execute(
                sql.SQL(
                    "DELETE FROM {t} AS t USING jsonb_populate_recordset(NULL::{t}, %s::jsonb) "
                    "AS g WHERE {match}"
                ).format(
                    t=table.name,
                    match=sql.SQL(" AND ").join(
                        sql.SQL("t.{k} IS NOT DISTINCT FROM g.{k}").format(k=sql.Identifier(k))
                        for k in table.keys
                    ),
                ),
                (f"[{','.join(gone)}]",),
            )
        if rows:
            values = [c for c in table.columns if c not in table.keys]
            update = (
                sql.SQL("DO UPDATE SET {}").format(
                    sql.SQL(", ").join(
                        sql.SQL("{c} = excluded.{c}").format(c=sql.Identifier(c)) for c in values
                    )
                )
                if values
                else sql.SQL("DO NOTHING")
            )
            connection.execute(
                sql.SQL(
                    "INSERT INTO {t} SELECT * FROM jsonb_populate_recordset(NULL::{t}, "
                    "%s::jsonb) ON CONFLICT ({keys}) {update}"
                ).format(
                    t=table.name,
                    keys=sql.SQL(", ").join(map(sql.Identifier, table.keys)),
                    update=update,
                ),
                (f"[{','.join(rows)}]",),
            )
