"""Many subscribers of one stream over HTTP share one watcher of the feed's position
(server/feed/hub.py): while nothing changes they cost PostgreSQL one query per interval,
not one per subscriber; when a run commits, every one of them gets its changes, in order,
once."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from bench.feed import Subscriber
from server.feed.hub import FeedHub
from server.feed.read import Feed
from tests.conftest import Strata
from tests.test_feed import serving

SUBSCRIBERS = 20
RAW = "hub_imps"
VIEW = "hub_imps_1m"


def _run(minute: int, rows: int) -> str:
    lines = ["campaign,price,t"]
    lines += [f"c{k % 3},1.5,2026-11-20T10:{minute:02d}:{k % 60:02d}Z" for k in range(rows)]
    return "\n".join(lines) + "\n"


def follow(url: str) -> Subscriber:
    """An SSE client of ``url`` in a thread of its own (bench/feed.py's)."""
    subscriber = Subscriber(url)
    threading.Thread(target=subscriber.run, daemon=True).start()
    return subscriber


@pytest.fixture
def polls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[float, int]]]:
    """When Feed.poll (a query of feed_changes) is called, and how many changes it read:
    counted, not replaced."""
    calls: list[tuple[float, int]] = []
    original = Feed.poll

    def counted(self: Feed, limit: int = 1000) -> list:  # type: ignore[type-arg]
        changes = original(self, limit)
        calls.append((time.monotonic(), len(changes)))
        return changes

    monkeypatch.setattr(Feed, "poll", counted)
    yield calls


def test_idle_subscribers_share_one_watcher_and_all_get_every_change(
    module_strata: Strata, polls: list[tuple[float, int]]
) -> None:
    strata = module_strata
    strata.create(
        f"CREATE STREAM {RAW} (campaign text, price numeric(12,4), t timestamptz) "
        "WITH (event_time = 't')"
    )
    strata.create(
        f"CREATE STREAM {VIEW} AS SELECT campaign, count(*) AS c, window_end AS t "
        f"FROM TUMBLE({RAW}, t, INTERVAL '1 minute') GROUP BY campaign, window_end"
    )
    strata.ingest(RAW, _run(1, 30), csv=True, run_id="hub-1")
    with serving(strata.client.app) as base:  # type: ignore[arg-type]
        followers = [follow(f"{base}/streams/{VIEW}/changes?since=0") for _ in range(SUBSCRIBERS)]
        try:
            for follower in followers:
                assert follower.connected.wait(60), follower.error
            hub = strata.client.app.state.feed_hub  # type: ignore[attr-defined]
            # Idle for 3 s: the subscribers read changes about once a second each (not ten
            # times), and the hub about ten times a second for all of them.
            polls.clear()
            queries = hub.queries
            time.sleep(3.0)
            assert len(polls) <= SUBSCRIBERS * 5, len(polls)  # 10 a second each: 600
            assert 5 <= hub.queries - queries <= 60

            # A run commits: every subscriber gets its changes, in order, once, promptly,
            # read from PostgreSQL once for all of them, not once each: those that come
            # while one reads wait for its read (a few reads only when a subscriber comes
            # more than SHARED_SECONDS after it; before they waited, 6 of 20 once read).
            before = [len(f.positions) for f in followers]
            polls.clear()
            committed = time.monotonic()
            strata.ingest(RAW, _run(2, 30), csv=True, run_id="hub-2")
            deadline = committed + 30
            while any(len(f.positions) == n for f, n in zip(followers, before, strict=True)):
                assert time.monotonic() < deadline, [f.error for f in followers]
                time.sleep(0.05)
            time.sleep(1.5)
            expected = followers[0].positions
            assert expected == list(range(1, len(expected) + 1))
            reads = [n for _, n in polls if n]
            assert 1 <= len(reads) <= SUBSCRIBERS // 4, reads
            assert hub.shared >= SUBSCRIBERS - len(reads)
            for follower in followers:
                assert follower.error is None
                assert follower.positions == expected
        finally:
            for follower in followers:
                follower.stop.set()


def test_subscribers_that_come_during_a_read_wait_for_it(
    module_strata: Strata, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Subscribers at one position that ask while another's read of their changes is under
    way wait for that read: PostgreSQL reads the changes once, however many ask at once
    (a commit wakes them all together). The read is slowed, so that all ask during it."""
    strata = module_strata
    raw, view = "hub_wait", "hub_wait_1m"
    strata.create(
        f"CREATE STREAM {raw} (campaign text, price numeric(12,4), t timestamptz) "
        "WITH (event_time = 't')"
    )
    strata.create(
        f"CREATE STREAM {view} AS SELECT campaign, count(*) AS c, window_end AS t "
        f"FROM TUMBLE({raw}, t, INTERVAL '1 minute') GROUP BY campaign, window_end"
    )
    with serving(strata.client.app) as base:  # type: ignore[arg-type]
        first = follow(f"{base}/streams/{view}/changes?since=0")  # the feed starts with it
        try:
            assert first.connected.wait(60), first.error
            strata.ingest(raw, _run(3, 30), csv=True, run_id="wait-1")
            deadline = time.monotonic() + 30
            while not first.positions:
                assert time.monotonic() < deadline, first.error
                time.sleep(0.05)
        finally:
            first.stop.set()
    original = Feed.poll
    feeds = [Feed(strata.service.engine, strata.service.plans, view, 0) for _ in range(20)]
    reads: list[int] = []  # the changes each of these feeds' reads found

    def slow(self: Feed, limit: int = 1000) -> list:  # type: ignore[type-arg]
        if not any(self is feed for feed in feeds):
            return original(self, limit)  # a subscriber of the server's, still leaving
        time.sleep(0.5)
        changes = original(self, limit)
        reads.append(len(changes))
        return changes

    monkeypatch.setattr(Feed, "poll", slow)
    hub = FeedHub(strata.service.engine)
    start = threading.Barrier(len(feeds))
    got: list[list[int]] = [[] for _ in feeds]

    def ask(index: int) -> None:
        start.wait()
        got[index] = [c.position for c in hub.changes(feeds[index])]

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(feeds))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert reads == [len(first.positions)]  # one read, for all of them
    assert got == [first.positions] * len(feeds)
    assert [f.position for f in feeds] == [first.positions[-1]] * len(feeds)
    assert hub.shared == len(feeds) - 1
