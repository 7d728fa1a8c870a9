"""Fault injection for crash tests: kill a process at a named phase of a run.

A test hook, not a setting. tests/test_crash.py starts `strata up` with, for example,

    STRATA_FAULT=in_pg_write:server:run-7,after_commit:postgres:run-9

Each entry ``phase:target:run_id`` fires once, when a batch holding run ``run_id``
reaches ``phase`` in the worker (server/service.py):

- ``after_spool``: the run is spooled and pending; Spark has not started on it;
- ``in_spark``: right before the Spark job over the batch;
- ``in_pg_write``: inside the commit transaction, after the COPYs, before COMMIT;
- ``after_commit``: the run is committed; a client waiting for it is not yet told.

and one phase of ALTER STREAM (server/alter.py), for which ``run_id`` is the stream's name:

- ``alter_swap``: inside the swap's transaction, everything renamed, before COMMIT.

``target`` is what is killed or signalled:

- ``server``: SIGKILL to the Spark driver JVM and the whole process group of `strata up`
  (the JVM and the embedded PostgreSQL run in sessions of their own): a crash of the
  machine's Strata but for PostgreSQL;
- ``postgres``: SIGKILL to the embedded PostgreSQL, postmaster and backends;
- ``spark``: SIGKILL to the Spark driver JVM;
- ``sigint``: SIGINT to the process group of `strata up`, as a terminal's Ctrl-C sends it;
- ``sigterm``: SIGTERM to every process of Strata - the process group, the JVM, and the
  embedded PostgreSQL's postmaster and backends - as `systemctl stop` sends it.

Before striking, the hook holds the batch for a second, so that runs posted meanwhile are
acknowledged and pending when it strikes; not at ``after_commit``, where a waiting client
would otherwise hear of the commit first. After a signal (not a kill) the batch goes on,
and meets the stop wherever it is. Without STRATA_FAULT, ``reach`` does nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import psutil

log = logging.getLogger(__name__)

PHASES = ("after_spool", "in_spark", "in_pg_write", "after_commit", "alter_swap")
TARGETS = ("server", "postgres", "spark", "sigint", "sigterm")
HOLD_SECONDS = 1.0


@dataclass(frozen=True)
class Fault:
    phase: str
    target: str
    run_id: str


def parse(spec: str) -> list[Fault]:
    faults = []
    for entry in filter(None, (e.strip() for e in spec.split(","))):
        phase, target, run_id = (entry.split(":", 2) + ["", ""])[:3]
        if phase not in PHASES or target not in TARGETS or not run_id:
            raise ValueError(
                f"STRATA_FAULT entry {entry!r}: expected phase:target:run_id with phase in "
                f"{PHASES} and target in {TARGETS}"
            )
        faults.append(Fault(phase, target, run_id))
    return faults


_armed = parse(os.environ.get("STRATA_FAULT", ""))
_lock = threading.Lock()
# The current pid of each target process (they change when Strata restarts one).
_pids: dict[str, Callable[[], int | None]] = {}


def register(target: str, pid: Callable[[], int | None]) -> None:
    _pids[target] = pid


def reach(phase: str, run_ids: Iterable[str]) -> None:
    """Called by the worker at ``phase`` for a batch of runs: strike if a fault says so."""
    if not _armed:
        return
    ids = set(run_ids)
    with _lock:
        fault = next((f for f in _armed if f.phase == phase and f.run_id in ids), None)
        if fault is None:
            return
        _armed.remove(fault)
    log.warning("fault injection: %s at %s of run %s", fault.target, phase, fault.run_id)
    if phase != "after_commit":
        time.sleep(HOLD_SECONDS)
    if fault.target == "server":
        kill_tree(_pid("spark") or 0)
        os.killpg(os.getpgrp(), signal.SIGKILL)
    elif fault.target == "sigint":
        os.killpg(os.getpgrp(), signal.SIGINT)
    elif fault.target == "sigterm":
        os.killpg(os.getpgrp(), signal.SIGTERM)
        for target in ("spark", "postgres"):
            signal_tree(_pid(target) or 0, signal.SIGTERM)
    else:
        pid = _pid(fault.target)
        if pid is None:  # e.g. PostgreSQL is not embedded
            log.warning("fault injection: no %s process to kill", fault.target)
            return
        kill_tree(pid)


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


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and its descendants, and wait until they are gone (no-op for 0)."""
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
    psutil.wait_procs(victims, timeout=10)
