"""Back-fill over history in bounded chunks while new runs keep flowing."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta

from server.workers.backfill import Backfiller
from tests.conftest import Strata

START = datetime(2024, 8, 1, tzinfo=UTC)


def _run(rng: random.Random, rows: int) -> str:
    return "".join(
        json.dumps(
            {
                "k": rng.choice("abc"),
                "t": (START + timedelta(seconds=rng.randrange(7200))).isoformat(),
            }
        )
        + "\n"
        for _ in range(rows)
    )


def _created_over_history(
    strata: Strata, rng: random.Random, runs: int, rows: int, sql: str
) -> None:
    """``ev`` with ``runs`` runs of ``rows`` rows archived, then the stream of ``sql``
    created over them, the back-filler stopped (a test steps it by hand)."""
    strata.create("CREATE STREAM ev (k text, t timestamptz) WITH (event_time = 't')")
    for _ in range(runs):
        strata.ingest("ev", _run(rng, rows))
    strata.runtime.workers["backfill"].stop()
    response = strata.client.post("/streams", json={"sql": sql})
    assert response.status_code == 201, response.text


def test_backfill_in_chunks_alongside_new_runs(strata: Strata) -> None:
    rng = random.Random(3)
    _created_over_history(
        strata,
        rng,
        6,
        200,
        "CREATE STREAM per_min AS SELECT k, count(*) AS c, window_start "
        "FROM TUMBLE(ev, t, INTERVAL '1 minute') GROUP BY k, window_start",
    )
    progress = strata.client.get("/streams/per_min").json()["progress"]["backfill"]
    assert progress["state"] == "running"
    assert (progress["rows_done"], progress["rows_total"]) == (0, 1200)

    # New runs commit while the history is still to do; they count once, at once.
    strata.ingest("ev", _run(rng, 100))
    assert strata.query("SELECT sum(c) FROM per_min") == [(100,)]

    worker = Backfiller(
        strata.service.engine, strata.service.plans, strata.runtime.backend, chunk_rows=400
    )
    plan = strata.service.stream("per_min").plan
    assert worker.step(plan) == 1  # two runs of 200 rows
    progress = strata.client.get("/streams/per_min").json()["progress"]["backfill"]
    assert (progress["state"], progress["rows_done"]) == ("running", 400)
    assert progress["eta_seconds"] is not None
    strata.ingest("ev", _run(rng, 50))
    while worker.step(plan):
        pass
    progress = strata.client.get("/streams/per_min").json()["progress"]["backfill"]
    assert (progress["state"], progress["rows_done"], progress["eta_seconds"]) == ("done", 1200, 0)
    window = "to_timestamp(floor(extract(epoch FROM t) / 60) * 60)"
    expected = strata.query(f"SELECT k, count(*), {window} FROM ev GROUP BY k, {window}")
    assert sorted(strata.query("SELECT * FROM per_min")) == sorted(expected)
    assert strata.query("SELECT sum(c) FROM per_min") == [(1350,)]


def test_a_stream_without_history_has_nothing_to_back_fill(strata: Strata) -> None:
    strata.create("CREATE STREAM ev (k text, t timestamptz) WITH (event_time = 't')")
    strata.create(
        "CREATE STREAM per_min AS SELECT count(*) AS c, window_start "
        "FROM TUMBLE(ev, t, INTERVAL '1 minute') GROUP BY window_start"
    )
    progress = strata.client.get("/streams/per_min").json()["progress"]["backfill"]
    assert (progress["state"], progress["rows_total"]) == ("done", 0)


def test_a_streams_back_fill_counts_the_streams_made_with_it(strata: Strata) -> None:
    """A stream whose view reads streams made with it (here a scalar subquery's,
    ``dear__in2``) is complete when their back-fills are: its progress sums theirs, and
    says each one's."""
    _created_over_history(
        strata,
        random.Random(5),
        3,
        100,
        "CREATE STREAM dear AS SELECT e.k, e.t FROM ev e WHERE e.t > "
        "(SELECT min(f.t) FROM ev f WHERE f.k = e.k)",
    )
    progress = strata.client.get("/streams/dear").json()["progress"]["backfill"]
    assert progress["state"] == "running"
    assert progress["streams"]["dear__in2"] == {
        "state": "running",
        "rows_done": 0,
        "rows_total": 300,
    }
    assert progress["rows_total"] == sum(s["rows_total"] for s in progress["streams"].values())
    worker = Backfiller(strata.service.engine, strata.service.plans, strata.runtime.backend)
    for name in progress["streams"]:
        plan = strata.service.stream(name).plan
        while worker.step(plan):
            pass
    progress = strata.client.get("/streams/dear").json()["progress"]["backfill"]
    assert (progress["state"], progress["eta_seconds"]) == ("done", 0)
    assert progress["rows_done"] == progress["rows_total"]
    expected = strata.query(
        "SELECT e.k, e.t FROM ev e WHERE e.t > (SELECT min(f.t) FROM ev f WHERE f.k = e.k)"
    )
    assert sorted(strata.query("SELECT * FROM dear")) == sorted(expected) != []
