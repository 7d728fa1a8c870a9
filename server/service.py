"""Strata's service: stream DDL (create, drop, describe) and run intake (validate, spool,
record, hand to the ingest pipeline). How a run commits atomically is told in
server/ingest/pipeline.py."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

import psycopg
import pyarrow as pa
import sqlalchemy as sa
from psycopg import sql

from rewriter import (
    ParallelAggregatePlan,
    RawStreamPlan,
    SerialAggregatePlan,
    StreamPlan,
    rewrite,
)
from rewriter.errors import InvalidSQL
from rewriter.naming import (
    PUBLIC_SCHEMA,
    RUN_COLUMN,
)
from rewriter.naming import made_with as naming_made_with
from rewriter.plan import JoinStreamPlan
from rewriter.rewrite import companions
from rewriter.sql_functions import SqlFunction, referenced_functions
from rewriter.tables import TableSchema, referenced_names
from server import alter, catalog
from server.catalog import PlanCache, RunRecord, StreamRecord
from server.comments import comment_statements
from server.errors import (
    InvalidRunId,
    NotARawStream,
    RunConflict,
    StreamExists,
    StreamInUse,
    UnknownStream,
)
from server.ingest.parse import parse_run
from server.ingest.pipeline import IngestPipeline
from server.ingest.progress import stream_progress
from server.ingest.spool import Spool
from server.metrics import Metrics
from server.replication.digest import digest
from server.sharing.runs import SharedRuns
from server.sinks.ddl import guard_drop as guard_sinks
from server.user_functions import read_functions
from server.workers.backfill import backfill_progress, plan_backfill
from server.workers.serial import serial_state

if TYPE_CHECKING:
    from server.replication.node import Node

log = logging.getLogger("strata.service")

# Called inside a DDL statement's transaction with the stream's name, after the statement
# did its work: a cluster logs or records the statement there (server/replication/node.py).
Within = Callable[[sa.Connection, str], None]


def _refuse_planned_sql(err: Exception) -> None:
    """PostgreSQL refusing a stream's own SQL is the statement's problem, not the server's:
    a data exception (22, e.g. '1 minute' compared with a bigint), a type or name error the
    rewriter let through (42) or a limit (54). Raises InvalidSQL for those."""
    cause = getattr(err, "orig", None) or err
    state = str(getattr(cause, "sqlstate", "") or "")
    if state[:2] in ("22", "42", "54") and state != "42501":
        diag = getattr(cause, "diag", None)
        reason = getattr(diag, "message_primary", None) or str(cause)
        raise InvalidSQL(f"PostgreSQL refuses this stream: {reason}") from None


def _with_run_column(table: pa.Table, seq: int) -> pa.Table:
    return table.append_column(RUN_COLUMN, pa.array([seq] * table.num_rows, pa.int64()))


class StrataService:
    def __init__(
        self,
        engine: sa.Engine,
        plans: PlanCache,
        spool: Spool,
        pipeline: IngestPipeline,
        metrics: Metrics,
        shared: SharedRuns | None = None,
    ) -> None:
        self.engine = engine
        self.plans = plans
        self.spool = spool
        self.pipeline = pipeline
        self.metrics = metrics
        # With servers sharing the database: runs recorded with their body in PostgreSQL,
        # owned by this server (server/sharing/runs.py).
        self.shared = shared
        # In a cluster, the node that orders DDL and replicates runs (set by assemble).
        self.cluster: Node | None = None

    # ---- streams ---------------------------------------------------------------------

    def streams(self) -> dict[str, StreamRecord]:
        with self.engine.connect() as connection:
            return self.plans.load(connection)

    def stream(self, name: str) -> StreamRecord:
        record = self.streams().get(name)
        if record is None:
            raise UnknownStream(f"stream {name!r} does not exist")
        return record

    def create_stream(self, text: str) -> StreamRecord:
        if self.cluster is not None:  # ordered by the DDL owner, applied here in that order
            return self.cluster.create_stream(text)
        return self.apply_create(text)

    def apply_create(self, text: str, within: Within | None = None) -> StreamRecord:
        name = ""
        try:
            with self.engine.begin() as connection:
                catalog.lock_ddl(connection)
                name = self._create_with_companions(connection, text).name
                if within is not None:
                    within(connection, name)
        except sa.exc.IntegrityError as err:
            if isinstance(err.orig, psycopg.errors.UniqueViolation):
                raise StreamExists(f"stream {name!r} already exists") from None
            raise
        except (sa.exc.DBAPIError, psycopg.Error) as err:
            _refuse_planned_sql(err)
            raise
        return self.stream(name)

    def alter_stream(self, text: str) -> dict[str, object]:
        """ALTER STREAM name AS SELECT ...: build the new definition beside the stream
        (swapped in at once when no back-fill is needed, else by the swapper once it has
        caught up); returns what server/alter.py says of it."""
        if self.cluster is not None:
            return self.cluster.alter_stream(text)
        return self.apply_alter(text)

    def apply_alter(self, text: str, within: Within | None = None) -> dict[str, object]:
        try:
            with self.engine.begin() as connection:
                catalog.lock_ddl(connection)
                altered = alter.begin(connection, self.plans, self._create_with_companions, text)
                if within is not None:
                    within(connection, str(altered["stream"]))
                return altered
        except (sa.exc.DBAPIError, psycopg.Error) as err:
            _refuse_planned_sql(err)
            raise

    def _create_with_companions(self, connection: sa.Connection, text: str) -> StreamPlan:
        """Create the stream of ``text``, after the stream it is built on when that is made
        with it (the join of an aggregate over a join, a subquery in FROM), recursively,
        all in the caller's transaction."""
        existing = self.plans.load(connection)
        tables = catalog.read_tables(connection, referenced_names(text), existing)
        functions = read_functions(connection, referenced_functions(text))
        made_with = companions(text, {n: r.plan for n, r in existing.items()}, tables, functions)
        if made_with is not None:
            name, statements = made_with
            for taken in (name, *(c for c, _ in statements)):
                if taken in existing:
                    shown = ", ".join(repr(c) for c, _ in statements)
                    raise StreamExists(
                        f"stream {taken!r} already exists ({name!r} keeps what it is built "
                        f"on as the stream{'s' if len(statements) > 1 else ''} {shown})"
                    )
            for _, statement in statements:
                self._create_with_companions(connection, statement)
            existing = self.plans.load(connection)
        return self._create(connection, text, existing, tables, functions)

    def _create(
        self,
        connection: sa.Connection,
        text: str,
        existing: dict[str, StreamRecord],
        tables: dict[str, TableSchema],
        functions: dict[str, SqlFunction],
    ) -> StreamPlan:
        plan = rewrite(text, {n: r.plan for n, r in existing.items()}, tables, functions)
        if plan.name in existing:
            raise StreamExists(f"stream {plan.name!r} already exists")
        alter.guard_create(connection, plan)
        catalog.insert_stream(connection, plan, text, tables, functions)
        self._check_name_free(connection, plan.name)
        for statement in plan.create_statements:
            catalog.execute_plan_sql(connection, statement)
        self._grant_reader(connection, plan.name)
        driver = connection.connection.driver_connection
        assert driver is not None
        for comment in comment_statements(plan, text):
            driver.execute(comment)
        catalog.record_windows(
            connection, {**{n: r.plan for n, r in existing.items()}, plan.name: plan}
        )
        if isinstance(plan, ParallelAggregatePlan):
            self._plan_backfill(connection, existing, plan)
        if isinstance(plan, JoinStreamPlan):
            self._join_history(connection, plan)
        return plan

    @staticmethod
    def _check_name_free(connection: sa.Connection, name: str) -> None:
        taken = connection.execute(
            sa.text("SELECT to_regclass(:q) IS NOT NULL"),
            {"q": sql.Identifier(PUBLIC_SCHEMA, name).as_string()},
        ).scalar()
        if taken:
            raise StreamExists(f"a table or view named {name!r} already exists in PostgreSQL")

    @staticmethod
    def _grant_reader(connection: sa.Connection, name: str) -> None:
        """Let the dashboard role read the stream's view (migration 0010): it reads the
        stream views and nothing else of public unless an owner grants it."""
        connection.execute(
            sa.text("SELECT public.strata_grant_reader(CAST(:view AS regclass))"),
            {"view": sql.Identifier(PUBLIC_SCHEMA, name).as_string()},
        )

    def _plan_backfill(
        self,
        connection: sa.Connection,
        records: dict[str, StreamRecord],
        plan: ParallelAggregatePlan,
    ) -> None:
        """Order the new stream against concurrent runs, then leave the history to the
        back-filler (server/workers/backfill.py).

        SHARE mode waits for run commits in flight into the sources and blocks new ones
        until this transaction commits; every run committed later sees the new stream in
        the catalog (the commit re-reads the dependents under its own lock), and every run
        committed before is listed for back-fill: no run is counted twice or missed.
        """
        catalog.lock_raw_archives(connection, plan.raw_sources)
        plan_backfill(connection, records, plan)

    @staticmethod
    def _join_history(connection: sa.Connection, plan: JoinStreamPlan) -> None:
        """Archive the join over the rows its sources archived so far, in the creating
        transaction: under SHARE locks no run commits meanwhile, and every run committed
        later finds the join in the catalog and adds its own pairs (server/ingest/joins.py).
        The history is joined by PostgreSQL in UTC, as Spark joins every batch."""
        catalog.lock_raw_archives(connection, plan.raw_sources)
        catalog.track_versions(connection, plan.raw_sources)
        catalog.execute_plan_sql(connection, "SET LOCAL TIME ZONE 'UTC'")
        catalog.execute_plan_sql(connection, plan.history_statement)

    def drop_stream(self, name: str) -> None:
        if self.cluster is not None:
            self.cluster.drop_stream(name)
        else:
            self.apply_drop(name)

    def apply_drop(self, name: str, within: Within | None = None) -> None:
        with self.engine.begin() as connection:
            catalog.lock_ddl(connection)
            records = self.plans.load(connection)
            record = records.get(name)
            if record is None:
                raise UnknownStream(f"stream {name!r} does not exist")
            pending = alter.guard_drop(connection, name)
            if pending is not None:  # dropping the stream cancels its ALTER
                alter.cancel(connection, self.plans, pending)
                records = self.plans.load(connection)
            users = sorted(
                r.name
                for r in records.values()
                if not isinstance(r.plan, RawStreamPlan) and name in r.plan.dependencies
            )
            if users:
                raise StreamInUse(
                    f"stream {name!r} is used by {', '.join(users)}; drop those first"
                )
            guard_sinks(connection, name)
            catalog.lock_streams_to_drop(connection, name)
            self._drop(connection, records, name)
            if within is not None:
                within(connection, name)

    def _drop(self, connection: sa.Connection, records: dict[str, StreamRecord], name: str) -> None:
        """Drop ``name``, then the streams made with it (its join ``<name>__rows``, its
        subquery ``<name>__inner``, its subqueries joined ``<name>__in<k>``, the common table
        expressions its window calls read ``<name>__with<k>``) that no other stream reads."""
        for statement in records[name].plan.drop_statements:
            catalog.execute_plan_sql(connection, statement)
        catalog.delete_stream(connection, name)
        catalog.drop_history(connection, name)
        for made_with in naming_made_with(name, records):
            readers = [
                r.name
                for r in records.values()
                if not isinstance(r.plan, RawStreamPlan) and made_with in r.plan.dependencies
            ]
            if readers == [name]:
                self._drop(connection, records, made_with)

    def progress(self, record: StreamRecord) -> dict[str, object]:
        """Watermark and late data of a stream (its raw sources' watermarks, for a derived
        stream: a window is closed once every source has passed it)."""
        plan = record.plan
        sources = (plan.name,) if isinstance(plan, RawStreamPlan) else plan.raw_sources
        with self.engine.connect() as connection:
            plans = {n: r.plan for n, r in self.plans.load(connection).items()}
            facts = catalog.window_facts(plans, plan)
            placed_by = facts["placed_by"] if facts else None
            shown = stream_progress(
                connection,
                plan.name,
                sources[0],
                late_rows_of=str(placed_by) if placed_by else None,
            )
            shown["backfill"] = backfill_progress(connection, plan.name)
            shown["alter"] = alter.progress(connection, plan.name)
            if isinstance(plan, SerialAggregatePlan):
                shown["serial"] = serial_state(connection, plan.name)
            if len(sources) > 1:
                marks = [stream_progress(connection, s, s)["watermark"] for s in sources]
                shown["watermark"] = None if None in marks else min(marks)  # type: ignore[type-var]
        return shown

    def history(self, name: str) -> list[dict[str, object]]:
        """The definitions stream ``name`` had before its current one (ALTER STREAM)."""
        with self.engine.connect() as connection:
            return alter.history(connection, name)

    # ---- runs ------------------------------------------------------------------------

    def run(self, run_id: str) -> RunRecord | None:
        with self.engine.connect() as connection:
            return catalog.get_run(connection, run_id)

    def submit_run(
        self, stream: str, body: bytes, content_type: str, run_id: str | None
    ) -> RunRecord:
        """Validate, spool durably and record a run; returns its (possibly earlier) record."""
        return self.submit_rows(
            stream,
            lambda plan: parse_run(body, content_type, plan.columns, plan.event_time),
            run_id,
        )

    def submit_rows(
        self,
        stream: str,
        read_rows: Callable[[RawStreamPlan], pa.Table],
        run_id: str | None,
        *,
        replica: bool = False,
    ) -> RunRecord:
        """Like ``submit_run``, for a run whose rows ``read_rows`` reads for the stream's plan
        (a COPY's data, an INSERT's VALUES). A run id already known returns the first
        result before anything is read: the same run again changes nothing. In a cluster a
        run a client posted (not a ``replica`` a peer gives) is acknowledged once it is
        durable on STRATA_MIN_COPIES nodes (server/replication/node.py)."""
        cluster = self.cluster
        if cluster is not None and run_id is None:
            raise InvalidRunId(
                "in a cluster a run must carry a run id (?run_id=... over HTTP, RUN_ID in "
                "COPY): a client that retries it on another node must not make it twice"
            )
        run_id = run_id or uuid.uuid4().hex
        known = self.run(run_id)
        if known is not None:
            known = self._same_run(known, stream)
            if cluster is not None and not replica:
                cluster.ensure_copies(known, None)
            return known
        record = self._raw_stream(stream)
        claimed, table = self._claim(record, read_rows, run_id)
        if cluster is not None and not replica:
            cluster.ensure_copies(claimed, table)
        return claimed

    def _raw_stream(self, stream: str) -> StreamRecord:
        """The raw stream runs are posted to; in a cluster, after catching up with the DDL
        owner when this node does not know it yet (read-your-DDL on every node)."""
        try:
            record = self.stream(stream)
        except UnknownStream:
            if self.cluster is None or not self.cluster.catch_up_ddl():
                raise
            record = self.stream(stream)
        if not isinstance(record.plan, RawStreamPlan):
            raise NotARawStream(
                f"stream {stream!r} is derived; post runs to its raw source "
                f"{' or '.join(repr(s) for s in record.plan.raw_sources)}"
            )
        return record

    def _claim(
        self,
        record: StreamRecord,
        read_rows: Callable[[RawStreamPlan], pa.Table],
        run_id: str,
    ) -> tuple[RunRecord, pa.Table | None]:
        """Read, spool durably and record a new run of raw stream ``record``; returns its
        record and rows, or the record of a concurrent request with the same run id that
        won (and no rows)."""
        stream = record.name
        assert isinstance(record.plan, RawStreamPlan)
        origin = None if self.cluster is None else self.cluster.origin_of(stream)
        with self.pipeline.receiving():
            started = time.perf_counter()
            table = read_rows(record.plan)
            parsed = time.perf_counter()
            self.metrics.stage_took("parse", parsed - started)
            with self.engine.begin() as connection:
                seq = catalog.next_run_seq(connection)
            path = self.spool.write(seq, _with_run_column(table, seq))
            with self.engine.begin() as connection:
                claimed = catalog.claim_run(
                    connection,
                    seq,
                    run_id,
                    stream,
                    table.num_rows,
                    str(path),
                    origin,
                    None if self.cluster is None else digest(table),
                    None if self.shared is None else self.shared.owner,
                )
                if claimed is not None and self.shared is not None:
                    self.shared.store(connection, claimed.seq, path)
            self.metrics.stage_took("spool", time.perf_counter() - parsed)
            if claimed is None:  # a concurrent request with the same run id won
                self.spool.remove(path)
                known = self.run(run_id)
                assert known is not None
                return self._same_run(known, stream), None
            self.metrics.run_accepted(claimed.seq)
            self.pipeline.submit(claimed.seq)
            return claimed, table

    @staticmethod
    def _same_run(known: RunRecord, stream: str) -> RunRecord:
        if known.stream != stream:
            raise RunConflict(
                f"run id {known.run_id!r} already names a run of stream {known.stream!r}"
            )
        return known

    def wait(self, record: RunRecord, timeout: float) -> RunRecord:
        """Block until the run is committed or rejected (or the timeout passes, or Strata
        stops: the run, still pending, then commits at the next start)."""
        deadline = time.monotonic() + timeout
        event = self.pipeline.expect(record.seq)
        current: RunRecord | None = record
        while current is not None and current.status == "pending":
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            event.wait(min(remaining, 0.5))
            try:
                current = self.run(record.run_id)
            except sa.exc.OperationalError:  # PostgreSQL restarting: the run is safe, wait on
                log.warning("run %s: PostgreSQL unreachable; still waiting", record.run_id)
                time.sleep(0.5)
            if self.pipeline.stopping:
                break
        return current or record

    # ---- the worker ------------------------------------------------------------------
