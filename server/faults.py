"""Fault injection for crash tests: kill a process at a named point of Strata's work.

A test hook, not a setting. tests/test_crash.py starts `strata up` with, for example,

    STRATA_FAULT=in_pg_write:server:run-7,after_commit:postgres:run-9,reduce_fold:spark:per_min@2

Each entry ``phase:target:key[@n]`` fires once, the ``n``-th time (default: the first) that
work holding ``key`` reaches ``phase``. The points of a run, where ``key`` is a run id in the
batch (server/ingest/pipeline.py):

- ``after_spool``: the run is spooled and pending; Spark has not started on it;
- ``in_spark``: right before the Spark job over the batch;
- ``in_pg_write``: inside the commit transaction, after the COPYs, before COMMIT;
- ``after_commit``: the run is committed; a client waiting for it is not yet told.

The points of the background workers, where ``key`` is the stream's name, each inside the
step's transaction with its work written and not yet committed:

- ``reduce_fold``: the reducer has folded partial rows (server/workers/reducer.py);
- ``join_refresh``: the reducer has written anew the joined rows of an aggregate joined
  with tables on read, after a table changed (server/workers/reducer.py);
- ``materialize``: serial windows are written to the archive (server/workers/serial.py);
- ``repair``: corrected serial windows are recomputed (server/workers/serial.py);
- ``backfill_chunk``: a back-fill chunk's partial rows are copied in, for a new stream or
  an ALTER's ``__next`` stream (server/workers/backfill.py);
- ``alter_swap``: inside the ALTER's swap, everything renamed (server/alter.py);
- ``sink_write``: a PostgreSQL sink has written a batch's rows and position in its
  target's transaction, not committed (server/sinks/postgres.py); ``key`` is the sink;
- ``sink_produce``: a Kafka sink has read its batch from the feed and is about to hand it
  to its producer: none of it is in Kafka, nor its progress record (server/sinks/kafka.py);
- ``sink_progress``: a Kafka sink's batch is acknowledged by the brokers, and its progress
  record is not written yet: the batch will be sent again (server/sinks/kafka.py);
- ``sink_delivered``: a sink's batch is in its target (committed there, or answered 2xx by
  a webhook) and this server has not noted it yet (server/sinks/worker.py);
- ``feed_table``: the change feed has appended what a table joined by the stream ``key``
  changed (cause ``table``), not committed (server/feed/record.py);
- ``replace_rows``: a cluster node has put the rows the cluster chose in place of its own
  rows of a run in conflict, and computed its streams again; ``key`` is the run id
  (server/replication/replace.py).

``target`` is what is killed or signalled:

- ``server``: SIGKILL to the Spark driver JVM and the whole process group of `strata up`
  (the JVM and the embedded PostgreSQL run in sessions of their own): a crash of the
  machine's Strata but for PostgreSQL;
- ``postgres``: SIGKILL to the embedded PostgreSQL, postmaster and backends;
- ``spark``: SIGKILL to the Spark driver JVM;
- ``sigint``: SIGINT to the process group of `strata up`, as a terminal's Ctrl-C sends it;
- ``sigterm``: SIGTERM to every process of Strata - the process group, the JVM, and the
  embedded PostgreSQL's postmaster and backends - as `systemctl stop` sends it.

A crash test must be able to show that its fault fired where it says, and that work was in
flight then. So, before striking, the hook appends one JSON line to the file
STRATA_FAULT_LOG names (written and fsynced first: the strike may kill this process):
the phase, target and key, how many times the point had been reached, the pids it is about
to signal, and ``in_flight``, what the point's caller holds uncommitted (the batch's run
ids, the windows of a repair, the runs of a back-fill chunk, the rows of a fold, the
changes of a sink's batch). A target
with no process to signal (PostgreSQL not embedded) is logged with no pids, for the test
to fail on, and the work goes on.

Before striking, the hook holds the work for a second, so that runs posted meanwhile are
acknowledged and pending when it strikes; not at ``after_commit``, where a waiting client
would otherwise hear of the commit first. After a signal (not a kill) the work goes on,
and meets the stop wherever it is. Without STRATA_FAULT, ``reach`` does nothing.

A test running Strata in its own process can instead ``hold`` work at a point, in its
transaction, and run other work against it there (a race made to happen every time).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import psutil

log = logging.getLogger(__name__)

RUN_PHASES = ("after_spool", "in_spark", "in_pg_write", "after_commit")
WORKER_PHASES = (
    "reduce_fold",
    "join_refresh",
    "materialize",
    "repair",
    "backfill_chunk",
    "alter_swap",
    "replace_rows",
    "feed_table",
    "sink_write",
    "sink_produce",
    "sink_progress",
    "sink_delivered",
)
PHASES = RUN_PHASES + WORKER_PHASES
TARGETS = ("server", "postgres", "spark", "sigint", "sigterm")
HOLD_SECONDS = 1.0
LOG_ENV = "STRATA_FAULT_LOG"


@dataclass(frozen=True)
class Fault:
    phase: str
    target: str
    key: str
    nth: int = 1


def parse(spec: str) -> list[Fault]:
    faults = []
    for entry in filter(None, (e.strip() for e in spec.split(","))):
        phase, target, key = (entry.split(":", 2) + ["", ""])[:3]
        key, _, nth = key.rpartition("@") if "@" in key else (key, "", "1")
        if phase not in PHASES or target not in TARGETS or not key or not nth.isdigit():
            raise ValueError(
                f"STRATA_FAULT entry {entry!r}: expected phase:target:key[@n] with phase in "
                f"{PHASES} and target in {TARGETS}"
            )
        faults.append(Fault(phase, target, key, int(nth)))
    return faults


_armed = parse(os.environ.get("STRATA_FAULT", ""))
_lock = threading.Lock()
_reached: Counter[tuple[str, str]] = Counter()
# The current pid of each target process (they change when Strata restarts one).
_pids: dict[str, Callable[[], int | None]] = {}
# Points a test in this process holds work at (see ``hold``), by phase and key.
_holds: dict[tuple[str, str], Hold] = {}


@dataclass(frozen=True)
class Hold:
    """Work held at a point: ``reached`` is set when it gets there, and it goes on when
    ``released`` is set (or after ``timeout`` seconds, so that a failing test cannot hang)."""

    reached: threading.Event
    released: threading.Event
    timeout: float


@contextlib.contextmanager
def hold(phase: str, key: str, *, timeout: float = 120.0) -> Iterator[Hold]:
    """For a test running Strata in its own process: hold the work that reaches ``phase``
    with ``key`` there, in its transaction, until the block ends - to run other work
    against it at exactly that point. Nothing is signalled or logged."""
    if phase not in PHASES:
        raise ValueError(f"hold at {phase!r}: expected a phase in {PHASES}")
    held = Hold(threading.Event(), threading.Event(), timeout)
    _holds[phase, key] = held
    try:
        yield held
    finally:
        held.released.set()
        _holds.pop((phase, key), None)


def register(target: str, pid: Callable[[], int | None]) -> None:
    _pids[target] = pid


def reach(phase: str, keys: Iterable[str], **in_flight: object) -> None:
    """Called at ``phase`` by work holding ``keys`` (run ids, or a stream's name), with
    what it holds uncommitted as ``in_flight``: strike if a fault says so."""
    keys = list(keys)
    if _holds:
        for key in keys:
            held = _holds.get((phase, key))
            if held is not None:
                held.reached.set()
                held.released.wait(held.timeout)
    if not _armed:
        return
    ids = set(keys)
    with _lock:
        for key in ids:
            _reached[phase, key] += 1
        fault = next(
            (
                f
                for f in _armed
                if f.phase == phase and f.key in ids and _reached[phase, f.key] == f.nth
            ),
            None,
        )
        if fault is None:
            return
        _armed.remove(fault)
    victims = _victims(fault.target)
    _record(fault, sorted(ids), victims, in_flight)
    if phase != "after_commit":
        time.sleep(HOLD_SECONDS)
    if fault.target == "server":
        # Not waiting for Spark's JVM to be gone: meanwhile this server's other threads
        # would go on (a client waiting for an after_commit run would be answered).
        kill_tree(_pid("spark") or 0, wait=False)
        os.killpg(os.getpgrp(), signal.SIGKILL)
    elif fault.target == "sigint":
        os.killpg(os.getpgrp(), signal.SIGINT)
    elif fault.target == "sigterm":
        os.killpg(os.getpgrp(), signal.SIGTERM)
        for target in ("spark", "postgres"):
            signal_tree(_pid(target) or 0, signal.SIGTERM)
    elif victims:
        kill_tree(victims[0])


def _victims(target: str) -> list[int]:
    """The pids a strike at ``target`` signals first (their descendants go with them)."""
    if target in ("postgres", "spark"):
        pid = _pid(target)
        return [pid] if pid else []
    own = [os.getpgrp()]
    if target == "server":
        return [pid for pid in [_pid("spark")] if pid] + own
    if target == "sigterm":
        return own + [pid for pid in (_pid("spark"), _pid("postgres")) if pid]
    return own


def _record(fault: Fault, keys: list[str], victims: list[int], in_flight: dict) -> None:
    entry = {
        "phase": fault.phase,
        "target": fault.target,
        "key": fault.key,
        "reached": fault.nth,
        "keys": keys,
        "pids": victims,
        "in_flight": in_flight,
        "at": time.time(),
    }
    if victims:
        log.warning("fault injection: %s at %s of %s", fault.target, fault.phase, fault.key)
    else:
        log.error("fault injection: no %s process to signal at %s", fault.target, fault.phase)
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps(entry, default=str) + "\n")
        out.flush()
        os.fsync(out.fileno())


def _pid(target: str) -> int | None:
    pid_of = _pids.get(target)
    return pid_of() if pid_of else None


def signal_tree(pid: int, sig: int) -> None:
    """Send ``sig`` to ``pid`` and its descendants, as systemd does (no-op for 0)."""
    if not pid:
        return
    try:
        root = psutil.Process(pid)
        targets = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for target in targets:
        with contextlib.suppress(psutil.NoSuchProcess):
            target.send_signal(sig)


def kill_tree(pid: int, *, wait: bool = True) -> None:
    """SIGKILL ``pid`` and its descendants, and (``wait``) wait until they are gone (no-op
    for 0)."""
    if not pid:
        return
    try:
        root = psutil.Process(pid)
        victims = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for victim in victims:
        with contextlib.suppress(psutil.NoSuchProcess):
            victim.kill()
    if wait:
        psutil.wait_procs(victims, timeout=10)
