"""Strata's HTTP API as the benchmarks drive it: streams created, runs (CSV bodies) posted
from client threads, the clock stopped when every run is committed."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx

from bench.harness.data import Dataset
from bench.harness.errors import BenchError
from bench.harness.percentile import percentile
from bench.harness.results import Timing
from bench.harness.server import Server

HTTP_TIMEOUT = 900.0


def create_stream(client: httpx.Client, sql: str) -> None:
    """``POST /streams`` of ``sql``; anything but 201 Created is a BenchError."""
    response = client.post("/streams", json={"sql": sql})
    if response.status_code != 201:
        raise BenchError(f"creating stream failed ({sql}): {response.status_code} {response.text}")


@contextmanager
def http_clients(base_url: str) -> Iterator[Callable[[], httpx.Client]]:
    """One httpx.Client per thread (a client's connection pool is not shared)."""
    local = threading.local()
    made: list[httpx.Client] = []
    lock = threading.Lock()

    def get() -> httpx.Client:
        client = getattr(local, "client", None)
        if client is None:
            client = local.client = httpx.Client(base_url=base_url, timeout=HTTP_TIMEOUT)
            with lock:
                made.append(client)
        return client

    try:
        yield get
    finally:
        for client in made:
            client.close()


def post_runs(
    server: Server, data: Dataset, threads: int, mode: str, raw: str | Sequence[str]
) -> Timing:
    """Post every body of ``data`` as a run of ``raw`` (text/csv), or body i as a run of
    ``raw[i]`` when ``raw`` names a stream per body, from ``threads`` client threads (each
    takes the next body, so the runs start in order); the clock stops when every run is
    committed: with ``mode`` "wait" each request uses ``wait=true`` and returns once its run
    is committed, with "async" requests return on acceptance and the runs are polled until
    committed. The Timing's ``extra`` holds the request latencies' p50 and maximum."""
    wait = mode == "wait"
    streams = [raw] * len(data.bodies) if isinstance(raw, str) else list(raw)
    if len(streams) != len(data.bodies):
        raise ValueError(f"{len(streams)} streams for {len(data.bodies)} bodies")
    latencies: list[float] = []

    with http_clients(server.url) as client:

        def post(index: int) -> str:
            run_id = f"{streams[index]}-{index:05d}"
            started = time.monotonic()
            response = client().post(
                f"/streams/{streams[index]}/runs",
                params={"wait": "true" if wait else "false", "run_id": run_id},
                content=data.bodies[index],
                headers={"content-type": "text/csv"},
            )
            latencies.append(time.monotonic() - started)
            expected = 200 if wait else 202
            if response.status_code != expected:
                raise BenchError(f"run {run_id}: {response.status_code} {response.text}")
            result = response.json()
            if wait and result.get("rows") != data.rows_per_body[index]:
                raise BenchError(
                    f"run {run_id}: {result} (expected {data.rows_per_body[index]} rows)"
                )
            return run_id

        started = time.monotonic()
        with ThreadPoolExecutor(threads, thread_name_prefix="client") as pool:
            run_ids = list(pool.map(post, range(len(data.bodies))))
        accepted = time.monotonic() - started
        if not wait:
            poll_committed(client(), run_ids, data)
        seconds = time.monotonic() - started

    extra = {
        "accepted_s": accepted,
        "latency_p50_s": percentile(latencies, 0.5),
        "latency_max_s": max(latencies),
    }
    notes = f"{len(data.bodies)} runs, {threads} threads, wait={'true' if wait else 'false'}"
    return Timing("Strata HTTP ingest", data.rows, seconds, notes, extra)


def poll_committed(client: httpx.Client, run_ids: list[str], data: Dataset) -> None:
    """Poll ``GET /runs/{id}`` until every run is committed with its rows."""
    pending = dict(zip(run_ids, data.rows_per_body, strict=True))
    deadline = time.monotonic() + HTTP_TIMEOUT
    while pending:
        if time.monotonic() > deadline:
            raise BenchError(f"{len(pending)} runs still not committed after {HTTP_TIMEOUT}s")
        for run_id, rows in list(pending.items()):
            status = client.get(f"/runs/{run_id}").json()
            if status["status"] == "committed":
                if status["rows"] != rows:
                    raise BenchError(f"run {run_id}: {status} (expected {rows} rows)")
                del pending[run_id]
            elif status["status"] != "pending":
                raise BenchError(f"run {run_id}: {status}")
        if pending:
            time.sleep(0.05)
