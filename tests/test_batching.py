"""Runs of concurrent clients share a batch (STRATA_BATCH_LINGER); a run alone never waits.

A batch about to start waits while other runs are being received, so that they are
computed by the same Spark jobs and committed by the same transaction. Runs committed
together carry the same committed_at (PostgreSQL's now() is the transaction's start).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from server.ingest.pipeline import IngestPipeline
from tests.conftest import Strata, strata_client
from tests.test_e2e import wait_until

LINGER = 60.0
RAW = "CREATE STREAM clicks (page text, n bigint, t timestamptz) WITH (event_time = 't')"
DERIVED = (
    "CREATE STREAM clicks_1m AS SELECT page, count(*) AS c, sum(n) AS n, window_end AS t "
    "FROM TUMBLE(clicks, t, INTERVAL '1 minute') GROUP BY page, window_end"
)


@pytest.fixture
def lingering(fresh_db: str, spark: SparkSession, tmp_path: Path) -> Iterator[Strata]:
    with strata_client(fresh_db, spark, tmp_path, batch_linger=LINGER) as instance:
        instance.create(RAW)
        instance.create(DERIVED)
        yield instance


def _body(page: str, count: int) -> str:
    return "page,n,t\n" + "".join(
        f"{page},{k},2026-01-01 00:{k % 60:02d}:00+00\n" for k in range(count)
    )


def _committed_at(strata: Strata, run_id: str) -> object:
    rows = strata.query(
        "SELECT status, committed_at FROM strata_catalog.runs WHERE run_id = %s", run_id
    )
    assert rows, run_id
    return rows[0][1] if rows[0][0] == "committed" else None


def _lingering(pipeline: IngestPipeline) -> bool:
    """Whether the pipeline's compute stage, having taken a run, waits for the runs being
    received (its thread is in _linger: seen on the thread's stack)."""
    frames = sys._current_frames()
    for thread in pipeline._threads:
        frame = frames.get(thread.ident) if thread.ident is not None else None
        while frame is not None:
            if frame.f_code.co_name == "_linger":
                return True
            frame = frame.f_back
    return False


def _accepted(response, run_id: str) -> None:  # type: ignore[no-untyped-def]
    assert response.status_code == 202, response.text
    assert response.json()["run_id"] == run_id and response.json()["status"] == "pending"


def _wait_committed(strata: Strata, run_ids: list[str], timeout: float = 120) -> list[object]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stamps = [_committed_at(strata, r) for r in run_ids]
        if all(stamps):
            return stamps
        time.sleep(0.1)
    raise AssertionError(f"runs {run_ids} not committed within {timeout} s")


def test_a_run_received_meanwhile_joins_the_batch(lingering: Strata) -> None:
    pipeline = lingering.service.pipeline
    with pipeline.receiving():  # another client's run, still being parsed
        first = lingering.post_run("clicks", _body("a", 100), csv=True, run_id="a", wait=False)
        _accepted(first, "a")
        wait_until(
            lambda: _lingering(pipeline),
            "the compute stage to take run a and wait for the run being received",
            timeout=60,
        )
        assert _committed_at(lingering, "a") is None
        second = lingering.post_run("clicks", _body("b", 50), csv=True, run_id="b", wait=False)
        _accepted(second, "b")
    stamps = _wait_committed(lingering, ["a", "b"])
    assert stamps[0] == stamps[1]  # one transaction
    assert lingering.query(
        "SELECT page, sum(c), sum(n) FROM clicks_1m GROUP BY page ORDER BY 1"
    ) == [
        ("a", 100, sum(range(100))),
        ("b", 50, sum(range(50))),
    ]
    assert lingering.query("SELECT count(*) FROM clicks") == [(150,)]


def test_a_run_alone_does_not_wait(lingering: Strata) -> None:
    started = time.monotonic()
    answer = lingering.ingest("clicks", _body("a", 10), csv=True, run_id="alone")
    assert time.monotonic() - started < LINGER / 2
    assert answer == {"run_id": "alone", "status": "committed", "rows": 10}
    assert lingering.query("SELECT sum(c) FROM clicks_1m") == [(10,)]


def test_a_lingering_batch_stops_with_strata(lingering: Strata) -> None:
    pipeline = lingering.service.pipeline
    with pipeline.receiving():
        late = lingering.post_run("clicks", _body("a", 10), csv=True, run_id="late", wait=False)
        _accepted(late, "late")
        wait_until(
            lambda: _lingering(pipeline),
            "the compute stage to take run late and wait for the run being received",
            timeout=60,
        )
        started = time.monotonic()
        lingering.runtime.stop()
        assert time.monotonic() - started < LINGER / 2
    # The stop came while its batch waited: the run stays pending for the next start, and
    # nothing of it is archived.
    assert lingering.query("SELECT status FROM strata_catalog.runs WHERE run_id = 'late'") == [
        ("pending",)
    ]
    assert lingering.query("SELECT count(*) FROM clicks") == [(0,)]
