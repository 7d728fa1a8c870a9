"""`strata load` (server/loader.py): files cut into runs whose ids come from the file, the
offset and the bytes, so that a load killed midway and run again loads nothing twice."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from server.loader import chunks
from tests.test_e2e import Server, wait_until

ROOT = Path(__file__).resolve().parents[1]
RAW = "CREATE STREAM clicks (campaign text, n bigint, t timestamptz) WITH (event_time = 't')"
COUNTS = (
    "CREATE STREAM clicks_per_hour AS SELECT campaign, count(*) AS c, sum(n) AS total, "
    "window_start FROM TUMBLE(clicks, t, INTERVAL '1 hour') GROUP BY campaign, window_start"
)
ORACLE = (
    "SELECT campaign, count(*), sum(n), date_bin('1 hour', t, timestamptz 'epoch') "
    "FROM clicks GROUP BY 1, 4"
)


def test_a_csv_file_is_cut_into_runs_each_with_the_header_and_whole_records() -> None:
    text = (
        b"campaign,n,t\na,1,2026-01-01T00:00:00Z\n"
        b'"b\nc",2,2026-01-01T00:00:01Z\nd,3,2026-01-01T00:00:02Z\n'
    )
    runs = list(chunks("f.csv", io.BytesIO(text), "csv", 1))
    assert [r.rows for r in runs] == [1, 1, 1]
    assert all(r.body.startswith(b"campaign,n,t\n") for r in runs)
    assert runs[1].body.endswith(b'"b\nc",2,2026-01-01T00:00:01Z\n')  # never split
    assert [(r.first_line, r.last_line) for r in runs] == [(2, 2), (3, 4), (5, 5)]
    assert runs[2].line_of(2) == 5 and runs[1].line_of(1) == 1  # the header is line 1
    again = list(chunks("f.csv", io.BytesIO(text), "csv", 1))
    assert [r.run_id for r in runs] == [r.run_id for r in again]  # a re-run: the same ids
    assert len({r.run_id for r in runs}) == 3


def _row(i: int) -> dict[str, object]:
    return {"campaign": f"c{i % 7}", "n": i, "t": f"2026-01-01T{i % 24:02d}:{i % 60:02d}:00Z"}


def _csv(rows: range) -> str:
    return "campaign,n,t\n" + "".join("{campaign},{n},{t}\n".format(**_row(i)) for i in rows)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    base = tmp_path_factory.mktemp("loader")
    instance = Server(base / "data")
    instance.start()
    for statement in (RAW, COUNTS):
        assert httpx.post(f"{instance.url}/streams", json={"sql": statement}).status_code == 201
    yield instance
    instance.close()


def _load(server: Server, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "server.cli", "load", "--nodes", server.url, "--quiet", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )


def _archived(server: Server) -> tuple[int, int]:
    with psycopg.connect(server.database_url) as connection:
        found = connection.execute("SELECT count(*), coalesce(sum(n), 0) FROM clicks").fetchone()
    assert found is not None
    return int(found[0]), int(found[1])


def _pending(server: Server) -> int:
    with psycopg.connect(server.database_url) as connection:
        found = connection.execute(
            "SELECT count(*) FROM strata_catalog.runs WHERE status = 'pending'"
        ).fetchone()
    assert found is not None
    return int(found[0])


def _exact(server: Server) -> None:
    with psycopg.connect(server.database_url) as connection:
        view = sorted(
            connection.execute(
                "SELECT campaign, c, total, window_start FROM clicks_per_hour"
            ).fetchall()
        )
        batch = sorted(connection.execute(ORACLE).fetchall())
    assert view == batch and view


@pytest.mark.e2e
def test_a_directory_loads_once_even_when_the_loader_is_killed_and_run_again(
    server: Server, tmp_path: Path
) -> None:
    files = tmp_path / "in"
    (files / "day").mkdir(parents=True)
    (files / "a.csv").write_text(_csv(range(0, 1500)))
    (files / "day" / "b.csv").write_text(_csv(range(1500, 3000)))
    (files / "day" / "c.ndjson").write_text(
        "".join(json.dumps(_row(i)) + "\n" for i in range(3000, 4000))
    )
    total = (4000, sum(range(4000)))
    loader = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "server.cli",
            "load",
            "--nodes",
            server.url,
            "--quiet",
            "--run-rows",
            "25",
            "--concurrency",
            "1",
            "--wait",  # one committed run at a time: slow enough to be killed midway
            "clicks",
            str(files),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_until(lambda: _archived(server)[0] >= 200, "some runs to commit", timeout=300)
    os.kill(loader.pid, signal.SIGKILL)  # midway: runs in flight, others never sent
    loader.wait()
    partly = _archived(server)[0]
    assert 0 < partly < total[0], "the kill came after the end: the test would prove nothing"

    again = _load(server, "--run-rows", "25", "--concurrency", "4", "clicks", str(files))
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["rows"] == total[0]  # every run answered, known or new
    wait_until(lambda: _archived(server) == total, "the loads to be committed", timeout=300)
    wait_until(lambda: _pending(server) == 0, "no run to be pending", timeout=300)
    assert _archived(server) == total  # nothing twice, nothing missing
    _exact(server)
    with psycopg.connect(server.database_url) as connection:
        ids = connection.execute(
            "SELECT run_id FROM strata_catalog.runs WHERE stream = 'clicks' "
            "AND status = 'committed'"
        ).fetchall()
    assert len(ids) == len(set(ids)) == 160  # 4000 rows in runs of 25


@pytest.mark.e2e
def test_a_bad_line_stops_the_load_naming_the_file_and_line(server: Server, tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    lines = _csv(range(10_000, 10_010)).splitlines()
    lines[7] = "c1,not-a-number,2026-01-01T00:00:00Z"  # line 8 of the file
    bad.write_text("\n".join(lines) + "\n")
    done = _load(server, "--run-rows", "3", "clicks", str(bad))
    assert done.returncode == 1
    assert f"{bad}:8: column 'n'" in done.stderr and "not-a-number" in done.stderr, done.stderr
    # stdin, NDJSON named by --format
    piped = _load(
        server, "--format", "ndjson", "clicks", "-", stdin=json.dumps(_row(20_000)) + "\n"
    )
    assert piped.returncode == 0 and json.loads(piped.stdout)["rows"] == 1, piped.stderr
