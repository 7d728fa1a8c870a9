"""Kill -9 `strata up` while an ALTER STREAM back-fills, and inside the swap's transaction:
after a restart the ALTER completes (or, killed inside an ALTER that swaps at once, was
never applied), and every view equals its batch query, nothing lost or counted twice."""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.crash import Ledger, arm, check_ledger, disarm, fired
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


def test_kill_inside_a_chunk_of_the_alters_back_fill(tmp_path: Path) -> None:
    """kill -9 of the whole server inside the third chunk of the new definition's back-fill
    (two chunks committed), runs arriving: after a restart the ALTER resumes and swaps, and
    every run sent counts once."""
    rng = random.Random(1)
    ledger = Ledger()
    server = Server(tmp_path / "data", env={"STRATA_BACKFILL_CHUNK_ROWS": "2000"})
    arm(server, "backfill_chunk:server:m__next@3")  # m__next: what the ALTER builds
    server.start()
    try:
        client = httpx.Client(base_url=server.url, timeout=120)
        _setup(client, rng, 0)
        for i in range(8):
            assert ledger.post(server.url, f"history-{i}", _ndjson(_rows(rng, 2000)), wait=True)
        response = client.post("/streams", json={"sql": f"ALTER STREAM m AS {NEW}"})
        assert response.status_code == 202, response.text
        for i in range(6):
            ledger.post(server.url, f"late-{i}", _ndjson(_rows(rng, 500)), wait=True)
        assert server.process is not None
        assert server.process.wait(timeout=120) == -signal.SIGKILL
        chunk = fired(server, "backfill_chunk", "m__next")
        assert chunk["in_flight"]["rows"] == 2000

        disarm(server)
        server.start()
        client = httpx.Client(base_url=server.url, timeout=120)
        assert _definition(server.database_url)  # old or new, never a mix
        for run_id, (_, body) in sorted(ledger.bodies.items()):  # again: each counts once
            assert ledger.post(server.url, run_id, body, wait=True), run_id
        progress = _wait_swapped(client)
        assert progress["version"] == 2
        assert "new" in _definition(server.database_url)
        totals = check_ledger(server.database_url, ledger)
        assert totals["ev"] == 8 * 2000 + 6 * 500
        _no_leftovers(client, server.database_url)
    finally:
        server.close()


def test_kill_inside_the_swap(tmp_path: Path) -> None:
    rng = random.Random(3)
    server = Server(tmp_path / "data")
    arm(server, "alter_swap:server:m")
    server.start()
    try:
        client = httpx.Client(base_url=server.url, timeout=120)
        _setup(client, rng, 3)
        response = client.post("/streams", json={"sql": f"ALTER STREAM m AS {NEW}"})
        assert response.status_code == 202, response.text
        assert server.process is not None
        # The swapper reaches the fault: killed inside the swap of m and its roll-up h.
        assert server.process.wait(timeout=120) == -signal.SIGKILL
        swap = fired(server, "alter_swap", "m")
        assert set(swap["in_flight"]["members"]) >= {"m", "h"}

        disarm(server)
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
    server = Server(tmp_path / "data")
    arm(server, "alter_swap:server:h")
    server.start()
    try:
        client = httpx.Client(base_url=server.url, timeout=120)
        _setup(client, rng, 2)
        having = STREAMS["h"].format(**NAMES) + " HAVING sum(c) > 0"
        with pytest.raises(httpx.HTTPError):
            client.post("/streams", json={"sql": f"ALTER STREAM h AS {having}"})
        assert server.process is not None
        assert server.process.wait(timeout=60) == -signal.SIGKILL
        fired(server, "alter_swap", "h")

        disarm(server)
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
