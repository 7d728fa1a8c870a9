"""Stopping `strata up`: the signals that ask for it, and the time each part of it may take.

SIGINT (a terminal's Ctrl-C signals its whole foreground process group) and SIGTERM
(`docker stop` signals the container's first process, `systemctl stop` every process of
the unit) ask `strata up` to stop. From the first signal on, the stop has
STRATA_SHUTDOWN_TIMEOUT seconds, shared out in this order (each share is the fraction of
the timeout by which that part must be done):

1. HTTP (HTTP_SHARE): no new connections; requests under way finish, and clients waiting
   for a run (``wait=true``) are told it is pending.
2. Work (WORK_SHARE): workers finish their step, Spark jobs in flight are cancelled (their
   runs stay pending), and a commit in flight may finish; one still running then is
   cancelled and rolls back. A run is thus committed or pending, never half.
3. Spark (SPARK_SHARE): the session stops and its JVM exits, or is killed.
4. The embedded PostgreSQL (the rest): a fast shutdown, an immediate one if that is too
   slow (crash recovery at the next start keeps every committed transaction).

Whatever the signal reached besides `strata up` - the JVM, PostgreSQL, under systemd - may
be gone or going already; every step tolerates that. A signal during start-up ends the
start-up at once (ShutdownRequested in the main thread) and stops what had started.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType

log = logging.getLogger("strata")

HTTP_SHARE = 0.25
WORK_SHARE = 0.5
SPARK_SHARE = 0.75
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class ShutdownRequested(BaseException):  # noqa: N818 - like KeyboardInterrupt, which it replaces
    """A stop signal came while Strata was starting; raised in the main thread."""


class Shutdown:
    """One stop of `strata up`: whether it was asked for, since when, and the deadline of
    each part. Callbacks registered with ``on_request`` run, once, in a thread of their own
    when the stop is asked for (never inside a signal handler, which may have interrupted
    the very code they would call)."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.started: float | None = None
        self.reason = ""
        self._starting = True
        # Reentrant: a signal handler may request the stop while the main thread is in here.
        self._lock = threading.RLock()
        self._callbacks: list[Callable[[], None]] = []

    @property
    def requested(self) -> bool:
        return self.started is not None

    def request(self, reason: str) -> None:
        """Ask for the stop (again: no-op); starts its clock."""
        with self._lock:
            if self.started is not None:
                return
            self.started = time.monotonic()
            self.reason = reason
            callbacks = list(self._callbacks)
        threading.Thread(
            target=self._run, args=(callbacks,), name="strata-stop", daemon=True
        ).start()

    def on_request(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` when the stop is asked for (at once if it was already)."""
        with self._lock:
            self._callbacks.append(callback)
            if self.started is None:
                return
        self._run([callback])

    def until(self, share: float) -> float:
        """The time.monotonic() by which the part of the stop ending at ``share`` of the
        timeout must be done (counted from now if no stop was asked for yet)."""
        started = self.started if self.started is not None else time.monotonic()
        return started + self.timeout * share

    def left(self, share: float = 1.0) -> float:
        """Seconds left until ``until(share)``; never negative."""
        return max(0.0, self.until(share) - time.monotonic())

    def elapsed(self) -> float:
        return 0.0 if self.started is None else time.monotonic() - self.started

    def serving(self) -> None:
        """Start-up is over: from now on a signal asks for an orderly stop."""
        self._starting = False

    def handle_signal(self, signum: int, _frame: FrameType | None) -> None:
        """The handler of SIGINT and SIGTERM (install with ``install_handlers``)."""
        name = signal.Signals(signum).name
        first = not self.requested
        if first:
            log.info("%s: stopping (within %gs)", name, self.timeout)
        else:
            log.info("%s: already stopping (%.1fs so far)", name, self.elapsed())
        self.request(name)
        if first and self._starting:
            raise ShutdownRequested(name)

    def install_handlers(self) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, self.handle_signal)

    @staticmethod
    def _run(callbacks: list[Callable[[], None]]) -> None:
        for callback in callbacks:
            try:
                callback()
            except Exception:  # the others still run; the stop itself goes on
                log.exception("stopping: %r failed", callback)
