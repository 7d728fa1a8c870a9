"""Kill -9 the whole `strata up` process group while it materializes and repairs serial
streams under a stream of late runs; after a restart every view equals its oracle, and once
the workers catch up, so does every serial archive."""

from __future__ import annotations

import json
import random
import signal
import time
from datetime import datetime, timedelta
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.crash import Ledger, arm, check_ledger, disarm, fired, wait_until_settled
from tests.test_e2e import Server
from tests.test_serial import ARCHIVED, SERIAL, START, STREAMS, oracles

pytestmark = pytest.mark.e2e

NAMES = {name: name for name in ("ev", *STREAMS)}


def _body(rng: random.Random, rows: int, minutes: tuple[float, float]) -> str:
    return "".join(
        json.dumps(
            {
                "campaign": rng.choice("abcz"),
                "user_id": rng.randrange(10),
                "t": (START + timedelta(minutes=rng.uniform(*minutes))).isoformat(),
            }
        )
        + "\n"
        for _ in range(rows)
    )


def _wrong(database_url: str) -> list[str]:
    wrong = []
    with psycopg.connect(database_url) as connection:
        connection.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        for name, oracle in oracles("ev").items():
            view = connection.execute(f"SELECT * FROM {name}").fetchall()  # type: ignore[arg-type]
            expected = connection.execute(oracle).fetchall()  # type: ignore[arg-type]
            if sorted(map(repr, view)) != sorted(map(repr, expected)):
                wrong.append(name)
    return wrong


def _serial(client: httpx.Client, name: str) -> dict[str, object]:
    return client.get(f"/streams/{name}").json()["progress"]["serial"]  # type: ignore[no-any-return]


def _archive_matches(client: httpx.Client, database_url: str, name: str) -> bool:
    """The archived rows are exactly the oracle's rows of the windows materialized."""
    until = _serial(client, name)["materialized_until"]
    columns, width = ARCHIVED[name]
    with psycopg.connect(database_url) as connection:
        archived = connection.execute(
            f"SELECT {columns} FROM strata_internal.{name}__serial"  # type: ignore[arg-type]
        ).fetchall()
        expected = connection.execute(oracles("ev")[name]).fetchall()  # type: ignore[arg-type]
    bound = datetime.fromisoformat(str(until)) if until else START
    expected = [r for r in expected if r[2] - width < bound]
    return sorted(map(repr, archived)) == sorted(map(repr, expected))


@pytest.mark.parametrize("killed", ["top_per_5", "leaders"])
def test_kill_inside_materialization_and_repair(tmp_path: Path, killed: str) -> None:
    """kill -9 of the whole server inside the materializer's second step for the stream
    ``killed`` (windows written, not committed; a serial aggregate, or a top-N), and after
    a restart inside a repair of windows that late runs corrected: each time the views stay
    exact, and once the workers catch up, so does every serial archive; every run sent is
    archived once."""
    rng = random.Random(1)
    ledger = Ledger()
    server = Server(
        tmp_path / "data",
        env={
            "STRATA_SERIAL_INTERVAL": "0.05",
            "STRATA_REDUCE_INTERVAL": "0.2",
            "STRATA_REDUCE_MIN_ROWS": "1",
        },
    )
    arm(server, f"materialize:server:{killed}@2")
    server.start()
    try:
        client = httpx.Client(base_url=server.url, timeout=120)
        statements = [
            "CREATE STREAM ev (campaign text, user_id bigint, t timestamptz) "
            "WITH (event_time = 't')",
            *(
                f"CREATE STREAM {name} AS {query.format(**NAMES)}"
                for name, query in STREAMS.items()
            ),
        ]
        for statement in statements:
            client.post("/streams", json={"sql": statement}).raise_for_status()
        for hour in range(4):  # each hour closes windows: the second materialization strikes
            body = _body(rng, 400, (hour * 60, hour * 60 + 60))
            ledger.post(server.url, f"hour-{hour}", body, wait=True)
        assert server.process is not None
        assert server.process.wait(timeout=120) == -signal.SIGKILL
        fired(server, "materialize", killed)

        # Late runs into the closed windows keep the repairer busy; the kill lands in one.
        arm(server, f"repair:server:{killed}")
        server.start()
        assert _wrong(server.database_url) == []
        for i in range(40):
            if not ledger.post(server.url, f"late-{i}", _body(rng, 200, (0, 180)), wait=False):
                break  # killed
            time.sleep(0.1)
        assert server.process.wait(timeout=120) == -signal.SIGKILL
        repaired = fired(server, "repair", killed)
        print("killed repairing", len(repaired["in_flight"]["windows"]), "windows")

        disarm(server)
        server.start()
        client = httpx.Client(base_url=server.url, timeout=120)
        assert _wrong(server.database_url) == []
        found = wait_until_settled(client, set(ledger.bodies))
        assert {found[r] for r in ledger.acknowledged} <= {"committed"}, found
        for run_id in sorted(ledger.bodies):  # what the server never took, again
            assert ledger.post(server.url, run_id, ledger.bodies[run_id][1], wait=True), run_id
        totals = check_ledger(server.database_url, ledger)
        assert totals["ev"] == sum(ledger.rows(r) for r in ledger.bodies)
        deadline = time.monotonic() + 120
        while not all(
            _serial(client, name)["windows_awaiting_repair"] == 0
            and _archive_matches(client, server.database_url, name)
            for name in SERIAL
        ):
            assert time.monotonic() < deadline, [_serial(client, n) for n in SERIAL]
            time.sleep(0.5)
        assert _serial(client, killed)["windows_materialized"] >= 30
        assert _serial(client, killed)["revisions"] > 0
        assert _wrong(server.database_url) == []
    finally:
        server.close()
