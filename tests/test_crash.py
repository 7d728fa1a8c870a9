"""Kill -9 the whole `strata up` process group while it back-fills and reduces; after a
restart every view still equals a batch query over the raw archive."""

from __future__ import annotations

import json
import random
import signal
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.test_e2e import Server

pytestmark = pytest.mark.e2e

START = datetime(2024, 9, 1, tzinfo=UTC)
ORACLE = (
    "SELECT k, count(*), sum(v), to_timestamp(floor(extract(epoch FROM t) / 60) * 60) AS w "
    "FROM ev GROUP BY k, w"
)


def _body(rng: random.Random, rows: int) -> str:
    return "".join(
        json.dumps(
            {
                "k": rng.choice("abcd"),
                "v": rng.randrange(1000),
                "t": (START + timedelta(seconds=rng.randrange(3600))).isoformat(),
            }
        )
        + "\n"
        for _ in range(rows)
    )


@pytest.mark.parametrize("seed", [1, 2])
def test_kill_during_backfill_and_reduction(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    server = Server(
        tmp_path / "data",
        env={
            "STRATA_REDUCE_INTERVAL": "0.2",
            "STRATA_REDUCE_MIN_ROWS": "1",
            # 12 chunks of one run: the kill lands mid-back-fill more often than not.
            "STRATA_BACKFILL_CHUNK_ROWS": "2000",
        },
    )
    server.start()
    try:
        client = httpx.Client(base_url=server.url, timeout=120)
        url = client.get("/info").json()["database_url"]
        client.post(
            "/streams",
            json={
                "sql": "CREATE STREAM ev (k text, v bigint, t timestamptz) WITH (event_time = 't')"
            },
        ).raise_for_status()
        for _ in range(12):
            client.post(
                "/streams/ev/runs?wait=true",
                content=_body(rng, 2000),
                headers={"content-type": "application/x-ndjson"},
            ).raise_for_status()
        # Back-fill of a new stream over 24,000 rows, runs still arriving, reducer folding.
        client.post(
            "/streams",
            json={
                "sql": "CREATE STREAM per_min AS SELECT k, count(*) AS c, sum(v) AS s, "
                "window_start FROM TUMBLE(ev, t, INTERVAL '1 minute') GROUP BY k, window_start"
            },
        ).raise_for_status()
        for _ in range(3):
            client.post(
                "/streams/ev/runs?wait=true",
                content=_body(rng, 500),
                headers={"content-type": "application/x-ndjson"},
            ).raise_for_status()
        time.sleep(rng.uniform(0.0, 1.5))
        before = client.get("/streams/per_min").json()["progress"]["backfill"]
        server.stop(signal.SIGKILL)

        server.start()
        client = httpx.Client(base_url=server.url, timeout=120)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            progress = client.get("/streams/per_min").json()["progress"]["backfill"]
            if progress["state"] == "done":
                break
            time.sleep(0.2)
        assert progress["state"] == "done"
        assert progress["rows_total"] == 24000
        print("killed with back-fill at", before["rows_done"], "of 24000 rows")
        time.sleep(0.5)  # let the reducer run after the restart, too
        with psycopg.connect(url) as connection:
            view = connection.execute("SELECT * FROM per_min").fetchall()
            oracle = connection.execute(ORACLE).fetchall()
            raw = connection.execute("SELECT count(*) FROM ev").fetchone()
        assert raw == (25500,)
        assert sorted(view) == sorted(oracle)
    finally:
        server.close()
