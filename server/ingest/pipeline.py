"""The ingest pipeline: accepted runs to committed runs, in two stages.

Atomicity (invariant 2) is one PostgreSQL transaction per batch of runs, issued from the
Spark driver: Spark computes the partial rows of every dependent stream, the driver
collects them (Arrow), and a single transaction COPYs the raw rows, COPYs the partial
rows and flips the runs' catalog status from 'pending' to 'committed'. The status flip is
the commit marker: a run is visible everywhere or nowhere, and a second processing of the
same run finds it no longer pending and writes nothing (exactly once). Partial results are
small (one row per run, window and group), so collecting them on the driver is cheap, and
no JDBC driver (which would have to be downloaded) is needed.

The compute stage takes every run queued into its next batch. While other runs are still
being received (read, parsed, spooled: ``receiving``), it waits for them, up to
``batch_linger`` seconds: runs of concurrent clients then share one Spark job, whose cost
is mostly fixed. A run alone never waits. The compute stage runs Spark over batch N+1
while the commit stage writes batch N to PostgreSQL. A bounded hand-off keeps at most one
computed batch waiting. Exactly-once never depends on the pipeline: the commit marker is
the pending->committed flip inside the commit transaction.

The one exception to that overlap is a batch feeding a join another of whose sources has a
batch handed over and not yet committed: it waits for that commit before it reads its probe
(``_await_sources``). Computed before, it would have missed those rows, its commit would
find the source's version moved (ingest/joins.py) and compute it all again, in the commit
stage; a commit takes milliseconds, a batch's Spark jobs hundreds of them. The wait only
saves work: the version check still decides.

A commit that brought late rows (behind the stream's watermark: windows the reducer has
most likely folded already, which views now merge on read, and serial windows already
materialized, which their views compute on read until repaired) calls ``late_committed``
once it is done; the runtime wakes the reducer and the repairer with it, so those windows
read like a plain table again after one fold and repair instead of after the workers'
next intervals. Only timing changes: views are exact in every snapshot whenever the
workers run.

Stopping (``stop(deadline)``) takes no new batch; a Spark job in flight is cancelled (the
backend is closed) and a commit in flight may finish until the deadline, when its
statement is cancelled: either way a run is committed or still pending, never half, and a
pending run is computed and committed at the next start. A run is rejected only for what
its data did, never because Strata was stopping.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pyarrow as pa
import sqlalchemy as sa
from psycopg import sql
from pyspark.errors import PySparkException

from rewriter import ParallelAggregatePlan, RawStreamPlan
from rewriter.naming import CATALOG_SCHEMA, raw_archive_table
from rewriter.plan import JoinStreamPlan
from server import catalog, faults, feed
from server.catalog import PlanCache, RunRecord, StreamRecord, archive_table
from server.engines.backend import SparkBackend, SparkStopped
from server.ingest.archive import copy_in, internal_table
from server.ingest.joins import JoinProbes, compared_sources, lock_versions, probe
from server.ingest.progress import record_progress
from server.ingest.spool import Spool
from server.metrics import Metrics
from server.settings import DEFAULTS
from server.sharing.runs import SharedRuns
from server.workers.serial import record_corrections

log = logging.getLogger("strata.ingest")


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
    partials: dict[str, pa.Table]  # by stream: partial rows, or the rows added to a join
    spark_seconds: float
    probes: JoinProbes  # what the batch's joins were computed against

    @property
    def seqs(self) -> list[int]:
        return [r.seq for r in self.runs]


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


def _gist(error: BaseException) -> str:
    """The first line of what ``error`` says (a JVM's says a stack trace more)."""
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def _connection_lost(error: BaseException) -> bool:
    """Whether ``error`` is PostgreSQL going away under us (shut down, restarted, the
    session terminated): the transaction rolled back, and the work is simply retried."""
    return isinstance(error, (sa.exc.OperationalError, psycopg.OperationalError))


class IngestPipeline:
    """Computes and commits the runs handed to it (``submit``), in the order given, and
    tells waiters (``expect``) when a run is committed or rejected."""

    def __init__(
        self,
        engine: sa.Engine,
        plans: PlanCache,
        backend: SparkBackend,
        spool: Spool,
        metrics: Metrics,
        *,
        batch_max_rows: int,
        batch_linger: float = 0.0,
        feed_retention: float = DEFAULTS.feed_retention,
        late_committed: Callable[[], None] = lambda: None,
        shared: SharedRuns | None = None,
    ) -> None:
        self.engine = engine
        self.plans = plans
        self.backend = backend
        self.spool = spool
        self.metrics = metrics
        self.batch_max_rows = batch_max_rows
        self.batch_linger = batch_linger
        self.feed_retention = feed_retention
        self.late_committed = late_committed
        # With servers sharing the database: the runs' bodies in PostgreSQL, and which
        # pending runs are this server's (server/sharing/runs.py).
        self.shared = shared
        # Runs being received (see receiving()), and the condition their arrival signals.
        self._receiving = 0
        self._arrivals = threading.Condition()
        self._queue: queue.Queue[int | None] = queue.Queue()
        self._done: dict[int, threading.Event] = {}
        self._unfinished: set[int] = set()  # submitted, not yet committed or rejected
        self._done_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._computed: queue.Queue[_Batch | None] = queue.Queue(maxsize=1)
        # Batches handed to the commit stage and not yet done there, per raw stream, and
        # the condition their end signals (see _await_sources).
        self._uncommitted: dict[str, int] = {}
        self._commits = threading.Condition()
        self._stopping = threading.Event()
        # The connection of the commit transaction in flight, for stop() to cancel.
        self._writing: psycopg.Connection | None = None

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    @property
    def running(self) -> bool:
        return any(thread.is_alive() for thread in self._threads)

    def streams(self) -> dict[str, StreamRecord]:
        with self.engine.connect() as connection:
            return self.plans.load(connection)

    @property
    def idle(self) -> bool:
        """Whether no run is being received, queued, computed or committed (a queued run
        is one submitted and not finished)."""
        with self._done_lock:
            unfinished = bool(self._unfinished)
        return not unfinished and not self._receiving

    def submit(self, seq: int) -> None:
        """Queue an accepted (pending) run for computing and committing."""
        with self._done_lock:
            self._unfinished.add(seq)
        self.expect(seq)
        self._queue.put(seq)
        with self._arrivals:
            self._arrivals.notify_all()

    @contextlib.contextmanager
    def receiving(self) -> Iterator[None]:
        """Count a run as being received (its rows read, parsed and spooled) until it is
        submitted or refused: a batch about to start waits for it (see _linger)."""
        with self._arrivals:
            self._receiving += 1
        try:
            yield
        finally:
            with self._arrivals:
                self._receiving -= 1
                self._arrivals.notify_all()

    def _linger(self) -> None:
        """Wait, up to batch_linger seconds, while runs are being received."""
        deadline = time.monotonic() + self.batch_linger
        with self._arrivals:
            while self._receiving and not self._stopping.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._arrivals.wait(left)

    def expect(self, seq: int) -> threading.Event:
        """The event set once run ``seq`` is committed, rejected or gone."""
        with self._done_lock:
            return self._done.setdefault(seq, threading.Event())

    def start(self, resume: list[int] | None = None) -> None:
        """Resume the runs accepted before a stop or crash (``resume``, when servers share
        the database: those this server claimed; None: every pending run), then start both
        stages."""
        with self.engine.connect() as connection:
            pending = catalog.pending_runs(connection)
        removed = self.spool.sweep({r.spool_path for r in pending if r.spool_path})
        if removed:
            log.info("removed %d spool files of runs never acknowledged", removed)
        seqs = [r.seq for r in pending] if resume is None else resume
        for seq in seqs:
            self.submit(seq)
        if seqs:
            log.info("resuming %d pending runs", len(seqs))
        self._threads = [
            threading.Thread(target=self._compute_loop, name="strata-compute", daemon=True),
            threading.Thread(target=self._commit_loop, name="strata-commit", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def request_stop(self) -> None:
        """Take no new batch; wake clients waiting for runs (they are told "pending")."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._queue.put(None)
        with self._arrivals:  # a batch waiting for runs being received starts now
            self._arrivals.notify_all()
        with self._done_lock:
            waiting = list(self._done.values())
        for event in waiting:
            event.set()

    def stop(self, deadline: float | None = None) -> None:
        """Stop both stages, letting a commit in flight finish until ``deadline`` (a
        time.monotonic() value; None: a minute), then cancelling it."""
        self.request_stop()
        if deadline is None:
            deadline = time.monotonic() + 60
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        writing = self._writing
        if writing is not None and any(t.is_alive() for t in self._threads):
            log.warning("cancelling the commit in flight; its runs stay pending")
            with contextlib.suppress(psycopg.Error):
                writing.cancel_safe(timeout=2)
            for thread in self._threads:
                thread.join(timeout=2)

    def _compute_loop(self) -> None:
        while not self._stopping.is_set():
            first = self._queue.get()
            if first is None:
                break
            if self.batch_linger:
                self._linger()
                if self.stopping:
                    break  # its runs stay pending for the next start
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
            except SparkStopped:
                log.info("runs %s stay pending for the next start: Strata is stopping", seqs)
            except Exception as error:  # keep the loop alive; the runs stay pending
                if self.stopping:
                    log.info("runs %s stay pending for the next start (%s)", seqs, _gist(error))
                    continue
                log.exception("processing runs %s failed; retrying", seqs)
                self._retry_later(seqs)
        self._hand_over(None)

    def _hand_over(self, item: _Batch | None) -> None:
        """Put ``item`` in the commit stage's hand-off, unless the commit stage is gone
        (Strata stopping: what it would have committed stays pending for the next start)."""
        if item is not None:
            self._count_uncommitted(item.stream, +1)
        while True:
            try:
                self._computed.put(item, timeout=0.2)
                return
            except queue.Full:
                if self.stopping and not self._threads[1].is_alive():
                    if item is not None:
                        self._count_uncommitted(item.stream, -1)
                    return

    def _count_uncommitted(self, stream: str, change: int) -> None:
        with self._commits:
            left = self._uncommitted.get(stream, 0) + change
            if left:
                self._uncommitted[stream] = left
            else:
                self._uncommitted.pop(stream, None)
                self._commits.notify_all()

    def _await_sources(self, stream: str, dependents: list[catalog.ComputedPlan]) -> None:
        """Wait until no batch of a source the batch's joins compare (ingest/joins.py) is
        handed over and uncommitted: probed before its commit, the batch would be computed
        twice (see the module docstring). Stopping ends the wait."""
        joins = [p for p in dependents if isinstance(p, JoinStreamPlan)]
        if not joins:
            return
        sources = compared_sources(joins, stream)
        with self._commits:
            while any(s in self._uncommitted for s in sources) and not self.stopping:
                self._commits.wait(0.2)

    def _retry_later(self, seqs: list[int]) -> None:
        self.metrics.worker_failed("ingest")
        if self.stopping:  # they stay pending; the next start takes them up
            return
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
                    if self.stopping:
                        return  # the rest stays pending for the next start
                batch.append(run)
                rows += run.rows
            if batch:
                self._compute_batch(stream, batch)

    def _compute_batch(self, stream: str, runs: list[RunRecord]) -> None:
        if self.shared is not None:  # a run claimed from another server: its body here
            runs = [self.shared.local(r) for r in runs]
        lost = [r for r in runs if not (r.spool_path and Path(r.spool_path).exists())]
        for run in lost:
            self._reject(run, "the run's spool file is missing; post the run again")
        runs = [r for r in runs if r not in lost]
        if not runs:
            return
        faults.reach("after_spool", [r.run_id for r in runs], rows=sum(r.rows for r in runs))
        try:
            batch = self._prepare(stream, runs, after_commits=True)
        except PySparkException as err:
            if self.stopping:  # a job cancelled by the stop: no fault of the runs
                raise SparkStopped("Strata is stopping") from err
            if len(runs) == 1:
                self._reject(runs[0], f"Spark could not process the run: {err}")
                return
            for run in runs:  # find the run Spark fails on; the others commit
                self._compute_batch(stream, [run])
            return
        self._hand_over(batch)

    def _prepare(
        self, stream: str, runs: list[RunRecord], *, after_commits: bool = False
    ) -> _Batch:
        """The batch of ``runs`` computed; ``after_commits`` (the compute stage): its probe
        read once the batches of its joins' sources in the commit stage are committed."""
        paths = [str(r.spool_path) for r in runs]
        data = pa.concat_tables([self.spool.read(path) for path in paths])
        dependents = catalog.dependents(self.streams(), stream)
        if after_commits:
            self._await_sources(stream, dependents)
        started = time.perf_counter()
        probes = self._probe(stream, dependents, data)
        faults.reach("in_spark", [r.run_id for r in runs], rows=data.num_rows)
        partials = self.backend.partials(
            data, dependents, source=stream, files=paths, probes=probes
        )
        seconds = time.perf_counter() - started
        self.metrics.stage_took("spark", seconds)
        return _Batch(stream, runs, data, dependents, partials, seconds, probes)

    def _probe(
        self, stream: str, dependents: list[catalog.ComputedPlan], data: pa.Table
    ) -> JoinProbes:
        """The rows of the other inputs of the batch's joins that its rows can match, read
        in one snapshot with the versions they were committed at (ingest/joins.py)."""
        joins = [p for p in dependents if isinstance(p, JoinStreamPlan)]
        if not joins:
            return JoinProbes()
        with self.engine.connect() as connection:
            connection = connection.execution_options(
                isolation_level="REPEATABLE READ", postgresql_readonly=True
            )
            with connection.begin():
                return probe(connection, joins, stream, data)

    def _finish(self, seq: int) -> None:
        with self._done_lock:
            self._unfinished.discard(seq)
            event = self._done.pop(seq, None)
        if event is not None:
            event.set()

    def _reject(self, run: RunRecord, error: str) -> None:
        log.warning("run %s rejected: %s", run.run_id, error)
        with self.engine.begin() as connection:
            catalog.reject_run(connection, run.seq, error)
            if self.shared is not None:
                self.shared.forget(connection, [run.seq])
        self.metrics.run_rejected(run.stream, run.seq)
        if run.spool_path:
            self.spool.remove(run.spool_path)
        self._finish(run.seq)

    def _commit_loop(self) -> None:
        while True:
            try:
                batch = self._computed.get(timeout=0.2)
            except queue.Empty:
                # Stopping, nothing computed waits: what the compute stage may still hand
                # over (a job cancelled too late) stays pending for the next start.
                if self.stopping:
                    return
                continue
            if batch is None:
                return
            try:
                self._commit_or_refuse(batch)
            finally:
                self._count_uncommitted(batch.stream, -1)

    def _commit_or_refuse(self, batch: _Batch) -> None:
        """Commit a batch; retry it later on a passing failure. When PostgreSQL refuses
        the rows themselves (a data error, or a limit such as a group key too long for an
        index), retrying cannot help: a run alone is rejected (nothing of it archived),
        and a batch of several is committed run by run, so only the run at fault is."""
        try:
            self._commit(batch)
        except Exception as err:
            refusal = _refusal(err)
            if self.stopping and refusal is None:
                log.info("runs %s stay pending for the next start (%s)", batch.seqs, _gist(err))
                return
            if refusal is None:
                if _connection_lost(err):  # PostgreSQL stopping or restarting: no surprise
                    log.warning("committing runs %s failed (%s); retrying", batch.seqs, _gist(err))
                else:
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
                log.info("computing runs %s of %s again", [r.seq for r in retry.runs], batch.stream)
                batch = self._prepare(batch.stream, retry.runs)
                continue
            finally:
                self._writing = None
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
            self.metrics.runs_done(
                batch.stream,
                batch.seqs,
                batch.data.num_rows,
                late_rows,
                processing=batch.spark_seconds + seconds,
            )
            break
        else:
            raise RuntimeError(f"runs of {batch.stream!r} kept racing with stream DDL")
        if late_rows:
            self.late_committed()
        faults.reach("after_commit", [r.run_id for r in batch.runs], rows=batch.data.num_rows)
        for run in batch.runs:
            if run.spool_path:
                self.spool.remove(run.spool_path)
            self._finish(run.seq)

    def _write(self, batch: _Batch) -> int:
        """One transaction: raw rows, partial rows, commit marker; returns the late rows.
        Raises _Retry with the runs still to commit when the dependents or the set of
        pending runs changed."""
        stream, runs, dependents = batch.stream, batch.runs, batch.dependents
        tabled = [p.name for p in dependents if isinstance(p, ParallelAggregatePlan) and p.tables]
        if tabled:  # the joined tables' changes first, so that this commit's name it alone
            with self.engine.begin() as connection:
                feed.follow_tables(connection, self.plans, tabled)
        with self.engine.begin() as connection:
            driver = connection.connection.driver_connection
            assert isinstance(driver, psycopg.Connection)
            self._writing = driver  # until _commit is done with it: stop() may cancel it
            cursor = driver.cursor()
            cursor.execute(
                sql.SQL("LOCK TABLE {} IN ROW EXCLUSIVE MODE").format(
                    internal_table(raw_archive_table(stream))
                )
            )
            # Under the lock, the dependents are final (see _backfill): recompute if changed
            # (a stream created or dropped, or one an ALTER swapped in under the same name).
            records = self.plans.load(connection)
            current = catalog.dependents(records, stream)
            if current != dependents:
                raise _Retry(runs)
            committed = set(
                connection.execute(
                    sa.update(catalog.runs)
                    .where(
                        catalog.runs.c.seq.in_([r.seq for r in runs]),
                        catalog.runs.c.status == "pending",
                    )
                    # The next place in this node's commit log, which peers pull in
                    # order (server/replication/): one commit stage, so the places are
                    # taken in the order the commits become visible.
                    .values(
                        status="committed",
                        committed_at=sa.func.now(),
                        commit_pos=sa.func.nextval(f"{CATALOG_SCHEMA}.commit_pos"),
                    )
                    .returning(catalog.runs.c.seq)
                ).scalars()
            )
            if committed != {r.seq for r in runs}:
                raise _Retry([r for r in runs if r.seq in committed])
            if self.shared is not None:
                self.shared.forget(connection, committed)
            joins = [p for p in dependents if isinstance(p, JoinStreamPlan)]
            if joins and not lock_versions(connection, joins, stream, batch.probes.versions):
                raise _Retry(runs)  # a source of a join committed since the probe
            copy_in(cursor, raw_archive_table(stream), batch.data)
            for plan in dependents:
                if plan.name in batch.partials:
                    copy_in(cursor, archive_table(plan), batch.partials[plan.name])
            raw = records[stream].plan
            assert isinstance(raw, RawStreamPlan)
            # Lateness per window is counted by the raw rows' event times: for the streams
            # whose rows come through a join, a row's window is the join row's, not the raw's.
            windowed = [
                p
                for p in dependents
                if isinstance(p, ParallelAggregatePlan) and not catalog.through_join(records, p)
            ]
            seqs = [r.seq for r in runs]
            # The followed streams' changes are announced last, once every write of the
            # commit is in, with the watermark from before it (server/feed/).
            with feed.recording(
                connection,
                records,
                raw,
                batch.data,
                [r.run_id for r in runs],
                retention=self.feed_retention,
            ):
                late_rows = record_progress(connection, raw, windowed, batch.data, seqs)
                joined = {j.name: batch.partials.get(j.name) for j in joins}
                record_corrections(connection, records, raw, batch.data, joined)
            faults.reach("in_pg_write", [r.run_id for r in runs], rows=batch.data.num_rows)
            return late_rows
