"""Spark's start-up warm-up (server/engines/warmup.py): it runs its batches while the
pipeline is idle and only then, gives way to runs, writes nothing, and a stop during it is
as quick and clean as any other."""

from __future__ import annotations

import logging
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry, Gauge
from pyspark.sql import SparkSession

from server.engines.backend import SparkBackend
from server.engines.warmup import RAW, Warmup, warmup_plans, warmup_rows
from tests.conftest import strata_client
from tests.test_e2e import Server, wait_until


class Pipeline:
    """The warm-up's view of the pipeline: idle or not, and how often it was asked."""

    def __init__(self) -> None:
        self.idle = threading.Event()
        self.asked = 0

    def is_idle(self) -> bool:
        self.asked += 1
        return self.idle.is_set()


def test_the_synthetic_batch_has_the_partial_rows_of_its_streams(spark: SparkSession) -> None:
    """The warm-up's batch is a real one: every stream yields its partial rows (a count of
    rows per 1-minute window and key adds up to the rows of the run)."""
    rows = warmup_rows(2_000)
    plans = warmup_plans()
    partials = SparkBackend(spark).partials(rows, plans, source=RAW)
    assert [p.name for p in plans] == [f"{RAW}_1m", f"{RAW}_5m", f"{RAW}_1h"]
    assert all(partials[p.name].num_rows > 0 for p in plans)
    counts = partials[f"{RAW}_1m"].column("agg_0_count").to_pylist()
    assert sum(counts) == rows.num_rows


def test_it_runs_only_while_the_pipeline_is_idle(spark: SparkSession, tmp_path: Path) -> None:
    pipeline = Pipeline()
    registry = CollectorRegistry()
    gauge = Gauge("left", "batches left", registry=registry)
    warmup = Warmup(
        SparkBackend(spark), tmp_path / "warmup", batches=2, idle=pipeline.is_idle, gauge=gauge
    )
    assert registry.get_sample_value("left") == 2
    warmup.start()
    try:
        # A busy pipeline: the warm-up, ready for its first batch, asks again and again
        # (every IDLE_POLL) and starts none.
        wait_until(
            lambda: pipeline.asked >= 10 or warmup.left < 2 or not warmup.running,
            "the warm-up to ask ten times whether the pipeline is idle",
        )
        assert warmup.left == 2 and warmup.running, "a batch ran while the pipeline was busy"
        pipeline.idle.set()
        wait_until(lambda: not warmup.running, "the warm-up to run its batches and end")
        assert warmup.left == 0 and registry.get_sample_value("left") == 0
        assert not (tmp_path / "warmup" / "warmup.parquet").exists()
    finally:
        warmup.stop(60)


def test_a_stop_while_it_waits_ends_it(spark: SparkSession, tmp_path: Path) -> None:
    pipeline = Pipeline()
    warmup = Warmup(SparkBackend(spark), tmp_path, batches=5, idle=pipeline.is_idle)
    warmup.start()
    try:
        wait_until(
            lambda: pipeline.asked > 0 or not warmup.running,
            "the warm-up to wait for an idle pipeline",
        )
        assert warmup.running and warmup.left == 5, "the warm-up did not wait"
        started = time.monotonic()
        warmup.stop(10)
        assert not warmup.running and time.monotonic() - started < 2
        assert warmup.left == 0  # nothing more to wait for
        assert not (tmp_path / "warmup.parquet").exists()
    finally:
        warmup.stop(60)


def test_runs_during_the_warmup_are_committed_and_exact(
    fresh_db: str, spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A server warming up takes runs as usual (they go first); the warm-up ends with its
    gauge at 0 and leaves nothing in PostgreSQL."""
    caplog.set_level(logging.INFO, logger="strata.warmup")
    batches = 6
    with strata_client(fresh_db, spark, tmp_path, spark_warmup=batches) as strata:
        client, warmup = strata.client, strata.runtime.warmup
        raw = "CREATE STREAM wu_raw (k text, t timestamptz) WITH (event_time = 't')"
        count = (
            "CREATE STREAM wu_c AS SELECT k, count(*) AS c, window_end AS t "
            "FROM TUMBLE(wu_raw, t, INTERVAL '1 minute') GROUP BY k, window_end"
        )
        assert client.post("/streams", json={"sql": raw}).status_code == 201
        assert client.post("/streams", json={"sql": count}).status_code == 201
        # The runs come while a warm-up batch is in flight: one is done, the next started.
        wait_until(lambda: warmup.left < batches, "the warm-up's first batch to be done")
        assert warmup.running and warmup.left > 0, "the warm-up ended before the runs came"
        body = "k,t\n" + "".join(f"k{i % 3},2026-01-01T00:00:{i % 60:02d}Z\n" for i in range(300))
        for i in range(3):
            answer = strata.post_run("wu_raw", body, csv=True, run_id=f"wu-{i}")
            assert answer.status_code == 200, answer.text
            assert answer.json() == {"run_id": f"wu-{i}", "status": "committed", "rows": 300}
        wait_until(lambda: not warmup.running, f"the warm-up to finish its {batches} batches")
        assert warmup.left == 0
        assert f"Spark warmed up ({batches} batches)" in caplog.messages  # not ended early
        assert "strata_spark_warmup_batches_left 0.0" in client.get("/metrics").text
        got = strata.query("SELECT k, c FROM wu_c ORDER BY k")
        assert got == [("k0", 300), ("k1", 300), ("k2", 300)]
        assert strata.query("SELECT count(*) FROM wu_raw") == [(900,)]
        assert strata.query("SELECT relname FROM pg_class WHERE relname LIKE '%warmup%'") == []


def test_a_server_stopped_during_its_warmup_exits_cleanly(tmp_path: Path) -> None:
    server = Server(tmp_path / "data", env={"STRATA_SPARK_WARMUP": "200"})
    server.start()
    try:

        def left() -> float:
            for line in httpx.get(f"{server.url}/metrics").text.splitlines():
                if line.startswith("strata_spark_warmup_batches_left "):
                    return float(line.split()[1])
            raise AssertionError("no warm-up gauge")

        # A batch done, the next one running.
        wait_until(lambda: left() < 200, "the warm-up's first batch to be done")
        started = time.monotonic()
        assert server.stop(signal.SIGTERM) == 0
        assert time.monotonic() - started < 8.0  # STRATA_SHUTDOWN_TIMEOUT's default
    finally:
        server.close()
    log = server.log.read_text()
    assert "Traceback" not in log
    assert "Spark warmed up" not in log  # stopped during the warm-up, not after it
