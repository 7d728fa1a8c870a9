"""ALTER STREAM: a stream's query changed over all history, swapped in one transaction."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta

import pytest

from server.workers.backfill import Backfiller, wait_for
from server.workers.reducer import Reducer
from server.workers.swapper import Swapper
from tests.conftest import Strata

START = datetime(2024, 8, 1, tzinfo=UTC)
RAW = "CREATE STREAM ev (k text, v bigint, t timestamptz) WITH (event_time = 't')"
PER_MIN = (
    "CREATE STREAM per_min AS SELECT window_start, k, count(*) AS c, sum(v) AS s "
    "FROM TUMBLE(ev, t, INTERVAL '1 minute') GROUP BY window_start, k"
)
MINUTE = "to_timestamp(floor(extract(epoch FROM t) / 60) * 60)"


def _run(rng: random.Random, rows: int) -> str:
    return "".join(
        json.dumps(
            {
                "k": rng.choice("abcd"),
                "v": rng.randrange(-50, 100),
                "t": (START + timedelta(seconds=rng.randrange(7200))).isoformat(),
            }
        )
        + "\n"
        for _ in range(rows)
    )


def _alter(strata: Strata, statement: str, status: int) -> dict[str, object]:
    response = strata.client.post("/streams", json={"sql": statement})
    assert response.status_code == status, response.text
    return response.json()["alter"]  # type: ignore[no-any-return]


def _swap(strata: Strata) -> int:
    swapper = Swapper(strata.service.engine, strata.service.plans)
    return sum(swapper.run_once().values())


def test_alter_backfills_then_swaps(strata: Strata) -> None:
    strata.create(RAW)
    strata.create(PER_MIN)
    rng = random.Random(1)
    for _ in range(4):
        strata.ingest("ev", _run(rng, 300))
    Reducer(strata.service.engine, strata.service.plans).run_once()
    strata.runtime.workers["backfill"].stop()
    altered = _alter(
        strata,
        "ALTER STREAM per_min AS SELECT window_start, k, count(*) AS c, max(v) AS top "
        "FROM TUMBLE(ev, t, INTERVAL '1 minute') WHERE v > 0 GROUP BY window_start, k",
        202,
    )
    assert (altered["path"], altered["state"], altered["version"]) == ("backfill", "building", 2)
    old = f"SELECT {MINUTE}, k, count(*), sum(v) FROM ev GROUP BY 1, 2"
    new = f"SELECT {MINUTE}, k, count(*), max(v) FROM ev WHERE v > 0 GROUP BY 1, 2"
    strata.ingest("ev", _run(rng, 200))  # computed for both definitions
    assert sorted(strata.query("SELECT * FROM per_min")) == sorted(strata.query(old))
    assert _swap(strata) == 0  # not caught up yet
    progress = strata.client.get("/streams/per_min").json()["progress"]["alter"]
    assert progress["state"] == "building" and progress["rows_total"] == 1200
    worker = Backfiller(strata.service.engine, strata.service.plans, strata.runtime.backend)
    worker.run_once()
    assert _swap(strata) == 1
    assert sorted(strata.query("SELECT * FROM per_min")) == sorted(strata.query(new))
    described = strata.client.get("/streams/per_min").json()
    assert described["version"] == 2
    assert described["progress"]["alter"]["state"] == "done"
    assert [h["version"] for h in described["history"]] == [1]
    assert "sum(v)" in described["history"][0]["sql"]
    assert "per_min__next" not in strata.client.get("/streams").text
    strata.ingest("ev", _run(rng, 200))
    Reducer(strata.service.engine, strata.service.plans).run_once()
    assert sorted(strata.query("SELECT * FROM per_min")) == sorted(strata.query(new))


def test_cheap_alter_reuses_partials(strata: Strata) -> None:
    strata.create(RAW)
    strata.create(PER_MIN.replace("sum(v) AS s", "sum(v) AS s, count(v) AS cv"))
    rng = random.Random(2)
    for _ in range(3):
        strata.ingest("ev", _run(rng, 300))
    Reducer(strata.service.engine, strata.service.plans).run_once()
    strata.ingest("ev", _run(rng, 100))
    altered = _alter(
        strata,
        "ALTER STREAM per_min AS SELECT window_start, k AS key, sum(v) AS total, "
        "avg(v) AS mean FROM TUMBLE(ev, t, INTERVAL '1 minute') GROUP BY window_start, k "
        "HAVING count(*) > 1",
        200,
    )
    assert (altered["path"], altered["state"]) == ("reuse", "done")
    expected = strata.query(
        f"SELECT {MINUTE}, k, sum(v), avg(v) FROM ev GROUP BY 1, 2 HAVING count(*) > 1"
    )
    assert sorted(strata.query("SELECT * FROM per_min")) == sorted(expected)
