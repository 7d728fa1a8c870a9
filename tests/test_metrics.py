"""GET /metrics against a real Strata (PostgreSQL, Spark): the figures move with what
happens, parsed the way Prometheus reads them."""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path

import psycopg
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from server.workers.reducer import Reducer
from server.workers.serial import Materializer, Repairer
from tests.conftest import Strata
from tests.test_auth import COUNT, IMPSNS, TOKENS, TOP, api, bearer

# Created after the runs: back-filled.
REVENUE = (
    "CREATE STREAM impsn_revenue AS SELECT campaign, sum(price) AS revenue, window_end AS t "
    "FROM TUMBLE(impsns, t, INTERVAL '5 minutes') GROUP BY campaign, window_end"
)


def row(campaign: str, t: str) -> str:
    return json.dumps({"campaign": campaign, "user_id": 1, "price": 1.5, "t": t}) + "\n"


ON_TIME = (
    row("a", "2024-01-01T00:00:10Z")
    + row("a", "2024-01-01T00:00:50Z")
    + row("b", "2024-01-01T00:01:10Z")
)
LATE = row("a", "2024-01-01T00:00:05Z") + row("c", "2024-01-01T00:01:30Z")

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(client: TestClient, **headers: str) -> Samples:
    response = client.get("/metrics", headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """A sample's value; 0 for a labelled series not seen yet (as for a fresh counter)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_metrics_follow_runs_late_rows_workers_and_errors(strata: Strata) -> None:
    client = strata.client
    before = scrape(client)
    assert value(before, "strata_catalog_up") == 1
    assert value(before, "strata_runs_committed_total", stream="impsns") == 0

    strata.create(IMPSNS)
    strata.create(COUNT)
    strata.create(TOP)
    strata.ingest("impsns", ON_TIME)
    first = scrape(client)
    assert value(first, "strata_runs_committed_total", stream="impsns") == 1
    assert value(first, "strata_rows_ingested_total", stream="impsns") == 3
    assert value(first, "strata_late_rows_total", stream="impsns") == 0
    assert value(first, "strata_run_latency_seconds_count", stream="impsns") == 1
    assert value(first, "strata_run_latency_seconds_sum", stream="impsns") > 0
    assert value(first, "strata_partial_rows", stream="impsn_count") == 2  # (00:00, a), (00:01, b)
    assert value(first, "strata_spool_rows", stream="impsns") == 0
    assert value(first, "strata_watermark_seconds", stream="impsns") > 0
    # Every stage of ingestion took some time, and the first run went through each.
    for stage in ("parse", "spool", "spark", "postgres"):
        assert value(before, "strata_ingest_stage_seconds_total", stage=stage) == 0
        assert value(first, "strata_ingest_stage_seconds_total", stage=stage) > 0, stage

    # One row behind the watermark (00:01:10), one ahead of it.
    strata.ingest("impsns", LATE)
    late = scrape(client)
    assert value(late, "strata_runs_committed_total", stream="impsns") == 2
    assert value(late, "strata_rows_ingested_total", stream="impsns") == 5
    assert value(late, "strata_late_rows_total", stream="impsns") == 1
    assert value(late, "strata_run_latency_seconds_count", stream="impsns") == 2
    # Two batches of one run each; a run alone waits for nothing but its own batch.
    assert value(late, "strata_batch_runs_count", stream="impsns") == 2
    assert value(late, "strata_batch_runs_sum", stream="impsns") == 2
    assert value(late, "strata_batch_rows_sum", stream="impsns") == 5
    assert value(late, "strata_run_slowdown_count", stream="impsns") == 2
    assert value(late, "strata_run_slowdown_sum", stream="impsns") >= 2
    assert value(late, "strata_partial_rows", stream="impsn_count") == 4

    # Background workers, wired as `strata up` wires them.
    engine, plans, metrics = strata.service.engine, strata.service.plans, strata.service.metrics
    materializer = Materializer(engine, plans, metrics=metrics)
    repairer = Repairer(engine, plans, metrics=metrics)
    reducer = Reducer(engine, plans, min_rows=0, metrics=metrics)
    materializer.run_once()
    reducer.run_once()  # every partial row moves: one consolidated row per window and group
    groups = len(strata.query("SELECT * FROM impsn_count"))
    worked = scrape(client)
    materialized = value(worked, "strata_serial_windows_materialized", stream="impsn_top")
    assert materialized >= 1
    items = value(worked, "strata_worker_items_total", worker="materializer", stream="impsn_top")
    assert items == materialized
    assert value(worked, "strata_worker_items_total", worker="reducer", stream="impsn_count") == (
        groups
    )
    assert value(worked, "strata_partial_rows", stream="impsn_count") == 0
    assert value(worked, "strata_serial_materialized_until_seconds", stream="impsn_top") > 0

    # Late data for a window the serial stream archived: a correction, then its repair.
    strata.ingest("impsns", row("a", "2024-01-01T00:00:20Z"))
    pending = scrape(client)
    assert value(pending, "strata_repair_windows_pending", stream="impsn_top") == 1
    assert value(pending, "strata_repair_late_rows_pending", stream="impsn_top") == 1
    repairer.run_once()
    repaired = scrape(client)
    assert value(repaired, "strata_repair_windows_pending", stream="impsn_top") == 0
    assert value(repaired, "strata_worker_items_total", worker="repair", stream="impsn_top") == 1

    # A stream created over history is back-filled (strata.create waits for it).
    strata.create(REVENUE)
    filled = scrape(client)
    assert value(filled, "strata_backfill_rows", stream="impsn_revenue") == 6
    assert value(filled, "strata_backfill_rows_done", stream="impsn_revenue") == 6
    assert value(filled, "strata_backfill_running", stream="impsn_revenue") == 0
    # The back-filler counts its chunk once the chunk's transaction is over: soon after.
    deadline = time.monotonic() + 10
    while not value(filled, "strata_worker_items_total", worker="backfill", stream="impsn_revenue"):
        assert time.monotonic() < deadline, "the back-filler's chunks were not counted"
        time.sleep(0.1)
        filled = scrape(client)

    # Errors by kind: a malformed body, an unknown stream, a run PostgreSQL refuses.
    bad = strata.post_run("impsns", '{"campaign": "a", "t": "not a time"}\n')
    assert bad.status_code == 400
    assert bad.json()["error"].startswith("line 1, column 't': not a timestamp")
    assert bad.json()["value"] == "not a time"
    unknown = client.get("/streams/nope")
    assert unknown.status_code == 404 and "'nope' does not exist" in unknown.json()["error"]
    huge_key = secrets.token_hex(5000)  # too long for a btree index: the run is rejected
    refused = strata.post_run("impsns", row(huge_key, "2024-01-01T00:03:00Z"))
    assert refused.status_code == 422 and refused.json()["status"] == "rejected", refused.text
    errors = scrape(client)
    assert value(errors, "strata_http_errors_total", status="400", error="RunFormatError") == 1
    assert value(errors, "strata_http_errors_total", status="404", error="UnknownStream") == 1
    assert value(errors, "strata_runs_rejected_total", stream="impsns") == 1
    assert value(errors, "strata_runs_committed_total", stream="impsns") == 3

    # Rows held in the spool: runs accepted and not committed yet.
    with psycopg.connect(strata.database_url, autocommit=True) as connection:
        connection.execute(
            "INSERT INTO strata_catalog.runs (seq, run_id, stream, status, rows) "
            "VALUES (1000000, 'held', 'impsns', 'pending', 7)"
        )
    held = scrape(client)
    assert value(held, "strata_spool_rows", stream="impsns") == 7
    assert value(held, "strata_spool_runs", stream="impsns") == 1


def test_metrics_need_the_read_scope(strata: Strata, tmp_path: Path) -> None:
    tokens = {"api_token": TOKENS["api"], "read_token": TOKENS["read"]}
    tokens |= {"ingest_token": TOKENS["ingest"]}
    with api(strata, tmp_path, **tokens) as client:
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", headers=bearer(TOKENS["ingest"])).status_code == 403
        samples = scrape(client, **bearer(TOKENS["read"]))
        assert value(samples, "strata_http_errors_total", status="401", error="Unauthorized") == 1
        assert value(samples, "strata_http_errors_total", status="403", error="Forbidden") == 1
        assert client.get("/metrics", headers=bearer(TOKENS["api"])).status_code == 200
