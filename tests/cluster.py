"""Three `strata up` nodes on loopback, each link between two of them through a TcpProxy
the test controls, and clients that fail over between nodes and log every attempt: what the
cluster tests (tests/test_cluster.py) and bench/ha.py share."""

from __future__ import annotations

import contextlib
import shutil
import signal
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import psycopg
from psycopg import sql

from rewriter.naming import CATALOG_SCHEMA
from server.client import Attempt, FailoverClient
from tests.crash import Ledger, check_ledger
from tests.proxy import TcpProxy
from tests.test_e2e import Server, wait_until

NAMES = ("a", "b", "c")


class Cluster:
    """Nodes a, b, c (a orders DDL); node x reaches node y at proxy (x, y)."""

    def __init__(self, base: Path, *, env: dict[str, str] | None = None) -> None:
        self.base = base
        for name in NAMES:
            (base / name).mkdir(parents=True, exist_ok=True)
        self.nodes = {name: Server(base / name / "data") for name in NAMES}
        self.proxies = {
            (x, y): TcpProxy(self.nodes[y].port) for x in NAMES for y in NAMES if x != y
        }
        self.env = {
            "STRATA_DDL_OWNER": "a",
            "STRATA_REPLICATE_INTERVAL": "0.2",
            "STRATA_PEER_TIMEOUT": "2",
            "STRATA_REDUCE_INTERVAL": "1",
            "STRATA_SERIAL_INTERVAL": "1",
            "STRATA_SHUTDOWN_TIMEOUT": "15",
        } | (env or {})
        for name, node in self.nodes.items():
            node.extra_env |= self._env_of(name)

    def _env_of(self, name: str) -> dict[str, str]:
        peers = ",".join(self.proxies[(name, y)].url for y in NAMES if y != name)
        return self.env | {"STRATA_NODE": name, "STRATA_PEERS": peers}

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes.values()]

    def start(self, names: Iterable[str] = NAMES) -> None:
        """Start the nodes together; return once each answers /health."""
        names = list(names)
        for name in names:
            self.nodes[name].start(wait=False)
        for name in names:
            self._healthy(name)

    def _healthy(self, name: str) -> None:
        node = self.nodes[name]
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            assert node.process is not None and node.process.poll() is None, node.log.read_text()[
                -4000:
            ]
            try:
                if httpx.get(f"{node.url}/health", timeout=2).status_code == 200:
                    info = httpx.get(f"{node.url}/info", timeout=10).json()
                    node.database_url, node.psql_url = info["database_url"], info["psql_url"]
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise AssertionError(f"node {name} did not start:\n" + node.log.read_text()[-4000:])

    def kill(self, name: str) -> None:
        """kill -9 of the node's server, then of its PostgreSQL (immediate stop), which
        survives its server's death."""
        node = self.nodes[name]
        node.stop(signal.SIGKILL)
        node.close()
        # PostgreSQL's backends outlive their postmaster for a moment: kill them too, as a
        # dead machine would, and wait until they are gone.
        root = str(node.data_dir.resolve())
        left = []
        for process in psutil.process_iter(["cwd"]):
            cwd = process.info.get("cwd") or ""
            if cwd.startswith(root):
                with contextlib.suppress(psutil.Error):
                    process.kill()
                left.append(process)
        psutil.wait_procs(left, timeout=30)

    def wipe(self, name: str) -> None:
        """Kill the node and destroy its data directory: it starts again empty, a new
        incarnation under the same name, at the same ports."""
        self.kill(name)
        old = self.nodes[name]
        shutil.rmtree(old.data_dir)
        fresh = Server(old.data_dir)
        fresh.port, fresh.pg_port, fresh.extra_env = old.port, old.pg_port, old.extra_env
        fresh.log = old.log
        self.nodes[name] = fresh

    def cut(self, name: str, mode: str = "blackhole") -> None:
        """Partition ``name`` from the others, both ways (clients still reach it)."""
        for (x, y), proxy in self.proxies.items():
            if name in (x, y):
                proxy.set(mode)

    def heal(self) -> None:
        for proxy in self.proxies.values():
            proxy.set("pass")

    def close(self) -> None:
        for node in self.nodes.values():
            node.close()
        for proxy in self.proxies.values():
            proxy.close()

    def ddl(self, name: str, statement: str) -> httpx.Response:
        return httpx.post(f"{self.nodes[name].url}/streams", json={"sql": statement}, timeout=120)

    def status(self, name: str) -> dict:
        return httpx.get(f"{self.nodes[name].url}/cluster", timeout=10).json()  # type: ignore[no-any-return]


@dataclass
class Clients:
    """Clients that fail over between the nodes, posting runs under a Ledger and logging
    every attempt."""

    cluster: Cluster
    ledger: Ledger = field(default_factory=Ledger)
    attempts: list[Attempt] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def post(
        self,
        run_id: str,
        body: str,
        *,
        stream: str,
        start: int = 0,
        wait: bool = False,
        deadline: float = 120.0,
    ) -> dict[str, object]:
        with self.lock:
            self.ledger.bodies[run_id] = (stream, body)
        with FailoverClient(
            self.cluster.urls, timeout=10, deadline=deadline, on_attempt=self._logged
        ) as client:
            answer = client.post_run(stream, body, run_id=run_id, wait=wait, start=start)
        with self.lock:
            self.ledger.acknowledged.add(run_id)
        return answer

    def _logged(self, attempt: Attempt) -> None:
        with self.lock:
            self.attempts.append(attempt)


def committed_runs(database_url: str) -> dict[str, int]:
    """Run id -> how many times a node committed it (a set check counts, never assumes)."""
    with psycopg.connect(database_url) as connection:
        rows = connection.execute(
            sql.SQL("SELECT run_id, count(*) FROM {} WHERE status = 'committed' GROUP BY 1").format(
                sql.Identifier(CATALOG_SCHEMA, "runs")
            )
        ).fetchall()
    return {run_id: n for run_id, n in rows}


def caught_up(
    cluster: Cluster, runs: set[str], names: Iterable[str] = NAMES, timeout: float = 180
) -> None:
    """Wait until every node of ``names`` holds every run of ``runs`` (acknowledged runs,
    taken from the ledger at some moment): what GET /cluster shows as no run behind a
    peer, checked against the clients' ledger instead of the nodes' own counts."""
    for name in names:

        def holds(url: str = cluster.nodes[name].database_url) -> bool:
            return runs <= set(committed_runs(url))

        wait_until(holds, f"node {name} to hold the {len(runs)} runs acknowledged so far", timeout)


def converged(
    cluster: Cluster, ledger: Ledger, names: Iterable[str] = NAMES, timeout: float = 180
) -> None:
    """Wait until every node of ``names`` holds every acknowledged run, then the set check
    on each: lost (acknowledged, not committed there) empty, no duplicate, nothing that no
    client sent, every run's rows exact."""
    for name in names:
        node = cluster.nodes[name]
        caught_up(cluster, ledger.acknowledged, [name], timeout)
        present = committed_runs(node.database_url)
        lost = ledger.acknowledged - set(present)
        assert not lost, f"node {name} lost acknowledged runs {sorted(lost)}"
        twice = {r for r, n in present.items() if n > 1}
        assert not twice, f"node {name} committed runs twice: {sorted(twice)}"
        check_ledger(node.database_url, ledger)


def same_runs(cluster: Cluster, names: Iterable[str] = NAMES, timeout: float = 180) -> set[str]:
    """Wait until the nodes of ``names`` hold the same committed runs (the runs that were
    sent but never acknowledged included); returns that set."""
    names = list(names)
    found: list[set[str]] = []

    def agree() -> bool:
        found[:] = [set(committed_runs(cluster.nodes[n].database_url)) for n in names]
        return all(f == found[0] for f in found)

    wait_until(agree, f"nodes {names} to hold the same runs", timeout=timeout)
    return found[0]
