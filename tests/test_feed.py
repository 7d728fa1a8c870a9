"""The change feed (GET /streams/{name}/changes): a subscriber applying the events ends with
exactly the view, after every commit, whatever the order and lateness of the runs and
whatever the workers do; every position once, in order; late revisions labelled; resuming
from any position misses nothing and repeats nothing."""

from __future__ import annotations

import itertools
import json
import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import uvicorn
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql
from pyspark.sql import SparkSession

from rewriter.naming import CATALOG_SCHEMA
from server.net import free_port
from server.workers.reducer import Reducer
from server.workers.serial import Materializer, Repairer
from server.workers.swapper import Swapper
from tests.conftest import Strata, examples, strata_client

START = datetime(2024, 5, 1, tzinfo=UTC)
RAW = "CREATE STREAM {ev} (k text, v bigint, t timestamptz) WITH (event_time = 't')"
# PP: per key and minute; SP: the busiest key of every 5 minutes (MAX over COUNT).
PER_MINUTE = (
    "CREATE STREAM {agg} AS SELECT k, count(*) AS c, sum(v) AS s, window_end AS w "
    "FROM TUMBLE({ev}, t, INTERVAL '1 minute') GROUP BY k, window_end"
)
TOP_PER_5 = (
    "CREATE STREAM {top} AS SELECT max(c) AS top, count(*) AS ks, window_end AS w "
    "FROM TUMBLE({agg}, w, INTERVAL '5 minutes') GROUP BY window_end"
)
KEYS = {"agg": ("w", "k"), "top": ("w",)}
NAMES = itertools.count()


# ---- a subscriber ---------------------------------------------------------------------


def _parse(text: str) -> Any:
    return json.loads(text, parse_float=Decimal)


def _key(key: dict[str, object]) -> str:
    return json.dumps(key, sort_keys=True, default=str)


class Subscriber:
    """Follows a stream's feed over SSE in a thread, applying every change to ``rows``;
    reconnects with Last-Event-ID after ``drop_after`` events (random), if given."""

    def __init__(
        self,
        url: str,
        stream: str,
        *,
        snapshot: bool = True,
        since: int | None = None,
        drop_every: tuple[int, int] | None = None,
        seed: int = 0,
        rows: dict[str, dict[str, object]] | None = None,
    ) -> None:
        self.url, self.stream = url, stream
        self.rows: dict[str, dict[str, object]] = dict(rows or {})
        self.changes: list[dict[str, Any]] = []
        self.position = since if since is not None else -1
        self.reconnects = 0
        self.errors: list[str] = []  # connections lost
        self.failures: list[str] = []  # what broke the feed's promises
        self._snapshot = snapshot and since is None
        self._drop_every = drop_every
        self._rng = random.Random(seed)
        self._stop = threading.Event()
        self._moved = threading.Condition()
        self._connected = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        # Once it is connected, the stream is followed (from its snapshot, if asked).
        assert self._connected.wait(60), f"no answer to the subscription: {self.errors}"

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._follow()
            except httpx.HTTPError as error:  # the server went away: resume when it is back
                if self._stop.is_set():
                    return
                self.errors.append(repr(error))
                time.sleep(0.2)
            except (AssertionError, KeyError) as failure:
                with self._moved:
                    self.failures.append(str(failure))
                    self._moved.notify_all()
                return

    def _follow(self) -> None:
        params: dict[str, str] = {}
        headers: dict[str, str] = {}
        if self.position >= 0:
            headers["Last-Event-ID"] = str(self.position)
        elif self._snapshot:
            params["snapshot"] = "true"
            self.rows = {}  # a snapshot cut short is taken again, whole
        budget = self._rng.randint(*self._drop_every) if self._drop_every else None
        with httpx.stream(
            "GET",
            f"{self.url}/streams/{self.stream}/changes",
            params=params,
            headers=headers,
            timeout=httpx.Timeout(30, read=10),
        ) as response:
            assert response.status_code == 200, response.read()
            assert response.headers["content-type"].startswith("text/event-stream")
            self._connected.set()
            fields: dict[str, str] = {}
            for line in response.iter_lines():
                if self._stop.is_set():
                    return
                if line:
                    name, _, value = line.partition(":")
                    fields[name] = value.removeprefix(" ")
                    continue
                if "data" in fields:
                    self._dispatch(fields)
                    if budget is not None and fields.get("event") is None:
                        budget -= 1
                        if budget <= 0:  # drop the connection mid-stream, resume later
                            self.reconnects += 1
                            return
                fields = {}

    def _dispatch(self, fields: dict[str, str]) -> None:
        data = _parse(fields["data"])
        with self._moved:
            if fields.get("event") == "progress":
                assert int(fields["id"]) == data["position"]
                self.position = data["position"]
            elif fields.get("event") is None:
                assert int(fields["id"]) == data["position"]
                if data["cause"] != "snapshot":
                    assert data["position"] == self.position + 1 or self.position < 0, (
                        f"position {data['position']} after {self.position}"
                    )
                    self.changes.append(data)
                    self.position = data["position"]
                key = _key(data["key"])
                if data["op"] == "delete":
                    assert _key(self.rows.pop(key)) == _key(data["old"])
                else:
                    if data["op"] == "update":
                        assert _key(self.rows[key]) == _key(data["old"])
                    else:
                        assert key not in self.rows, f"insert of a row present: {data}"
                    self.rows[key] = data["new"]
            else:
                self.failures.append(fields["data"])
            self._moved.notify_all()

    def wait_for(self, position: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        with self._moved:
            while self.position < position:
                left = deadline - time.monotonic()
                assert not self.failures, self.failures
                assert left > 0, f"{self.stream}: at {self.position}, not {position}: {self.errors}"
                self._moved.wait(left)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)


# ---- helpers ----------------------------------------------------------------------------


@contextmanager
def serving(app: FastAPI) -> Iterator[str]:
    """The app behind a real HTTP server (TestClient holds streamed bodies back)."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host="127.0.0.1",
            port=port,
            lifespan="off",
            log_level="warning",
            timeout_graceful_shutdown=2,
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def served(module_strata: Strata) -> Iterator[str]:
    with serving(module_strata.client.app) as url:  # type: ignore[arg-type]
        yield url


def view_rows(database_url: str, view: str, keys: tuple[str, ...]) -> dict[str, object]:
    """The view's rows by key, as the feed shows them (JSON of each row)."""
    query = sql.SQL("SELECT to_jsonb(v)::text FROM {} v").format(sql.Identifier(view))
    with psycopg.connect(database_url) as connection:
        rows = [_parse(r[0]) for r in connection.execute(query)]
    found = {_key({k: r[k] for k in keys}): r for r in rows}
    assert len(found) == len(rows), "the test's streams have one row per key"
    return found


def latest(database_url: str, stream: str) -> int:
    with psycopg.connect(database_url) as connection:
        row = connection.execute(
            sql.SQL("SELECT position FROM {} WHERE stream = %s").format(
                sql.Identifier(CATALOG_SCHEMA, "feeds")
            ),
            (stream,),
        ).fetchone()
    assert row is not None, f"{stream} is not followed"
    return int(row[0])


def assert_positions(database_url: str, subscriber: Subscriber) -> int:
    """The subscriber has had every position up to the feed's latest, each once, in order
    (from the start of the feed); returns the latest."""
    position = latest(database_url, subscriber.stream)
    subscriber.wait_for(position)
    assert not subscriber.failures, subscriber.failures
    assert [c["position"] for c in subscriber.changes] == list(range(1, position + 1))
    return position


def assert_caught_up(strata: Strata, subscriber: Subscriber, keys: tuple[str, ...]) -> int:
    """The subscriber has every change up to the feed's latest position, and its rows
    are the view's; returns the position."""
    position = latest(strata.database_url, subscriber.stream)
    subscriber.wait_for(position)
    assert not subscriber.errors and not subscriber.failures, subscriber.errors
    assert subscriber.rows == view_rows(strata.database_url, subscriber.stream, keys)
    return position


def run_body(rows: list[tuple[str, int, int]]) -> str:
    return "".join(
        json.dumps({"k": k, "v": v, "t": (START + timedelta(seconds=s)).isoformat()}) + "\n"
        for k, v, s in rows
    )


class Streams:
    """A raw stream, its per-minute counts (PP) and the busiest key per 5 minutes (SP),
    under fresh names."""

    def __init__(self, strata: Strata) -> None:
        n = next(NAMES)
        self.strata = strata
        self.ev, self.agg, self.top = f"ev_{n}", f"agg_{n}", f"top_{n}"
        strata.create(RAW.format(ev=self.ev))
        strata.create(PER_MINUTE.format(agg=self.agg, ev=self.ev))
        strata.create(TOP_PER_5.format(top=self.top, agg=self.agg))
        engine, plans = strata.service.engine, strata.service.plans
        self.reducer = Reducer(engine, plans, min_rows=0, max_groups=100)
        self.materializer = Materializer(engine, plans, batch=4)
        self.repairer = Repairer(engine, plans, batch=3)
        self.newest: int | None = None  # the latest event time committed (s from START)

    def post(self, rows: list[tuple[str, int, int]], run_id: str) -> int | None:
        """Commit one run; returns the newest event time before it (the watermark its
        changes are late against: the streams have no delay)."""
        before = self.newest
        self.strata.ingest(self.ev, run_body(rows), run_id=run_id)
        newest = max(s for _, _, s in rows)
        self.newest = newest if before is None else max(before, newest)
        return before


def check_lateness(changes: list[dict[str, Any]], run_id: str, before: int | None) -> None:
    """Every change a run made is labelled late exactly when the run's source had already
    passed the end of the row's window, by that much."""
    for change in changes:
        if change["cause"] != "run" or run_id not in change["runs"]:
            continue
        end = (datetime.fromisoformat(change["key"]["w"]) - START).total_seconds()
        expected = before is not None and before >= end
        assert change["late"] is expected, (change, before)
        assert change["lateness_seconds"] == (before - end if expected else 0), change


# ---- the property ------------------------------------------------------------------------

RUN = st.lists(
    st.tuples(
        st.sampled_from("abc"),
        st.integers(0, 9),
        st.integers(0, 10 * 3600),  # ten hours: a run sent after a later one is hours late
    ),
    min_size=1,
    max_size=8,
)
STEP = st.one_of(RUN, st.sampled_from(["reduce", "materialize", "repair"]))


@settings(
    max_examples=examples(6),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=st.lists(STEP, min_size=2, max_size=12), seed=st.integers(0, 2**16))
def test_subscriber_applies_every_change(
    module_strata: Strata, served: str, steps: list[Any], seed: int
) -> None:
    strata = module_strata
    streams = Streams(strata)
    followers = {
        "agg": Subscriber(served, streams.agg),
        "top": Subscriber(served, streams.top),
    }
    # A third one drops its connection every few events and resumes from its position.
    dropping = Subscriber(served, streams.agg, drop_every=(1, 4), seed=seed)
    try:
        for name, follower in followers.items():
            assert_caught_up(strata, follower, KEYS[name])
        for i, step in enumerate(steps):
            before_step = {n: latest(strata.database_url, f.stream) for n, f in followers.items()}
            if step == "reduce":
                streams.reducer.run_once()
            elif step == "materialize":
                streams.materializer.run_once()
            elif step == "repair":
                streams.repairer.run_once()
            else:
                run_id = f"{streams.ev}-{i}"
                before = streams.post(step, run_id)
                for follower in followers.values():
                    follower.wait_for(latest(strata.database_url, follower.stream))
                    check_lateness(follower.changes, run_id, before)
            after = {n: assert_caught_up(strata, f, KEYS[n]) for n, f in followers.items()}
            if step in ("reduce", "materialize"):  # no view result changes: no event
                assert after == before_step, step
        for name, follower in followers.items():
            positions = [c["position"] for c in follower.changes]
            assert positions == list(range(1, latest(strata.database_url, follower.stream) + 1))
            assert all(c["revision"] >= 1 for c in follower.changes)
            assert not any(c["cause"] == "run" and not c["runs"] for c in follower.changes), name
        assert_caught_up(strata, dropping, KEYS["agg"])
        assert [c["position"] for c in dropping.changes] == [
            c["position"] for c in followers["agg"].changes
        ]
        assert dropping.rows == followers["agg"].rows
    finally:
        for follower in [*followers.values(), dropping]:
            follower.close()


# ---- the rest of the contract ------------------------------------------------------------


def test_late_revision_is_labelled_and_reducer_is_silent(
    module_strata: Strata, served: str
) -> None:
    strata = module_strata
    streams = Streams(strata)
    follower = Subscriber(served, streams.agg)
    try:
        assert_caught_up(strata, follower, KEYS["agg"])
        streams.post([("a", 1, 30), ("b", 2, 30)], "on-time")
        streams.post([("a", 5, 7200)], "two-hours-on")
        streams.post([("a", 3, 40)], "two-hours-late")
        assert assert_caught_up(strata, follower, KEYS["agg"]) == 4
        inserted_a, inserted_b, later, revised = follower.changes
        assert (inserted_a["op"], inserted_a["late"], inserted_a["revision"]) == (
            "insert",
            False,
            1,
        )
        assert inserted_b["key"]["k"] == "b"
        assert later["op"] == "insert" and later["runs"] == ["two-hours-on"]
        assert revised["op"] == "update" and revised["late"] is True
        assert revised["runs"] == ["two-hours-late"] and revised["revision"] == 2
        assert revised["lateness_seconds"] == 7200 - 60
        assert revised["old"]["c"] == 1 and revised["new"]["c"] == 2
        assert revised["new"]["s"] == 4 and revised["old"]["s"] == 1
        streams.reducer.run_once()
        time.sleep(1.5)
        assert latest(strata.database_url, streams.agg) == 4
        assert len(follower.changes) == 4
    finally:
        follower.close()


def test_resume_after_snapshot_and_refusals(module_strata: Strata, served: str) -> None:
    strata = module_strata
    streams = Streams(strata)
    streams.post([("a", 1, 30), ("b", 1, 90)], "first")
    # The feed starts with its first subscriber: the rows so far come as a snapshot.
    first = Subscriber(served, streams.agg)
    try:
        assert assert_caught_up(strata, first, KEYS["agg"]) == 0
        assert len(first.rows) == 2 and not first.changes
    finally:
        first.close()
    streams.post([("a", 1, 31)], "second")
    # Resuming at 0 gives exactly the change made since, applied to the snapshot's rows.
    resumed = Subscriber(served, streams.agg, since=0, rows=first.rows)
    try:
        assert assert_caught_up(strata, resumed, KEYS["agg"]) == 1
        assert [c["op"] for c in resumed.changes] == ["update"]
    finally:
        resumed.close()
    with httpx.Client(base_url=served, timeout=30) as client:
        ahead = client.get(f"/streams/{streams.agg}/changes", params={"since": 99})
        assert ahead.status_code == 410, ahead.text
        assert ahead.json()["oldest_position"] == 0 and ahead.json()["latest_position"] == 1
        raw = client.get(f"/streams/{streams.ev}/changes")
        assert raw.status_code == 400 and "aggregate streams" in raw.json()["error"]
        assert client.get("/streams/nowhere/changes").status_code == 404


def test_retention_answers_410_then_snapshot_resyncs(
    fresh_db: str, spark: SparkSession, tmp_path: Path
) -> None:
    # A server of its own: retention is a setting, and prunes at every PRUNE_EVERY positions.
    with (
        strata_client(fresh_db, spark, tmp_path, feed_retention=0.001) as short,
        serving(short.client.app) as url,  # type: ignore[arg-type]
    ):
        streams = Streams(short)
        follower = Subscriber(url, streams.agg)
        try:
            assert_caught_up(short, follower, KEYS["agg"])
        finally:
            follower.close()
        keys = [f"k{i}" for i in range(300)]
        streams.post([(k, 1, 30) for k in keys], "many")
        streams.post([(k, 1, 90) for k in keys], "many-more")  # passes 512: prunes 1..300
        with httpx.Client(base_url=url, timeout=30) as client:
            gone = client.get(f"/streams/{streams.agg}/changes", params={"since": 5})
            assert gone.status_code == 410, gone.text
            assert gone.json()["oldest_position"] == 300
        again = Subscriber(url, streams.agg)  # snapshot=true: re-sync
        try:
            assert assert_caught_up(short, again, KEYS["agg"]) == 600
            assert len(again.rows) == 600
        finally:
            again.close()


def test_alter_is_announced(module_strata: Strata, served: str) -> None:
    strata = module_strata
    streams = Streams(strata)
    streams.post([("a", 1, 30), ("a", 4, 40), ("b", 2, 30)], "before")
    follower = Subscriber(served, streams.agg)
    try:
        assert_caught_up(strata, follower, KEYS["agg"])
        response = strata.client.post(
            "/streams",
            json={
                "sql": f"ALTER STREAM {streams.agg} AS SELECT k, count(*) AS c, max(v) AS s, "
                f"window_end AS w FROM TUMBLE({streams.ev}, t, INTERVAL '1 minute') "
                "GROUP BY k, window_end"
            },
        )
        assert response.status_code in (200, 202), response.text
        deadline = time.monotonic() + 120
        swapper = Swapper(strata.service.engine, strata.service.plans)
        while strata.client.get(f"/streams/{streams.agg}").json()["version"] < 2:
            assert time.monotonic() < deadline, "the ALTER did not swap"
            swapper.run_once()
            time.sleep(0.5)
        time.sleep(1.5)  # a subscriber's poll announces a swap made at once
        assert_caught_up(strata, follower, KEYS["agg"])
        assert {c["cause"] for c in follower.changes} == {"alter"}
        assert [c["op"] for c in follower.changes] == ["update"]  # max(4, 1)=4 vs sum 5
        streams.post([("b", 7, 31)], "after")
        assert_caught_up(strata, follower, KEYS["agg"])
        assert follower.changes[-1]["cause"] == "run" and follower.changes[-1]["new"]["s"] == 7
    finally:
        follower.close()
