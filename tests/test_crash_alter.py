"""Kill -9 `strata up` while an ALTER STREAM back-fills, and inside the swap's transaction:
after a restart the ALTER completes (or, killed inside an ALTER that swaps at once, was
never applied), and every view equals its batch query, nothing lost or counted twice."""

from __future__ import annotations

import random
import signal
import threading
import time
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.test_alter import RAW, STREAMS, _ndjson, _normal, _rows, oracles
from tests.test_e2e import Server

pytestmark = pytest.mark.e2e
NDJSON = {"content-type": "application/x-ndjson"}
NAMES = {"m": "m", "h": "h", "x": "x"}
NEW = STREAMS["m"].format(ev="ev", where="WHERE v > 0 ", **NAMES)


def _setup(client: httpx.Client, rng: random.Random, runs: int) -> None:
    client.post("/streams", json={"sql": RAW.format(ev="ev")}).raise_for_status()
    for kind, query in STREAMS.items():
        text = query.format(ev="ev", where="", **NAMES)
        client.post("/streams", json={"sql": f"CREATE STREAM {kind} AS {text}"}).raise_for_status()
    for i in range(runs):
        _post(client, f"history-{i}", _ndjson(_rows(rng, 2000)))


def _post(client: httpx.Client, run_id: str, body: str) -> None:
    client.post(
        "/streams/ev/runs",
        params={"wait": "true", "run_id": run_id},
        content=body,
        headers=NDJSON,
    ).raise_for_status()


def _definition(database_url: str) -> set[str]:
    """The definitions all views equal, read in one snapshot (see test_alter.definition)."""
    possible = {"old", "new"}
    with psycopg.connect(database_url) as connection:
        connection.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        for kind in NAMES:
            view = _normal(connection.execute(f"SELECT * FROM {kind}").fetchall())  # type: ignore[arg-type]
            possible &= {
                label
                for label, where in (("old", ""), ("new", "WHERE v > 0 "))
                if view == _normal(connection.execute(oracles("ev", where)[kind]).fetchall())  # type: ignore[arg-type]
            }
    return possible


def _wait_swapped(client: httpx.Client, timeout: float = 180) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        progress = client.get("/streams/m").json()["progress"]["alter"]
        if progress and progress["state"] == "done":
            return progress  # type: ignore[no-any-return]
        time.sleep(0.3)
    raise AssertionError("the ALTER was not swapped in")


def _no_leftovers(client: httpx.Client, database_url: str) -> None:
    listed = {s["name"] for s in client.get("/streams").json()}
    assert listed == {"ev", *NAMES}
    with psycopg.connect(database_url) as connection:
        left = connection.execute(
            "SELECT relname FROM pg_class WHERE relname LIKE '%\\_\\_next%'"
        ).fetchall()
    assert left == []


@pytest.mark.parametrize("seed", [1, 2])
def test_kill_while_the_alter_back_fills(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    server = Server(tmp_path / "data", env={"STRATA_BACKFILL_CHUNK_ROWS": "2000"})
    server.start()
    try:
        client = httpx.Client(base_url=server.url, timeout=120)
        _setup(client, rng, 8)
        response = client.post("/streams", json={"sql": f"ALTER STREAM m AS {NEW}"})
        assert response.status_code == 202, response.text
        bodies = {f"late-{i}": _ndjson(_rows(rng, 500)) for i in range(6)}

        def post_quietly() -> None:
            for run_id, body in bodies.items():
                try:
                    _post(httpx.Client(base_url=server.url, timeout=30), run_id, body)
                except httpx.HTTPError:
                    return

        posting = threading.Thread(target=post_quietly)
        posting.start()
        time.sleep(rng.uniform(0.3, 2.0))
        server.stop(signal.SIGKILL)
        posting.join()

        server.start()
        client = httpx.Client(base_url=server.url, timeout=120)
        assert _definition(server.database_url)  # old or new, never a mix
        for run_id, body in bodies.items():  # again: each run counts once
            _post(client, run_id, body)
        progress = _wait_swapped(client)
        assert progress["version"] == 2
        assert "new" in _definition(server.database_url)
        with psycopg.connect(server.database_url) as connection:
            rows = connection.execute("SELECT count(*) FROM ev").fetchone()
        assert rows == (8 * 2000 + 6 * 500,)
        _no_leftovers(client, server.database_url)
    finally:
        server.close()


def test_kill_inside_the_swap(tmp_path: Path) -> None:
    rng = random.Random(3)
    server = Server(tmp_path / "data", env={"STRATA_FAULT": "alter_swap:server:m"})
    server.start()
    try:
        client = httpx.Client(base_url=server.url, timeout=120)
        _setup(client, rng, 3)
        response = client.post("/streams", json={"sql": f"ALTER STREAM m AS {NEW}"})
        assert response.status_code == 202, response.text
        assert server.process is not None
        server.process.wait(timeout=120)  # the swapper reaches the fault: killed
        assert "fault injection" in server.log.read_text()

        server.extra_env = {}  # the fault struck once
        server.start()
        client = httpx.Client(base_url=server.url, timeout=120)
        progress = _wait_swapped(client)
        assert progress["version"] == 2
        assert "new" in _definition(server.database_url)
        assert client.get("/streams/m").json()["version"] == 2
        _no_leftovers(client, server.database_url)
    finally:
        server.close()


def test_kill_inside_an_alter_that_swaps_at_once(tmp_path: Path) -> None:
    """A HAVING needs no back-fill (h has nothing built on it): the swap runs in the
    ALTER's own transaction, and a kill inside it leaves the ALTER never applied."""
    rng = random.Random(4)
    server = Server(tmp_path / "data", env={"STRATA_FAULT": "alter_swap:server:h"})
    server.start()
    try:
        client = httpx.Client(base_url=server.url, timeout=120)
        _setup(client, rng, 2)
        having = STREAMS["h"].format(**NAMES) + " HAVING sum(c) > 0"
        with pytest.raises(httpx.HTTPError):
            client.post("/streams", json={"sql": f"ALTER STREAM h AS {having}"})
        assert server.process is not None
        server.process.wait(timeout=60)
        assert "fault injection" in server.log.read_text()

        server.extra_env = {}  # the fault struck once
        server.start()
        client = httpx.Client(base_url=server.url, timeout=120)
        described = client.get("/streams/h").json()
        assert described["version"] == 1 and described["progress"]["alter"] is None
        assert "old" in _definition(server.database_url)
        _no_leftovers(client, server.database_url)
        # The same ALTER again, without the fault: in place at once.
        response = client.post("/streams", json={"sql": f"ALTER STREAM h AS {having}"})
        assert response.status_code == 200, response.text
        assert response.json()["alter"]["path"] == "reuse"
        assert client.get("/streams/h").json()["version"] == 2
        assert "old" in _definition(server.database_url)  # every hour has rows: the same
    finally:
        server.close()
