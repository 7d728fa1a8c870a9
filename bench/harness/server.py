"""``strata up`` as the benchmarks run it: a real subprocess on a free port and a data dir
of the benchmark's (embedded PostgreSQL, local Spark), healthy and done with its start-up
Spark warm-up (STRATA_SPARK_WARMUP) before it is used, stopped with SIGTERM and required to
exit cleanly; its log is ``<data dir>/server.log``."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.harness.errors import BenchError
from bench.harness.results import Timing
from server.net import free_port

STARTUP_TIMEOUT = 300.0
STOP_TIMEOUT = 60.0


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    url: str
    log_path: Path
    database_url: str = ""
    psql_url: str = ""  # the SQL port
    started_in: float = 0.0  # until GET /health answered
    warmed_in: float = 0.0  # then until Spark's start-up warm-up was done

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def start_server(data_dir: Path, env: dict[str, str] | None = None) -> Server:
    """`strata up` on free ports; returns once GET /health answers, with ``database_url``
    and ``psql_url`` (its SQL port) read from GET /info. ``env``: settings of its own."""
    port = free_port()
    log_path = data_dir / "server.log"
    inherited = {
        k: v
        for k, v in os.environ.items()
        if k not in ("STRATA_PORT", "STRATA_HOST", "STRATA_PG_PORT", "STRATA_PG_HOST")
    }
    env = inherited | (env or {})
    command = [
        sys.executable,
        "-m",
        "server.cli",
        "up",
        "--port",
        str(port),
        "--pg-port",
        "0",  # any free port: GET /info says which
        "--data-dir",
        str(data_dir / "strata"),
    ]
    started = time.monotonic()
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    server = Server(process, f"http://127.0.0.1:{port}", log_path)
    deadline = started + STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise BenchError(
                f"strata up exited with {process.returncode} while starting:\n{server.log_tail()}"
            )
        try:
            if httpx.get(f"{server.url}/health", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    else:
        stop_server(server)
        raise BenchError(
            f"strata up not healthy after {STARTUP_TIMEOUT:.0f}s:\n{server.log_tail()}"
        )
    server.started_in = time.monotonic() - started
    info = httpx.get(f"{server.url}/info", timeout=10).json()
    server.database_url, server.psql_url = info["database_url"], info["psql_url"]
    _wait_for_warmup(server, deadline)
    server.warmed_in = time.monotonic() - started - server.started_in
    return server


def start_timings(server: Server, address: str) -> list[Timing]:
    """The table's lines for the server's start: until healthy, then its Spark warm-up
    (neither is part of any timed phase)."""
    return [
        Timing("strata up", 0, server.started_in, address),
        Timing("strata up: Spark warm-up", 0, server.warmed_in, "STRATA_SPARK_WARMUP batches"),
    ]


def _wait_for_warmup(server: Server, deadline: float) -> None:
    """Wait until the server's start-up Spark warm-up is done (its gauge is 0): the
    benchmarks measure a server that has finished starting."""
    while time.monotonic() < deadline:
        if warmup_left(server) == 0:
            return
        time.sleep(0.25)
    stop_server(server)
    raise BenchError(f"Spark's warm-up not done after {STARTUP_TIMEOUT:.0f}s")


def warmup_left(server: Server) -> float:
    """Batches of the server's start-up Spark warm-up still to run (GET /metrics)."""
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        if family.name == "strata_spark_warmup_batches_left":
            return float(family.samples[0].value)
    raise BenchError("GET /metrics has no strata_spark_warmup_batches_left")


def stop_server(server: Server) -> tuple[int | None, float]:
    """SIGTERM, then wait; returns (exit code or None if it had to be killed, seconds)."""
    started = time.monotonic()
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGTERM)
    try:
        code: int | None = server.process.wait(STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()
        code = None
    return code, time.monotonic() - started


def stop_problems(code: int | None) -> list[str]:
    """What is wrong with the way the server ended after SIGTERM (``stop_server``'s exit
    code): anything but a graceful exit with code 0."""
    if code is None:
        return [f"server still running {STOP_TIMEOUT:.0f}s after SIGTERM; killed"]
    if code < 0:
        return [
            f"server died of signal {-code} after SIGTERM instead of shutting "
            "down gracefully (exit code 0)"
        ]
    if code != 0:
        return [f"server exit code {code} after SIGTERM"]
    return []


def pgdata(data_dir: Path) -> Path:
    """The embedded PostgreSQL's cluster directory of a server started on ``data_dir``."""
    return data_dir / "strata" / "postgres" / "pgdata"


def stop_orphaned_postgres(data_dir: Path) -> int | None:
    """Fast-shutdown the embedded PostgreSQL if it outlived `strata up`; returns its pid."""
    pid_file = pgdata(data_dir) / "postmaster.pid"
    try:
        pid = int(pid_file.read_text().split()[0])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        return None  # no pid file, or no such process: it stopped
    os.kill(pid, signal.SIGINT)  # PostgreSQL's "fast" shutdown
    deadline = time.monotonic() + STOP_TIMEOUT
    while pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    return pid


def log_problems(server: Server) -> list[str]:
    """Lines of the server log that report trouble (errors, tracebacks, warnings)."""
    return log_lines(server, (" ERROR ", " WARNING ", "Traceback", "Exception", " WARN "))


def log_lines(server: Server, words: tuple[str, ...]) -> list[str]:
    """Lines of the server log that hold any of ``words``."""
    text = server.log_path.read_text(errors="replace")
    return [line for line in text.splitlines() if any(w in line for w in words)]


def clean_up(server: Server | None, data_dir: Path, *, failed: bool, keep: bool) -> None:
    """Stop the server (and a PostgreSQL it left), show its log if the run failed, and remove
    the data dir unless it is to be kept."""
    if server is not None and server.process.poll() is None:
        stop_server(server)
    stop_orphaned_postgres(data_dir)
    if failed and server is not None:
        print(f"\nserver log tail ({server.log_path}):\n{server.log_tail()}", file=sys.stderr)
    if keep or failed:
        print(f"kept {data_dir}", file=sys.stderr)
    else:
        shutil.rmtree(data_dir, ignore_errors=True)
