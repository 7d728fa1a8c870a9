"""Limits and backpressure: the run size limit (413) and the spool limit (429 with
Retry-After, or a bounded wait for room), against a real PostgreSQL and Spark.

The service here starts with its workers stopped, so that runs stay in the spool until
the test lets them commit: the spool is full exactly when the test says so.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.conftest import Strata, strata_client

STREAM = "CREATE STREAM lim (k text, t timestamptz) WITH (event_time = 't')"
ROW = '{"k": "a", "t": "2024-01-01T00:00:00Z"}\n'


@pytest.fixture
def idle(fresh_db: str, spark: SparkSession, tmp_path: Path) -> Iterator[Strata]:
    """A Strata whose run workers are not started (runs stay pending in the spool)."""
    with strata_client(
        fresh_db, spark, tmp_path, start=False, run_wait_timeout=60, max_spool_bytes=1
    ) as strata:
        assert strata.client.post("/streams", json={"sql": STREAM}).status_code == 201
        yield strata


def configure(strata: Strata, **changes: object) -> None:
    app = strata.client.app
    app.state.settings = app.state.settings.model_copy(update=changes)


def test_full_spool_refuses_new_runs_with_retry_after(idle: Strata) -> None:
    first = idle.post_run("lim", ROW, run_id="first", wait=False)
    assert first.status_code == 202
    assert idle.service.spool.pending().bytes > 0
    refused = idle.post_run("lim", ROW, run_id="second", wait=False)
    assert refused.status_code == 429, refused.text
    assert refused.headers["retry-after"] == "2"
    assert "spool is full" in refused.json()["error"]
    assert "STRATA_MAX_SPOOL_BYTES" in refused.json()["error"]
    # Nothing of the refused run was recorded or spooled.
    assert idle.client.get("/runs/second").status_code == 404
    assert len(list(idle.service.spool.directory.iterdir())) == 1
    # A retry of a run already accepted still gets its answer.
    again = idle.post_run("lim", ROW, run_id="first", wait=False)
    assert again.status_code == 202 and again.json()["run_id"] == "first"
    # Without a limit the spool takes anything.
    configure(idle, max_spool_bytes=0)
    assert idle.post_run("lim", ROW, run_id="second", wait=False).status_code == 202


def test_full_spool_waits_a_bounded_time_then_refuses(idle: Strata) -> None:
    configure(idle, spool_full="wait", spool_full_wait=0.6)
    assert idle.post_run("lim", ROW, run_id="first", wait=False).status_code == 202
    started = time.monotonic()
    refused = idle.post_run("lim", ROW, run_id="second", wait=False)
    assert refused.status_code == 429
    assert time.monotonic() - started >= 0.6
    assert "after waiting 0.6 s" in refused.json()["error"]
    assert refused.headers["retry-after"] == "2"


def test_full_spool_waits_for_room_as_runs_commit(idle: Strata) -> None:
    configure(idle, spool_full="wait", spool_full_wait=60)
    assert idle.post_run("lim", ROW, run_id="first", wait=False).status_code == 202
    # The workers start a moment later; the waiting run goes in once the first commits.
    starter = threading.Timer(1.0, idle.runtime.start)
    starter.start()
    try:
        started = time.monotonic()
        second = idle.post_run("lim", ROW, run_id="second", wait=True)
        assert second.status_code == 200, second.text
        assert time.monotonic() - started >= 1.0
    finally:
        starter.join()
    assert idle.client.get("/runs/first").json()["status"] == "committed"
    assert idle.query("SELECT count(*) FROM lim") == [(2,)]


def test_a_spool_whose_oldest_run_waited_too_long_holds_new_runs_back(idle: Strata) -> None:
    configure(idle, max_spool_bytes=0, max_spool_seconds=30)
    assert idle.post_run("lim", ROW, run_id="first", wait=False).status_code == 202
    # The oldest run has waited less than 30 s: the spool takes more.
    assert idle.post_run("lim", ROW, run_id="second", wait=False).status_code == 202
    # The first run's file as if it had waited 31 s for its commit.
    spooled = sorted(idle.service.spool.directory.iterdir(), key=lambda f: f.stat().st_mtime)
    assert len(spooled) == 2
    then = time.time() - 31
    os.utime(spooled[0], (then, then))
    assert idle.service.spool.pending().oldest_seconds >= 31
    refused = idle.post_run("lim", ROW, run_id="third", wait=False)
    assert refused.status_code == 429, refused.text
    assert refused.headers["retry-after"] == "2"
    error = refused.json()["error"]
    assert "oldest run has waited 31." in error and "STRATA_MAX_SPOOL_SECONDS" in error, error
    # Nothing of the refused run was recorded or spooled; a run already accepted is answered.
    assert idle.client.get("/runs/third").status_code == 404
    assert len(list(idle.service.spool.directory.iterdir())) == 2
    assert idle.post_run("lim", ROW, run_id="first", wait=False).status_code == 202
    # Waiting for room: the runs waiting commit once the workers start, and the third goes in.
    configure(idle, spool_full="wait", spool_full_wait=60)
    starter = threading.Timer(1.0, idle.runtime.start)
    starter.start()
    try:
        third = idle.post_run("lim", ROW, run_id="third", wait=True)
        assert third.status_code == 200, third.text
    finally:
        starter.join()
    statuses = {r: idle.client.get(f"/runs/{r}").json()["status"] for r in ("first", "second")}
    assert statuses == {"first": "committed", "second": "committed"}
    assert idle.query("SELECT count(*) FROM lim") == [(3,)]
    assert idle.service.spool.pending().oldest_seconds == 0


def test_run_size_limit(idle: Strata) -> None:
    configure(idle, max_run_bytes=100, max_spool_bytes=0)
    body = ROW * 3
    assert len(body) > 100
    too_big = idle.post_run("lim", body, wait=False)
    assert too_big.status_code == 413
    assert "exceeds the limit of 100 bytes" in too_big.json()["error"]
    chunked = idle.client.post(
        "/streams/lim/runs",
        content=iter([body.encode()[:60], body.encode()[60:]]),
        headers={"content-type": "application/x-ndjson"},
    )
    assert chunked.status_code == 413
    assert idle.post_run("lim", ROW, wait=False).status_code == 202
    assert idle.query("SELECT count(*) FROM strata_catalog.runs") == [(1,)]
