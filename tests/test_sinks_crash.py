"""kill -9 of `strata up` in the middle of a sink's delivery (server/faults.py): inside a
PostgreSQL sink's transaction in the target, rows and position written and not committed
(``sink_write``); after that transaction committed, before Strata noted it
(``sink_delivered``); and after a webhook's 2xx, before Strata noted it. Runs keep
committing around the kills. After the restarts, no gap and no repeat: the target table
(made by the test beforehand, watched) is the view, its position moved batch by batch in
the transactions that wrote it, and the receiver's ledger has every change once (the batch
whose answer was lost came again, and the receiver skipped what it had)."""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.crash import arm, disarm, fired
from tests.test_e2e import Server
from tests.test_feed import RAW, run_body, view_rows
from tests.test_feed_crash import PER_MINUTE, _post
from tests.test_sinks import Receiver, Target, assert_chain, assert_ledger

# Four starts of `strata up` (three kills): about three minutes, with the slow tests.
pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RUNS = 24
SINK_SETTINGS = {"STRATA_SINK_INTERVAL": "0.2", "STRATA_SINK_BACKOFF_MAX": "1"}


def _view(server: Server) -> list[tuple]:
    with psycopg.connect(server.database_url) as connection:
        return sorted(connection.execute("SELECT * FROM agg").fetchall(), key=str)


def _sinks(server: Server) -> dict[str, dict]:
    response = httpx.get(f"{server.url}/streams/agg", timeout=30)
    assert response.status_code == 200, response.text
    return {s["name"]: s for s in response.json()["sinks"]}


def _post_until_killed(server: Server, bodies: dict[str, str], names: list[str]) -> list[str]:
    """Post runs one by one until the server dies (a sink's fault struck); the runs left."""
    while names:
        name = names.pop(0)
        if not _post(server, name, bodies[name]):
            names.insert(0, name)  # posted again after the restart: one run, once
            break
        time.sleep(0.5)  # the sinks deliver between runs
    assert server.process is not None and server.process.wait(60) == -signal.SIGKILL
    return names


def test_kill_server_mid_delivery_then_no_gap_no_repeat(tmp_path: Path) -> None:
    rng = random.Random(31)
    bodies = {
        f"r{i}": run_body(
            [(rng.choice("abc"), rng.randrange(10), rng.randrange(5 * 3600)) for _ in range(4)]
        )
        for i in range(RUNS)
    }
    target = Target(tmp_path / "target")
    receiver = Receiver(tmp_path / "receiver")
    server = Server(tmp_path / "data", dict(SINK_SETTINGS))
    try:
        # The target's table made beforehand (the sink takes a table that exists), watched.
        target.execute(
            "CREATE TABLE counts (k text, c bigint, s numeric, w timestamptz, "
            "UNIQUE NULLS NOT DISTINCT (w, k))"
        )
        target.watch("counts")
        arm(server, "sink_write:server:pg_agg@2")  # inside the target's transaction
        server.start()
        with httpx.Client(base_url=server.url, timeout=120) as client:
            for statement in (RAW.format(ev="ev"), PER_MINUTE):
                assert client.post("/streams", json={"sql": statement}).status_code == 201
            assert _post(server, "r0", bodies["r0"])
            for statement in (
                f"CREATE SINK pg_agg FROM agg WITH (connector = 'postgres', url = "
                f"'{target.url}', table = 'counts', batch_size = 3)",
                f"CREATE SINK hook_agg FROM agg WITH (connector = 'webhook', url = "
                f"'{receiver.url}', batch_size = 2)",
            ):
                assert client.post("/streams", json={"sql": statement}).status_code == 201
        left = [f"r{i}" for i in range(1, RUNS)]
        for phase, sink in (
            ("sink_write", "pg_agg"),
            ("sink_delivered", "pg_agg"),  # committed in the target, not noted here
            ("sink_delivered", "hook_agg"),  # answered 2xx, not noted here
        ):
            if phase != "sink_write":
                arm(server, f"{phase}:server:{sink}@2")
                server.start()
            left = _post_until_killed(server, bodies, left)
            fired(server, phase, sink)
        disarm(server)
        server.start()
        for name in left:
            assert _post(server, name, bodies[name])
        assert left, "runs were left to post after the kills"
        deadline = time.monotonic() + 120
        while True:
            shown = _sinks(server)
            latest = shown["pg_agg"]["latest_position"]
            if all(s["position"] == latest and s["state"] == "running" for s in shown.values()):
                break
            assert time.monotonic() < deadline, shown
            time.sleep(0.3)
        assert target.rows("counts") == _view(server)
        assert_chain(target, "pg_agg", "counts", latest)
        assert receiver.rows("hook_agg") == view_rows(server.database_url, "agg", ("w", "k"))
        assert_ledger(receiver, "hook_agg", latest)
        skipped = [p for kind, p in receiver.ledger("hook_agg") if kind == "skipped"]
        assert skipped, "the batch whose answer the kill cut off came again"
    finally:
        server.close()
        receiver.close()
        target.stop()
