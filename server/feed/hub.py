"""One watcher of the feeds' latest positions for every subscriber of this process.

A subscriber over HTTP used to ask PostgreSQL for new changes every 0.1 s, so that 100
subscribers of one stream made 1,000 queries a second while nothing changed. Now one
thread reads the latest position of every stream someone follows, once per interval, in
one query; a subscriber reads its changes only when its stream's latest position is past
its own (and at least once a second, which also announces an ALTER swapped in at once:
server/feed/read.py ``Feed.poll``). The thread runs while anyone subscribes and ends a few
seconds after the last one leaves. The changes themselves are read once for the
subscribers at one position (``changes``): 100 subscribers of a commit's 5,000 changes
used to make PostgreSQL build them as JSON 100 times, on the cores ingest runs on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa
from psycopg import sql

from server.feed.read import Change, Feed
from server.feed.record import FEEDS

log = logging.getLogger(__name__)

LATEST = sql.SQL("SELECT stream, position FROM {} WHERE stream = ANY(%s)").format(FEEDS)
IDLE_SECONDS = 5.0  # the thread ends this long after the last subscriber left
# How long a batch of changes read for one subscriber serves the others at its position,
# and how many such batches are kept.
SHARED_SECONDS = 0.5
SHARED_BATCHES = 64
# How long a subscriber waits for the read another one is making at its position, before
# it reads for itself.
SHARED_WAIT_SECONDS = 10.0


class FeedHub:
    """The latest position of each followed stream with subscribers here, refreshed every
    ``interval`` seconds by one thread (``latest``), and how many queries that took."""

    def __init__(self, engine: sa.Engine, interval: float = 0.1) -> None:
        self.engine = engine
        self.interval = interval
        self.queries = 0
        self._subscribers: Counter[str] = Counter()
        self._latest: dict[str, int] = {}
        self._batches: dict[tuple[str, int], tuple[float, list[Change]]] = {}
        self._reading: dict[tuple[str, int], threading.Event] = {}
        self.shared = 0  # batches served from another subscriber's read
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @contextmanager
    def subscribed(self, name: str) -> Iterator[None]:
        """While a subscriber of ``name`` is connected."""
        with self._lock:
            self._subscribers[name] += 1
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._watch, name="strata-feed-hub", daemon=True
                )
                self._thread.start()
        try:
            yield
        finally:
            with self._lock:
                self._subscribers[name] -= 1
                if self._subscribers[name] <= 0:
                    del self._subscribers[name]
                    self._latest.pop(name, None)

    def latest(self, name: str) -> int | None:
        """``name``'s latest position as last read (None: not read yet)."""
        with self._lock:
            return self._latest.get(name)

    def changes(self, feed: Feed) -> list[Change]:
        """The changes after ``feed``'s position (advancing it), as ``Feed.poll`` reads them;
        read once for the subscribers at one position: a batch another subscriber read
        there less than SHARED_SECONDS ago is theirs too (positions never change once given),
        and a subscriber that comes while another reads at its position waits for that
        read instead of making its own (a commit wakes them all at once). Empty reads are
        not shared, so that a subscriber's poll still looks for an ALTER or a joined
        table's change about once a second."""
        key = (feed.name, feed.position)
        with self._lock:
            shared = self._shared(key, feed)
            if shared is not None:
                return shared
            reading = self._reading.get(key)
            if reading is None:
                self._reading[key] = threading.Event()
        if reading is not None:
            reading.wait(SHARED_WAIT_SECONDS)
            with self._lock:
                shared = self._shared(key, feed)
            if shared is not None:
                return shared
            return feed.poll()  # that read found nothing, failed or is slow: our own
        try:
            changes = feed.poll()
            if changes:
                with self._lock:
                    self._batches[key] = (time.monotonic(), changes)
                    if len(self._batches) > SHARED_BATCHES:
                        oldest = min(self._batches, key=lambda k: self._batches[k][0])
                        del self._batches[oldest]
            return changes
        finally:
            with self._lock:
                self._reading.pop(key).set()

    def _shared(self, key: tuple[str, int], feed: Feed) -> list[Change] | None:
        """The batch read at ``key`` less than SHARED_SECONDS ago, ``feed`` advanced past it
        (None: none); under the lock."""
        kept = self._batches.get(key)
        if kept is None or time.monotonic() - kept[0] >= SHARED_SECONDS:
            return None
        self.shared += 1
        feed.position = kept[1][-1].position
        return kept[1]

    def _watch(self) -> None:
        idle_since: float | None = None
        while True:
            with self._lock:
                names = sorted(self._subscribers)
                if not names:
                    idle_since = idle_since or time.monotonic()
                    if time.monotonic() - idle_since > IDLE_SECONDS:
                        self._thread = None
                        return
            if names:
                idle_since = None
                try:
                    self._read(names)
                except sa.exc.SQLAlchemyError as err:  # a subscriber polls once a second anyway
                    log.warning("reading the feeds' positions failed: %s", err)
            time.sleep(self.interval)

    def _read(self, names: list[str]) -> None:
        with self.engine.connect() as connection:
            driver = connection.connection.driver_connection
            assert driver is not None
            rows = driver.execute(LATEST, (names,)).fetchall()
            connection.rollback()
        with self._lock:
            self.queries += 1
            for name, position in rows:
                if name in self._subscribers:
                    self._latest[name] = int(position)
