"""The HTTP contract of DESIGN.md against a real PostgreSQL and a real Spark."""

from __future__ import annotations

import threading
import time

import pytest

from tests.conftest import Strata

IMPSNS = (
    "CREATE STREAM impsns (campaign text, user_id bigint, price numeric(12,4), t timestamptz) "
    "WITH (event_time = 't')"
)
COUNT = (
    "CREATE STREAM impsn_count AS SELECT campaign, count(*) AS c, sum(price) AS revenue, "
    "window_end AS t FROM TUMBLE(impsns, t, INTERVAL '1 minute') GROUP BY campaign, window_end"
)
ROWS = (
    '{"campaign": "a", "user_id": 1, "price": 1.5, "t": "2024-01-01T00:00:10Z"}\n'
    '{"campaign": "a", "user_id": 2, "price": 2.25, "t": "2024-01-01T00:00:50Z"}\n'
    '{"campaign": "b", "user_id": 3, "price": 3, "t": "2024-01-01T00:01:10Z"}\n'
)


def counts(strata: Strata) -> list[tuple]:
    return strata.query("SELECT campaign, c, revenue::text, t::text FROM impsn_count ORDER BY 4, 1")


def archived(strata: Strata) -> int:
    return strata.query("SELECT count(*) FROM impsns")[0][0]


def test_health_and_info(strata: Strata) -> None:
    assert strata.client.get("/health").json() == {"status": "ok"}
    assert strata.client.get("/info").json()["database_url"] == strata.database_url
    assert strata.client.get("/docs").status_code == 200
    assert "/streams/{name}/runs" in strata.client.get("/openapi.json").json()["paths"]


def test_create_describe_list_drop(strata: Strata) -> None:
    raw = strata.create(IMPSNS)
    assert raw["name"] == "impsns" and raw["kind"] == "raw" and raw["event_time"] == "t"
    assert [c["name"] for c in raw["columns"]] == ["campaign", "user_id", "price", "t"]
    derived = strata.create(COUNT)
    assert derived["parallelism"] == "PP" and derived["source"] == "impsns"
    rewrite = derived["rewrite"]
    assert "GROUP BY `strata_run`" in rewrite["partial_query"]
    assert "impsn_count__partial" in rewrite["view_sql"]
    assert rewrite["reduce_query"].startswith("SELECT window_start")
    assert strata.client.get("/streams/impsn_count").json()["sql"] == COUNT
    assert sorted(s["name"] for s in strata.client.get("/streams").json()) == [
        "impsn_count",
        "impsns",
    ]
    assert strata.client.get("/streams/impsns").json()["dependents"] == ["impsn_count"]
    # The source cannot go while a stream is derived from it.
    response = strata.client.delete("/streams/impsns")
    assert response.status_code == 409 and "impsn_count" in response.json()["error"]
    assert strata.client.delete("/streams/impsn_count").status_code == 200
    assert strata.client.get("/streams/impsn_count").status_code == 404
    assert strata.client.delete("/streams/impsns").status_code == 200
    assert strata.query("SELECT count(*) FROM pg_views WHERE viewname = 'impsns'") == [(0,)]


def test_ddl_errors(strata: Strata) -> None:
    strata.create(IMPSNS)
    duplicate = strata.client.post("/streams", json={"sql": IMPSNS})
    assert duplicate.status_code == 409 and "already exists" in duplicate.json()["error"]
    invalid = strata.client.post("/streams", json={"sql": "CREATE STREAM x AS SELEC"})
    assert invalid.status_code == 400
    assert invalid.json()["error"].startswith("line 1, column "), invalid.json()
    unsupported = strata.client.post(
        "/streams",
        json={
            "sql": COUNT.replace("count(*)", "string_agg(campaign, ',')").replace(
                "impsn_count", "s"
            )
        },
    )
    assert unsupported.status_code == 400
    assert "late runs change that order" in unsupported.json()["error"]
    empty = strata.client.post("/streams", json={})
    assert empty.status_code == 400 and "sql" in empty.json()["error"], empty.json()
    for missing in (strata.client.get("/streams/nope"), strata.client.delete("/streams/nope")):
        assert missing.status_code == 404
        assert missing.json() == {"error": "stream 'nope' does not exist"}
    # None of it left a stream behind.
    assert [s["name"] for s in strata.client.get("/streams").json()] == ["impsns"]


def test_ndjson_and_csv_runs_reach_raw_archive_and_views(strata: Strata) -> None:
    strata.create(IMPSNS)
    strata.create(COUNT)
    first = strata.ingest("impsns", ROWS, run_id="r1")
    assert first == {"run_id": "r1", "status": "committed", "rows": 3}
    csv = "campaign,user_id,price,t\na,4,0.25,2024-01-01T00:00:30Z\nb,5,,2024-01-01T00:01:59Z\n"
    assert strata.ingest("impsns", csv, csv=True)["rows"] == 2
    assert archived(strata) == 5
    assert counts(strata) == [
        ("a", 3, "4.0000", "2024-01-01 00:01:00+00"),
        ("b", 2, "3.0000", "2024-01-01 00:02:00+00"),
    ]
    status = strata.client.get("/runs/r1").json()
    assert status == {
        "run_id": "r1",
        "stream": "impsns",
        "status": "committed",
        "rows": 3,
        "error": None,
    }
    missing = strata.client.get("/runs/nope")
    assert missing.status_code == 404
    assert missing.json() == {"error": "run 'nope' does not exist"}
    # A single node cannot receive an unknown run from anywhere but a later POST: a wait on
    # it answers 404 at once, not after the whole wait timeout (120 s here).
    started = time.monotonic()
    waited = strata.client.get("/runs/nope", params={"wait": "true"})
    assert waited.status_code == 404
    assert time.monotonic() - started < 30
    # The error metric names what was missing: a run, not a stream.
    metrics = strata.client.get("/metrics").text
    assert 'strata_http_errors_total{error="UnknownRun",status="404"} 2.0' in metrics


def test_run_without_wait_is_accepted_then_committed(strata: Strata) -> None:
    strata.create(IMPSNS)
    response = strata.post_run("impsns", ROWS, run_id="later", wait=False)
    assert response.status_code == 202
    assert response.json()["run_id"] == "later"
    assert response.json()["status"] in ("pending", "committed")
    record = strata.service.wait(strata.service.run("later"), 60)  # type: ignore[arg-type]
    assert record.status == "committed"
    assert archived(strata) == 3
    status = strata.client.get("/runs/later").json()
    assert (status["status"], status["rows"], status["error"]) == ("committed", 3, None)


def test_same_run_id_counts_once(strata: Strata) -> None:
    strata.create(IMPSNS)
    strata.create(COUNT)
    assert strata.ingest("impsns", ROWS, run_id="same")["rows"] == 3
    again = strata.ingest("impsns", ROWS + ROWS, run_id="same")
    assert again == {"run_id": "same", "status": "committed", "rows": 3}
    assert archived(strata) == 3
    assert sum(r[1] for r in counts(strata)) == 3


def test_concurrent_retries_count_once(strata: Strata) -> None:
    strata.create(IMPSNS)
    strata.create(COUNT)
    results: list[int] = []
    answers: list[object] = []

    def post() -> None:
        response = strata.post_run("impsns", ROWS, run_id="race")
        results.append(response.status_code)
        answers.append(response.json())

    threads = [threading.Thread(target=post) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [200] * 8
    assert answers == [{"run_id": "race", "status": "committed", "rows": 3}] * 8
    assert archived(strata) == 3
    assert sum(r[1] for r in counts(strata)) == 3
    assert strata.query("SELECT count(*) FROM strata_catalog.runs") == [(1,)]


def test_run_id_of_another_stream_conflicts(strata: Strata) -> None:
    strata.create(IMPSNS)
    strata.create(IMPSNS.replace("impsns", "clicks"))
    strata.ingest("impsns", ROWS, run_id="x")
    conflict = strata.post_run("clicks", ROWS, run_id="x")
    assert conflict.status_code == 409
    assert conflict.json()["error"] == "run id 'x' already names a run of stream 'impsns'"
    assert strata.query("SELECT count(*) FROM clicks") == [(0,)] and archived(strata) == 3


@pytest.mark.parametrize(
    "body,csv,line,fragment",
    [
        (ROWS + '{"campaign": "a", "user_id": 1,\n', False, 4, "JSON"),
        (ROWS.replace("2024-01-01T00:01:10Z", "yesterday"), False, 3, "timestamp"),
        (ROWS.replace('"user_id": 2', '"user_id": "two"'), False, 2, "user_id"),
        (ROWS.replace('"price": 3', '"price": "abc"'), False, 3, "price"),
        ('{"campaign": "a", "user_id": 1, "price": 1}\n', False, 1, "'t'"),
        (
            "campaign,user_id,price,t\na,1,1.0,2024-01-01T00:00:00Z\nb,x,1,2024-01-01T00:00:00Z\n",
            True,
            3,
            "user_id",
        ),
        ("campaign,user_id,price\na,1,1.0\n", True, 1, "'t'"),
    ],
    ids=[
        "broken-json",
        "bad-timestamp",
        "non-numeric-int",
        "non-numeric-price",
        "missing-event-time",
        "csv-bad-int",
        "csv-missing-event-time-column",
    ],
)
def test_malformed_runs_are_refused_whole(
    strata: Strata, body: str, csv: bool, line: int, fragment: str
) -> None:
    strata.create(IMPSNS)
    strata.create(COUNT)
    response = strata.post_run("impsns", body, csv=csv, run_id="bad")
    assert response.status_code == 400, response.text
    error = response.json()
    assert error["line"] == line, error
    assert fragment in error["error"], error
    assert f"line {line}" in error["error"]
    assert archived(strata) == 0
    assert strata.query("SELECT count(*) FROM strata_internal.impsn_count__partial") == [(0,)]
    assert strata.client.get("/runs/bad").status_code == 404


def test_run_errors(strata: Strata) -> None:
    strata.create(IMPSNS)
    strata.create(COUNT)
    unknown = strata.post_run("nope", ROWS)
    assert unknown.status_code == 404
    assert unknown.json() == {"error": "stream 'nope' does not exist"}
    derived = strata.post_run("impsn_count", ROWS)
    assert derived.status_code == 400 and "raw source 'impsns'" in derived.json()["error"]
    wrong_type = strata.client.post(
        "/streams/impsns/runs", content=ROWS, headers={"content-type": "application/xml"}
    )
    assert wrong_type.status_code == 415
    assert "'application/xml' is not supported" in wrong_type.json()["error"]
    # Refused before anything was recorded.
    assert archived(strata) == 0
    assert strata.query("SELECT count(*) FROM strata_catalog.runs") == [(0,)]


def test_derived_stream_backfills_history(strata: Strata) -> None:
    strata.create(IMPSNS)
    strata.ingest("impsns", ROWS)
    strata.create(COUNT)
    assert sum(r[1] for r in counts(strata)) == 3
    strata.ingest("impsns", ROWS)
    assert counts(strata) == [
        ("a", 4, "7.5000", "2024-01-01 00:01:00+00"),
        ("b", 2, "6.0000", "2024-01-01 00:02:00+00"),
    ]


def test_run_spark_cannot_compute_is_rejected_whole_and_others_commit(strata: Strata) -> None:
    strata.create(IMPSNS)
    # bigint overflow in a group key: PostgreSQL raises on this too; Spark (ANSI) refuses it.
    strata.create(
        "CREATE STREAM scaled AS SELECT user_id * 4611686018427387904 AS k, count(*) AS c, "
        "window_end FROM TUMBLE(impsns, t, INTERVAL '1 minute') "
        "GROUP BY user_id * 4611686018427387904, window_end"
    )
    ok = '{"campaign": "a", "user_id": 1, "t": "2024-01-01T00:00:00Z"}\n'
    overflow = '{"campaign": "a", "user_id": 3, "t": "2024-01-01T00:00:00Z"}\n'
    bad = strata.post_run("impsns", overflow, run_id="overflow")
    assert bad.status_code == 422, bad.text
    assert bad.json()["status"] == "rejected" and "overflow" in bad.json()["error"].lower()
    assert strata.ingest("impsns", ok)["rows"] == 1
    assert archived(strata) == 1
    assert strata.query("SELECT c FROM scaled") == [(1,)]
    assert strata.client.get("/runs/overflow").json()["status"] == "rejected"
