"""Strata's core service: stream DDL, run intake, and the worker that commits runs.

Atomicity (invariant 2) is one PostgreSQL transaction per batch of runs, issued from the
Spark driver: Spark computes the partial rows of every dependent stream, the driver
collects them (Arrow), and a single transaction COPYs the raw rows, COPYs the partial
rows and flips the runs' catalog status from 'pending' to 'committed'. The status flip is
the commit marker: a run is visible everywhere or nowhere, and a second processing of the
same run finds it no longer pending and writes nothing (exactly once). Partial results are
small (one row per run, window and group), so collecting them on the driver is cheap, and
no JDBC driver (which would have to be downloaded) is needed.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pyarrow as pa
import sqlalchemy as sa
from psycopg import sql
from pyspark.errors import PySparkException

from rewriter import ParallelAggregatePlan, RawStreamPlan, SerialAggregatePlan, rewrite
from rewriter.errors import InvalidSQL, StrataError, StreamExists, StreamInUse, UnknownStream
from rewriter.naming import PUBLIC_SCHEMA, RUN_COLUMN, partial_archive_table, raw_archive_table
from server import catalog, faults
from server.archive import copy_in, internal_table
from server.backend import SparkBackend
from server.backfill import Backfiller, backfill_progress, plan_backfill
from server.catalog import PlanCache, RunRecord, StreamRecord
from server.ingest.parse import parse_run
from server.metrics import Metrics
from server.progress import record_progress, stream_progress
from server.serial import record_corrections, serial_state
from server.spool import Spool

log = logging.getLogger("strata.service")


class NotARawStream(StrataError):
    """Runs are posted to raw streams only."""


class RunConflict(StrataError):
    """A run id already names a run of another stream."""


class _Retry(Exception):  # noqa: N818 - control flow, never escapes this module
    """Roll the commit transaction back; ``runs`` are the ones still to commit."""

    def __init__(self, runs: list[RunRecord]) -> None:
        self.runs = runs


@dataclass(frozen=True)
class _Batch:
    """Runs of one raw stream with their rows and the partial rows Spark computed."""

    stream: str
    runs: list[RunRecord]
    data: pa.Table
    dependents: list[catalog.ComputedPlan]
    partials: dict[str, pa.Table]
    spark_seconds: float

    @property
    def seqs(self) -> list[int]:
        return [r.seq for r in self.runs]


def _execute_plan_sql(connection: sa.Connection, statement: str) -> None:
    # Straight to psycopg without parameters: a plan's SQL may hold a literal '%' (modulo),
    # which parameter interpolation would take for a placeholder.
    connection.connection.driver_connection.execute(statement)  # type: ignore[union-attr]


def _refusal(error: BaseException) -> str | None:
    """What PostgreSQL said, if ``error`` is its refusal of the data written (SQLSTATE
    class 22, data exception, or 54, program limit exceeded), which the same rows meet
    again on every retry; None for anything else."""
    cause = getattr(error, "orig", None) or error
    state = str(getattr(cause, "sqlstate", "") or "")
    if state[:2] not in ("22", "54"):
        return None
    diag = getattr(cause, "diag", None)
    message = (getattr(diag, "message_primary", None) or str(cause)).strip()
    if "index row" in message:
        message += " (a group key value is too long to be indexed: keep keys under ~2,000 bytes)"
    return message


def _lock_ddl(connection: sa.Connection) -> None:
    """One stream DDL at a time (until the transaction ends), so that a CREATE checks its
    name and sources, and a DROP its dependents, against a catalog no other DDL changes
    meanwhile: two DROPs of one name cannot both succeed, nor a DROP of a source slip
    between the planning and the commit of a stream derived from it."""
    connection.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _DDL_LOCK})


_DDL_LOCK = 4242002  # beside catalog.migrate's 4242001


def _with_run_column(table: pa.Table, seq: int) -> pa.Table:
    return table.append_column(RUN_COLUMN, pa.array([seq] * table.num_rows, pa.int64()))


class StrataService:
    def __init__(self, engine: sa.Engine, backend: SparkBackend, spool: Spool) -> None:
        self.engine = engine
        self.backend = backend
        self.spool = spool
        self.plans = PlanCache()
        self._queue: queue.Queue[int | None] = queue.Queue()
        self._done: dict[int, threading.Event] = {}
        self._done_lock = threading.Lock()
        self._workers: list[threading.Thread] = []
        self._computed: queue.Queue[_Batch | None] = queue.Queue(maxsize=1)
        self._stopping = threading.Event()
        self.batch_max_rows = 1_000_000
        self.backfiller = Backfiller(
            engine, self.plans, backend, scratch=spool.directory.parent / "backfill"
        )
        self.metrics = Metrics(engine, self.plans)
        self.backfiller.metrics = self.metrics

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
        try:
            with self.engine.begin() as connection:
                _lock_ddl(connection)
                existing = self.plans.load(connection)
                plan = rewrite(text, {n: r.plan for n, r in existing.items()})
                if plan.name in existing:
                    raise StreamExists(f"stream {plan.name!r} already exists")
                catalog.insert_stream(connection, plan, text)
                self._check_name_free(connection, plan.name)
                for statement in plan.create_statements:
                    _execute_plan_sql(connection, statement)
                if isinstance(plan, ParallelAggregatePlan):
                    self._plan_backfill(connection, plan)
        except sa.exc.IntegrityError as err:
            if isinstance(err.orig, psycopg.errors.UniqueViolation):
                raise StreamExists(f"stream {plan.name!r} already exists") from None
            raise
        except (sa.exc.DBAPIError, psycopg.Error) as err:
            # PostgreSQL refusing the statement's own SQL is the statement's problem, not
            # the server's: a data exception (22, e.g. '1 minute' compared with a bigint),
            # a type or name error the rewriter let through (42) or a limit (54).
            cause = getattr(err, "orig", None) or err
            state = str(getattr(cause, "sqlstate", "") or "")
            if state[:2] in ("22", "42", "54") and state != "42501":
                diag = getattr(cause, "diag", None)
                reason = getattr(diag, "message_primary", None) or str(cause)
                raise InvalidSQL(f"PostgreSQL refuses this stream: {reason}") from None
            raise
        return self.stream(plan.name)

    @staticmethod
    def _check_name_free(connection: sa.Connection, name: str) -> None:
        taken = connection.execute(
            sa.text("SELECT to_regclass(:q) IS NOT NULL"),
            {"q": sql.Identifier(PUBLIC_SCHEMA, name).as_string()},
        ).scalar()
        if taken:
            raise StreamExists(f"a table or view named {name!r} already exists in PostgreSQL")

    def _plan_backfill(self, connection: sa.Connection, plan: ParallelAggregatePlan) -> None:
        """Order the new stream against concurrent runs, then leave the history to the
        back-filler (server/backfill.py).

        SHARE mode waits for run commits in flight into the sources and blocks new ones
        until this transaction commits; every run committed later sees the new stream in
        the catalog (the commit re-reads the dependents under its own lock), and every run
        committed before is listed for back-fill: no run is counted twice or missed.
        """
        cursor = connection.connection.driver_connection.cursor()  # type: ignore[union-attr]
        for name in plan.raw_sources:
            table = internal_table(raw_archive_table(name))
            cursor.execute(sql.SQL("LOCK TABLE {} IN SHARE MODE").format(table))
        plan_backfill(connection, plan)

    def drop_stream(self, name: str) -> None:
        with self.engine.begin() as connection:
            _lock_ddl(connection)
            records = self.plans.load(connection)
            record = records.get(name)
            if record is None:
                raise UnknownStream(f"stream {name!r} does not exist")
            users = sorted(
                r.name
                for r in records.values()
                if not isinstance(r.plan, RawStreamPlan) and name in r.plan.dependencies
            )
            if users:
                raise StreamInUse(
                    f"stream {name!r} is used by {', '.join(users)}; drop those first"
                )
            for statement in record.plan.drop_statements:
                _execute_plan_sql(connection, statement)
            catalog.delete_stream(connection, name)

    def progress(self, record: StreamRecord) -> dict[str, object]:
        """Watermark and late data of a stream (its raw sources' watermarks, for a derived
        stream: a window is closed once every source has passed it)."""
        plan = record.plan
        sources = (plan.name,) if isinstance(plan, RawStreamPlan) else plan.raw_sources
        with self.engine.connect() as connection:
            shown = stream_progress(connection, plan.name, sources[0])
            shown["backfill"] = backfill_progress(connection, plan.name)
            if isinstance(plan, SerialAggregatePlan):
                shown["serial"] = serial_state(connection, plan.name)
            if len(sources) > 1:
                marks = [stream_progress(connection, s, s)["watermark"] for s in sources]
                shown["watermark"] = None if None in marks else min(marks)  # type: ignore[type-var]
        return shown

    # ---- runs ------------------------------------------------------------------------

    def run(self, run_id: str) -> RunRecord | None:
        with self.engine.connect() as connection:
            return catalog.get_run(connection, run_id)

    def submit_run(
        self, stream: str, body: bytes, content_type: str, run_id: str | None
    ) -> RunRecord:
        """Validate, spool durably and record a run; returns its (possibly earlier) record."""
        run_id = run_id or uuid.uuid4().hex
        known = self.run(run_id)
        if known is not None:
            return self._same_run(known, stream)
        record = self.stream(stream)
        if not isinstance(record.plan, RawStreamPlan):
            raise NotARawStream(
                f"stream {stream!r} is derived; post runs to its raw source "
                f"{' or '.join(repr(s) for s in record.plan.raw_sources)}"
            )
        started = time.perf_counter()
        table = parse_run(body, content_type, record.plan.columns, record.plan.event_time)
        parsed = time.perf_counter()
        self.metrics.stage_took("parse", parsed - started)
        with self.engine.begin() as connection:
            seq = catalog.next_run_seq(connection)
        path = self.spool.write(seq, _with_run_column(table, seq))
        with self.engine.begin() as connection:
            claimed = catalog.claim_run(connection, seq, run_id, stream, table.num_rows, str(path))
        self.metrics.stage_took("spool", time.perf_counter() - parsed)
        if claimed is None:  # a concurrent request with the same run id won
            self.spool.remove(path)
            known = self.run(run_id)
            assert known is not None
            return self._same_run(known, stream)
        self.metrics.run_accepted(claimed.seq)
        self._expect(claimed.seq)
        self._queue.put(claimed.seq)
        return claimed

    @staticmethod
    def _same_run(known: RunRecord, stream: str) -> RunRecord:
        if known.stream != stream:
            raise RunConflict(
                f"run id {known.run_id!r} already names a run of stream {known.stream!r}"
            )
        return known

    def _expect(self, seq: int) -> threading.Event:
        with self._done_lock:
            return self._done.setdefault(seq, threading.Event())

    def wait(self, record: RunRecord, timeout: float) -> RunRecord:
        """Block until the run is committed or rejected (or the timeout passes)."""
        deadline = time.monotonic() + timeout
        event = self._expect(record.seq)
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
        return current or record

    # ---- the worker ------------------------------------------------------------------

    def start(self) -> None:
        with self.engine.connect() as connection:
            pending = catalog.pending_runs(connection)
        removed = self.spool.sweep({r.spool_path for r in pending if r.spool_path})
        if removed:
            log.info("removed %d spool files of runs never acknowledged", removed)
        for record in pending:
            self._expect(record.seq)
            self._queue.put(record.seq)
        if pending:
            log.info("resuming %d pending runs", len(pending))
        self._workers = [
            threading.Thread(target=self._compute_loop, name="strata-compute", daemon=True),
            threading.Thread(target=self._commit_loop, name="strata-commit", daemon=True),
        ]
        for worker in self._workers:
            worker.start()
        self.backfiller.start()

    def stop(self) -> None:
        self.backfiller.stop()
        self._stopping.set()
        self._queue.put(None)
        for worker in self._workers:
            worker.join(timeout=60)

    # The worker is a two-stage pipeline: the compute stage runs Spark over batch N+1
    # while the commit stage writes batch N to PostgreSQL. A bounded hand-off keeps at
    # most one computed batch waiting. Exactly-once never depends on the pipeline: the
    # commit marker is the pending->committed flip inside the commit transaction.

    def _compute_loop(self) -> None:
        while not self._stopping.is_set():
            first = self._queue.get()
            if first is None:
                break
            seqs = [first]
            while True:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._stopping.set()
                    break
                seqs.append(more)
            try:
                self._compute(seqs)
            except Exception:  # keep the loop alive; the runs stay pending and are retried
                log.exception("processing runs %s failed; retrying", seqs)
                self._retry_later(seqs)
        self._computed.put(None)

    def _retry_later(self, seqs: list[int]) -> None:
        self.metrics.worker_failed("ingest")
        time.sleep(1.0)
        for seq in seqs:
            self._queue.put(seq)

    def _compute(self, seqs: list[int]) -> None:
        # A run queued twice (accepted while start() queued the pending runs, or retried
        # while still queued) is computed once: twice in one batch would archive it twice.
        seqs = list(dict.fromkeys(seqs))
        with self.engine.connect() as connection:
            records = [catalog.get_run_by_seq(connection, s) for s in seqs]
        pending = [r for r in records if r is not None and r.status == "pending"]
        for seq in set(seqs) - {r.seq for r in pending}:
            self._finish(seq)  # committed, rejected or dropped meanwhile
        by_stream: dict[str, list[RunRecord]] = {}
        for record in pending:
            by_stream.setdefault(record.stream, []).append(record)
        for stream, runs in by_stream.items():
            # Batch runs up to batch_max_rows: one Spark job per batch amortizes the job
            # overhead; the run column among the grouping keys keeps runs independent.
            batch: list[RunRecord] = []
            rows = 0
            for run in runs:
                if batch and rows + run.rows > self.batch_max_rows:
                    self._compute_batch(stream, batch)
                    batch, rows = [], 0
                batch.append(run)
                rows += run.rows
            if batch:
                self._compute_batch(stream, batch)

    def _compute_batch(self, stream: str, runs: list[RunRecord]) -> None:
        lost = [r for r in runs if not (r.spool_path and Path(r.spool_path).exists())]
        for run in lost:
            self._reject(run, "the run's spool file is missing; post the run again")
        runs = [r for r in runs if r not in lost]
        if not runs:
            return
        faults.reach("after_spool", [r.run_id for r in runs])
        try:
            batch = self._prepare(stream, runs)
        except PySparkException as err:
            if len(runs) == 1:
                self._reject(runs[0], f"Spark could not process the run: {err}")
                return
            for run in runs:  # find the run Spark fails on; the others commit
                self._compute_batch(stream, [run])
            return
        self._computed.put(batch)

    def _prepare(self, stream: str, runs: list[RunRecord]) -> _Batch:
        paths = [str(r.spool_path) for r in runs]
        data = pa.concat_tables([self.spool.read(path) for path in paths])
        started = time.perf_counter()
        dependents = catalog.dependents(self.streams(), stream)
        faults.reach("in_spark", [r.run_id for r in runs])
        partials = self.backend.partials(data, dependents, source=stream, files=paths)
        seconds = time.perf_counter() - started
        self.metrics.stage_took("spark", seconds)
        return _Batch(stream, runs, data, dependents, partials, seconds)

    def _finish(self, seq: int) -> None:
        with self._done_lock:
            event = self._done.pop(seq, None)
        if event is not None:
            event.set()

    def _reject(self, run: RunRecord, error: str) -> None:
        log.warning("run %s rejected: %s", run.run_id, error)
        with self.engine.begin() as connection:
            catalog.reject_run(connection, run.seq, error)
        self.metrics.run_rejected(run.stream, run.seq)
        if run.spool_path:
            self.spool.remove(run.spool_path)
        self._finish(run.seq)

    def _commit_loop(self) -> None:
        while True:
            batch = self._computed.get()
            if batch is None:
                return
            self._commit_or_refuse(batch)

    def _commit_or_refuse(self, batch: _Batch) -> None:
        """Commit a batch; retry it later on a passing failure. When PostgreSQL refuses
        the rows themselves (a data error, or a limit such as a group key too long for an
        index), retrying cannot help: a run alone is rejected (nothing of it archived),
        and a batch of several is committed run by run, so only the run at fault is."""
        try:
            self._commit(batch)
        except Exception as err:
            refusal = _refusal(err)
            if refusal is None:
                log.exception("committing runs %s failed; retrying", batch.seqs)
                self._retry_later(batch.seqs)
            elif len(batch.runs) == 1:
                self._reject(batch.runs[0], f"PostgreSQL cannot archive the run: {refusal}")
            else:
                for run in batch.runs:
                    try:
                        single = self._prepare(batch.stream, [run])
                    except Exception:
                        log.exception("processing run %s failed; retrying", run.seq)
                        self._retry_later([run.seq])
                        continue
                    self._commit_or_refuse(single)

    def _commit(self, batch: _Batch) -> None:
        for _attempt in range(10):
            started = time.perf_counter()
            try:
                late_rows = self._write(batch)
            except _Retry as retry:
                # Stream DDL or a concurrent commit raced us: recompute what is left.
                if not retry.runs or batch.stream not in self.streams():
                    break
                batch = self._prepare(batch.stream, retry.runs)
                continue
            seconds = time.perf_counter() - started
            self.metrics.stage_took("postgres", seconds)
            log.info(
                "committed %d runs of %s: %d rows; Spark %.2fs, PostgreSQL %.2fs",
                len(batch.runs),
                batch.stream,
                batch.data.num_rows,
                batch.spark_seconds,
                seconds,
            )
            self.metrics.runs_done(batch.stream, batch.seqs, batch.data.num_rows, late_rows)
            break
        else:
            raise RuntimeError(f"runs of {batch.stream!r} kept racing with stream DDL")
        faults.reach("after_commit", [r.run_id for r in batch.runs])
        for run in batch.runs:
            if run.spool_path:
                self.spool.remove(run.spool_path)
            self._finish(run.seq)

    def _write(self, batch: _Batch) -> int:
        """One transaction: raw rows, partial rows, commit marker; returns the late rows.
        Raises _Retry with the runs still to commit when the dependents or the set of
        pending runs changed."""
        stream, runs, dependents = batch.stream, batch.runs, batch.dependents
        with self.engine.begin() as connection:
            cursor = connection.connection.driver_connection.cursor()  # type: ignore[union-attr]
            cursor.execute(
                sql.SQL("LOCK TABLE {} IN ROW EXCLUSIVE MODE").format(
                    internal_table(raw_archive_table(stream))
                )
            )
            # Under the lock, the dependents are final (see _backfill): recompute if changed.
            records = self.plans.load(connection)
            current = catalog.dependents(records, stream)
            if [p.name for p in current] != [p.name for p in dependents]:
                raise _Retry(runs)
            committed = set(
                connection.execute(
                    sa.update(catalog.runs)
                    .where(
                        catalog.runs.c.seq.in_([r.seq for r in runs]),
                        catalog.runs.c.status == "pending",
                    )
                    .values(status="committed", committed_at=sa.func.now())
                    .returning(catalog.runs.c.seq)
                ).scalars()
            )
            if committed != {r.seq for r in runs}:
                raise _Retry([r for r in runs if r.seq in committed])
            copy_in(cursor, raw_archive_table(stream), batch.data)
            for name, partial in batch.partials.items():
                copy_in(cursor, partial_archive_table(name), partial)
            raw = records[stream].plan
            assert isinstance(raw, RawStreamPlan)
            windowed = [p for p in dependents if isinstance(p, ParallelAggregatePlan)]
            seqs = [r.seq for r in runs]
            late_rows = record_progress(connection, raw, windowed, batch.data, seqs)
            record_corrections(connection, records, raw, batch.data)
            faults.reach("in_pg_write", [r.run_id for r in runs])
            return late_rows
