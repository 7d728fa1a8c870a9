"""One shape for every background worker: the same loop over the same per-stream step.

Every background thread (a worker, Spark's start-up warm-up) is a Background: it starts
as a daemon thread, is asked to stop, and is waited for, the same way.

A worker wakes every ``interval`` seconds, or at once when ``wake()`` is called (a commit
that brought late rows wakes the reducer and the repairer), and calls
``step(plan)`` for each stream it applies to; a step does one bounded, idempotent unit of
work in its own transaction and returns how much it did (it is called again while it
keeps doing ``batch`` worth); a worker made with ``concurrency`` above 1 works on that many
streams at once, each on a thread of its own. One failing stream is logged and skipped;
the loop goes on.
A crash at any point leaves either the whole transaction or nothing, so workers simply
resume. When a pass runs changes no result: every step is exact whenever it runs.

With servers sharing one database, a worker started with a lease (``start(lease, fence)``,
from server/sharing/membership.py) runs a pass, and each step of it, only while ``lease()``
says this server holds its job's lease, and a step's transaction (``transaction()``)
commits only if ``fence`` finds the lease still held, with time to spare, just before:
each job runs on one server at a time, even one paused past its lease.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import sqlalchemy as sa

from rewriter.plan import StreamPlan
from server.catalog import PlanCache, StreamRecord
from server.metrics import Metrics


class Background(ABC):
    """A named daemon thread running ``_loop`` until it is done or asked to stop."""

    name = "worker"

    def __init__(self) -> None:
        self.log = logging.getLogger(f"strata.{self.name}")
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    @abstractmethod
    def _loop(self) -> None:
        """The thread's work; it ends soon after ``_stopping`` is set."""

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=f"strata-{self.name}", daemon=True)
        self._thread.start()

    def request_stop(self) -> None:
        """Stop after the current step; do not wait."""
        self._stopping.set()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = 60.0) -> None:
        """Stop, waiting up to ``timeout`` seconds for the step in flight; a step still
        running then is left to end with the process."""
        self.request_stop()
        if self._thread is not None:
            self._thread.join(timeout=timeout)


class LeaseLost(Exception):
    """A step's transaction found its job's lease gone before committing (rolled back)."""


class Worker(Background):
    """A background worker: every ``interval`` seconds, or as soon as it is woken, its
    steps over every stream it applies to. A step is one transaction: one still running
    when the process ends (or PostgreSQL stops) rolls back."""

    def __init__(
        self,
        engine: sa.Engine,
        plans: PlanCache,
        *,
        interval: float,
        batch: int,
        metrics: Metrics | None = None,
        concurrency: int = 1,
    ) -> None:
        self.engine = engine
        self.plans = plans
        self.interval = interval
        self.batch = batch
        self.concurrency = concurrency  # streams a pass works on at once
        self.metrics = metrics  # counts items handled and failures, when set
        # Set by wake() (and by a stop): the loop's wait ends at once. A wake during a pass
        # stays set, so another pass follows: what woke it may have come after the pass read.
        self._woken = threading.Event()
        self._lease: Callable[[], bool] | None = None  # set by start(); None: always
        self._fence: Callable[[sa.Connection], bool] | None = None
        super().__init__()

    def start(
        self,
        lease: Callable[[], bool] | None = None,
        fence: Callable[[sa.Connection], bool] | None = None,
    ) -> None:
        """Start the loop; with ``lease``, passes and steps run only while it says so, and
        with ``fence``, a step commits only if it says so in the step's transaction."""
        self._lease, self._fence = lease, fence
        super().start()

    @contextmanager
    def transaction(self) -> Iterator[sa.Connection]:
        """A step's transaction (``engine.begin()``), fenced by the lease: it rolls back
        with LeaseLost if this server no longer holds the job's lease when it would
        commit."""
        with self.engine.begin() as connection:
            yield connection
            if self._fence is not None and not self._fence(connection):
                raise LeaseLost(f"{self.name}: the lease of this job was lost during a step")

    def _holding(self) -> bool:
        """Whether this server may run this job's steps now (its lease, if it has one)."""
        return self._lease is None or self._lease()

    def wake(self) -> None:
        """Start the next pass now rather than at the end of the interval."""
        self._woken.set()

    def request_stop(self) -> None:
        super().request_stop()
        self._woken.set()

    @abstractmethod
    def applies_to(self, plan: StreamPlan) -> bool:
        """Whether this worker has anything to do for streams like ``plan``."""

    @abstractmethod
    def step(self, plan: StreamPlan) -> int:
        """One bounded unit of work in one transaction; how many items it handled."""

    def run_once(self) -> dict[str, int]:
        """One pass over every stream; returns the items handled per stream. With
        ``concurrency`` above 1, that many streams at once, each on its own thread and
        connection (their steps are separate transactions, as one after the other)."""
        with self.engine.connect() as connection:
            records = self.plans.load(connection)
        applicable = [r for r in records.values() if self.applies_to(r.plan)]
        done: dict[str, int] = {}
        halt = threading.Event()  # the pass ends: its lease lost, or the worker stopping

        def drain(record: StreamRecord) -> None:
            if halt.is_set() or not self._holding():
                halt.set()
                return
            handled = self._drain_one(record, halt)
            if handled is not None:
                done[record.name] = handled

        if self.concurrency > 1 and len(applicable) > 1:
            with ThreadPoolExecutor(
                max_workers=self.concurrency, thread_name_prefix=f"strata-{self.name}"
            ) as pool:
                list(pool.map(drain, applicable))
        else:
            for record in applicable:
                drain(record)  # returns at once once the pass is halted
        return done

    def _drain_one(self, record: StreamRecord, halt: threading.Event) -> int | None:
        """``record``'s steps until it has nothing left, and how many items they handled;
        None when they failed: one stream's failure is logged and skipped, it must not stop
        the others. Sets ``halt`` when the pass must end (the lease lost, or the worker
        stopping midway)."""
        try:
            return self._drain(record.plan)
        except LeaseLost as lost:  # rolled back: the job is another server's now
            self.log.warning("%s", lost)
            halt.set()
        except sa.exc.OperationalError as error:  # PostgreSQL restarting, say: no trace
            self.log.warning("%s of %s: %s", self.name, record.name, _reason(error))
            self._failed()
        except Exception as error:
            if self._stopping.is_set():  # e.g. its Spark job, cancelled by the stop
                first = (str(error).strip().splitlines() or [type(error).__name__])[0]
                self.log.info("%s of %s stopped midway: %s", self.name, record.name, first)
                halt.set()
                return None
            self.log.exception("%s of %s failed; skipped this round", self.name, record.name)
            self._failed()
        return None

    def _drain(self, plan: StreamPlan) -> int:
        total = 0
        while not self._stopping.is_set() and self._holding():
            handled = self.step(plan)
            total += handled
            if handled < self.batch:
                break
        if total:
            self.log.info("%s: %d items of %s", self.name, total, plan.name)
            if self.metrics is not None:
                self.metrics.worker_handled(self.name, plan.name, total)
        return total

    def _failed(self) -> None:
        if self.metrics is not None:
            self.metrics.worker_failed(self.name)

    def _loop(self) -> None:
        while True:
            self._woken.wait(self.interval)
            self._woken.clear()
            if self._stopping.is_set():
                return
            if not self._holding():  # another server runs this job
                continue
            try:
                self.run_once()
            except sa.exc.OperationalError as error:  # the next round tries again
                self.log.warning("%s pass: %s", self.name, _reason(error))
                self._failed()
            except Exception:
                self.log.exception("%s pass failed; retrying in %.1fs", self.name, self.interval)
                self._failed()


def _reason(error: sa.exc.OperationalError) -> str:
    """The driver's message, first line: "connection refused", not the statement."""
    lines = str(error.orig).strip().splitlines()
    return lines[0] if lines else type(error.orig).__name__
