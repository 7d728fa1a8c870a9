"""Several Strata servers over one PostgreSQL (STRATA_SHARED_DATABASE, server/sharing/).

In-process first: the leases alone (one holder at a time, taken over once the holder
stops beating), and a server that never beats (as good as dead) whose acknowledged runs
another server finishes from the bodies kept in PostgreSQL. Then real `strata up`
processes over one PostgreSQL: clients ingest while servers join, one is killed with
kill -9 holding runs and leases, another is added; after each, every acknowledged run is
committed exactly once, every view equals a batch query over the raw rows, and no lease is
held by a dead server.
"""

from __future__ import annotations

import functools
import itertools
import random
import threading
import time
from pathlib import Path

import httpx
import psycopg
import pytest
import sqlalchemy as sa
from psycopg import sql
from pyspark.sql import SparkSession

from rewriter.naming import CATALOG_SCHEMA
from rewriter.plan import StreamPlan
from server.catalog import PlanCache, create_catalog_engine, migrate
from server.ingest.spool import Spool
from server.settings import ALL_WORKERS, Settings
from server.sharing.membership import Membership
from server.sharing.runs import SharedRuns
from server.workers.backfill import wait_for as backfill_done
from server.workers.loop import LeaseLost, Worker
from tests.conftest import new_database, strata_client
from tests.crash import Ledger, arm, assert_pending_when_struck, fired
from tests.test_crash import DERIVED, RAW, _body, _check_archives
from tests.test_e2e import Server, wait_until
from tests.test_reducer import Raising

JOBS = ("reducer", "sink")
# Short leases, so that a takeover is seconds: the test waits for it.
LEASE = 2.0
# The in-process lease test's: a server trusts its lease for 0.9 of it after a renewal, so
# the test's first checks must come within that of the join. At 0.6 s they did not once,
# on two cores running two test processes (dev.py test); at 1.5 s a takeover still takes
# under three seconds.
SHORT_LEASE = 1.5


def _catalog(name: str) -> sql.Identifier:
    return sql.Identifier(CATALOG_SCHEMA, name)


def _member(engine: sa.Engine, name: str, spool: Path, lease: float) -> Membership:
    return Membership(
        engine,
        SharedRuns(engine, name, Spool(spool)),
        http=f"http://{name}",
        jobs=JOBS,
        lease_duration=lease,
        resume=lambda seqs: None,
        taken=lambda job: None,
    )


def test_servers_share_an_external_postgresql_and_are_not_a_cluster() -> None:
    alone = {"node": None, "peers": ()}
    url = "postgresql://strata@db/strata"
    assert Settings(shared_database=True, database_url=url, **alone).sharing_problem() is None
    embedded = Settings(shared_database=True, database_url=None, **alone)
    assert "STRATA_DATABASE_URL" in str(embedded.sharing_problem())
    clustered = Settings(shared_database=True, database_url=url, node="a")
    assert "pick one" in str(clustered.sharing_problem())
    assert Settings(shared_database=False).sharing_problem() is None


def _holders(url: str) -> dict[str, str | None]:
    with psycopg.connect(url) as connection:
        rows = connection.execute(
            sql.SQL("SELECT job, holder FROM {}").format(_catalog("leases"))
        ).fetchall()
    return dict(rows)


def test_a_lease_has_one_holder_and_moves_when_it_stops_beating(
    fresh_db: str, tmp_path: Path
) -> None:
    engine = create_catalog_engine(fresh_db)
    migrate(engine)
    first = _member(engine, "first", tmp_path / "1", SHORT_LEASE)
    second = _member(engine, "second", tmp_path / "2", SHORT_LEASE)
    try:
        first.join()
        second.join()
        assert _holders(fresh_db) == dict.fromkeys(JOBS, "first")
        assert all(first.holds(j) for j in JOBS) and not any(second.holds(j) for j in JOBS)
        first.start()
        second.start()
        # Both beat for a while: never do both believe they hold a job.
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            for job in JOBS:
                assert not (first.holds(job) and second.holds(job)), job
            time.sleep(0.01)
        assert all(first.holds(j) for j in JOBS)
        # The first dies (no more beats, nothing given back): the second takes over within
        # a lease and a renewal, and the first stops believing before that.
        first.stop()
        died = time.monotonic()
        wait_until(lambda: all(second.holds(j) for j in JOBS), "the takeover", timeout=10)
        took = time.monotonic() - died
        assert took <= SHORT_LEASE * 1.5 + 0.5, took
        assert not any(first.holds(j) for j in JOBS)
        assert _holders(fresh_db) == dict.fromkeys(JOBS, "second")
        # Leaving gives the leases back and removes the server at once.
        second.leave()
        assert _holders(fresh_db) == dict.fromkeys(JOBS, None)
        with psycopg.connect(fresh_db) as connection:
            left = connection.execute(
                sql.SQL("SELECT id FROM {}").format(_catalog("servers"))
            ).fetchall()
        assert left == [("first",)]  # dead, listed until forgotten
    finally:
        first.stop()
        second.stop()
        engine.dispose()


class _Writer(Worker):
    """A worker of job "reducer" whose step writes its server's name in a table of the
    test, in a step's transaction, and waits there until the test lets it commit."""

    name = "reducer"

    def __init__(self, engine: sa.Engine, server: str) -> None:
        super().__init__(engine, PlanCache(), interval=3600, batch=1)
        self.server = server
        self.entered, self.go_on = threading.Event(), threading.Event()

    def applies_to(self, plan: StreamPlan) -> bool:
        return True

    def step(self, plan: StreamPlan) -> int:
        with self.transaction() as connection:
            connection.execute(
                sa.text("INSERT INTO fenced_writes VALUES (:server)"), {"server": self.server}
            )
            self.entered.set()
            assert self.go_on.wait(60)
        return 1


def test_a_step_whose_lease_expired_meanwhile_does_not_commit(
    fresh_db: str, tmp_path: Path
) -> None:
    """A server paused in a step past its lease (another took the job meanwhile) must not
    commit the step: the fence, checked in the step's transaction before it commits."""
    engine = create_catalog_engine(fresh_db)
    migrate(engine)
    with psycopg.connect(fresh_db, autocommit=True) as connection:
        connection.execute("CREATE TABLE fenced_writes (server text)")
    first = _member(engine, "first", tmp_path / "1", 1.0)
    second = _member(engine, "second", tmp_path / "2", 1.0)
    writers = {m.server_id: _Writer(engine, m.server_id) for m in (first, second)}
    try:
        first.join()
        for member in (first, second):
            writers[member.server_id].start(
                functools.partial(member.holds, "reducer"),
                functools.partial(member.fence, job="reducer"),
            )
        # Held: the step commits.
        writer = writers["first"]
        writer.go_on.set()
        assert writer.step(None) == 1  # type: ignore[arg-type]
        # Paused in a step while its lease runs out and the second server takes the job.
        writer.entered.clear()
        writer.go_on.clear()
        paused = Raising(lambda: writer.step(None), "paused step")  # type: ignore[arg-type]
        paused.start()
        assert writer.entered.wait(30)
        time.sleep(1.2)  # past the lease: the first never beats again
        second.beat()
        assert second.holds("reducer") and _holders(fresh_db) == {
            "reducer": "second",
            "sink": "second",
        }
        writer.go_on.set()
        paused.join(60)
        assert isinstance(paused.error, LeaseLost), paused.error
        writers["second"].go_on.set()
        assert writers["second"].step(None) == 1  # type: ignore[arg-type]
        with psycopg.connect(fresh_db) as connection:
            written = connection.execute("SELECT server FROM fenced_writes").fetchall()
        assert sorted(written) == [("first",), ("second",)]  # not the paused step's
    finally:
        for worker in writers.values():
            worker.go_on.set()
            worker.stop()
        first.stop()
        second.stop()
        engine.dispose()


def test_a_dead_servers_runs_are_finished_by_another_from_postgresql(
    fresh_db: str, spark: SparkSession, tmp_path: Path
) -> None:
    """Server "down" records runs and never beats (it is as good as dead, and its spool
    files are deleted); server "up" claims them and commits them from their bodies in
    PostgreSQL. DDL made on either is seen by the other at once."""
    rng = random.Random(33)
    shared = {"shared_database": True, "lease_duration": LEASE, "workers": ("backfill", "reducer")}
    with (
        strata_client(fresh_db, spark, tmp_path / "up", **shared) as up,  # type: ignore[arg-type]
        strata_client(fresh_db, spark, tmp_path / "down", start=False, **shared) as down,  # type: ignore[arg-type]
    ):
        up.create(RAW)
        # DDL on one server, seen by the other at once: no cache to invalidate.
        assert down.client.get("/streams/ev").status_code == 200
        up.create(DERIVED["per_min"][0])
        assert down.client.get("/streams/per_min").json()["name"] == "per_min"
        # "down" beats once: alive for a lease, long enough to take runs as their owner.
        assert down.runtime.membership is not None
        down.runtime.membership.beat()
        ledger = Ledger()
        for i in range(4):
            run_id = f"down-{i}"
            body = _body(rng, 50)
            ledger.bodies[run_id] = ("ev", body)
            response = down.post_run("ev", body, run_id=run_id, wait=False)
            assert response.status_code == 202, response.text
            ledger.acknowledged.add(run_id)
        with psycopg.connect(fresh_db) as connection:
            owners = connection.execute(
                sql.SQL(
                    "SELECT r.owner, r.spool_path, b.seq IS NOT NULL FROM {} r LEFT JOIN {} b "
                    "USING (seq) WHERE r.status = 'pending'"
                ).format(_catalog("runs"), _catalog("run_bodies"))
            ).fetchall()
        down_id = down.runtime.service.shared.owner  # type: ignore[union-attr]
        assert len(owners) == 4 and {o for o, _, _ in owners} == {down_id}
        assert all(kept for _, _, kept in owners), "a pending run's body is in PostgreSQL"
        for _, path, _ in owners:  # only PostgreSQL has them now
            Path(path).unlink()
        for run_id in sorted(ledger.acknowledged):
            wait_until(
                lambda r=run_id: up.client.get(f"/runs/{r}").json()["status"] == "committed",
                f"run {run_id} committed by the live server",
                timeout=60,
            )
        _check_archives(fresh_db, ledger, ["per_min"])
        with psycopg.connect(fresh_db) as connection:
            bodies = connection.execute(
                sql.SQL("SELECT count(*) FROM {}").format(_catalog("run_bodies"))
            ).fetchone()
            paths = connection.execute(
                sql.SQL("SELECT DISTINCT owner FROM {} WHERE status = 'committed'").format(
                    _catalog("runs")
                )
            ).fetchall()
        assert bodies == (0,), "a commit deletes its runs' bodies"
        assert paths == [(up.runtime.service.shared.owner,)]  # type: ignore[union-attr]
        info = up.client.get("/info").json()
        assert info["leases"]["reducer"]["holder"] == up.runtime.service.shared.owner  # type: ignore[union-attr]
        metrics = up.client.get("/metrics").text
        assert 'strata_lease_held{job="reducer"} 1.0' in metrics
        assert "strata_servers_alive 1.0" in metrics  # "down" beat once, a lease ago
        assert 'strata_lease_held{job="reducer"} 0.0' in down.client.get("/metrics").text
        # DDL the other way: a stream created on "down" is on "up" at once.
        assert down.client.post("/streams", json={"sql": DERIVED["per_hour"][0]}).status_code == 201
        assert up.client.get("/streams/per_hour").status_code == 200


# ---- real processes ---------------------------------------------------------------------

SERVER_ENV = {
    "STRATA_SHARED_DATABASE": "true",
    "STRATA_LEASE_DURATION": str(LEASE),
    "STRATA_REDUCE_INTERVAL": "1",
    "STRATA_SERIAL_INTERVAL": "1",
    "STRATA_SHUTDOWN_TIMEOUT": "15",
}
# Seconds after a server's death by which its leases and runs must have moved: the lease,
# a renewal period of the taker, and a margin for a loaded 2-core machine.
TAKEOVER_LIMIT = LEASE + LEASE / 3 + 3.0


class Servers:
    """The `strata up` processes sharing one PostgreSQL, and those a load balancer sends
    clients to (the live ones)."""

    def __init__(self, base: Path, database_url: str) -> None:
        self.base = base
        self.database_url = database_url
        self.all: dict[str, Server] = {}
        self.live: list[str] = []
        self.ids: dict[str, str] = {}  # name -> server id (GET /info)
        self.lock = threading.Lock()

    def add(self, name: str, env: dict[str, str] | None = None) -> Server:
        (self.base / name).mkdir(parents=True)
        server = Server(
            self.base / name / "data",
            SERVER_ENV | {"STRATA_DATABASE_URL": self.database_url} | (env or {}),
        )
        self.all[name] = server
        return server

    def start(self, name: str) -> None:
        server = self.all[name]
        server.start()
        self.ids[name] = httpx.get(f"{server.url}/info", timeout=10).json()["server_id"]
        with self.lock:
            self.live.append(name)

    def drop(self, name: str) -> None:
        """The load balancer stops sending clients to ``name``."""
        with self.lock:
            if name in self.live:
                self.live.remove(name)

    def pick(self, rng: random.Random, avoid: str | None = None) -> str | None:
        with self.lock:
            choices = [n for n in self.live if n != avoid] or list(self.live)
        return rng.choice(choices) if choices else None

    def close(self) -> None:
        for server in self.all.values():
            server.close()


class Clients:
    """Clients posting runs with run ids through the load balancer, under a Ledger; a post
    that fails is sent again, same run id, to another server. ``paused`` holds them
    between posts."""

    def __init__(self, servers: Servers, count: int = 3) -> None:
        self.servers = servers
        self.ledger = Ledger()
        self.running = threading.Event()
        self.running.set()
        self.stopping = threading.Event()
        self.idle = [threading.Event() for _ in range(count)]
        self.threads = [
            threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(count)
        ]
        for thread in self.threads:
            thread.start()

    def _client(self, index: int) -> None:
        rng = random.Random(index)
        for n in itertools.count():
            self.idle[index].set()
            self.running.wait()
            if self.stopping.is_set():
                return
            self.idle[index].clear()
            run_id, body, last = f"c{index}-{n}", _body(rng, rng.randrange(20, 200)), None
            for _attempt in range(20):
                name = self.servers.pick(rng, avoid=last)
                if name is None:
                    time.sleep(0.2)
                    continue
                url = self.servers.all[name].url
                if self.ledger.post(url, run_id, body, wait=rng.random() < 0.3):
                    break
                last = name
                time.sleep(0.2)
            time.sleep(rng.uniform(0.05, 0.3))

    def pause(self) -> None:
        """Hold the clients once their posts in flight are answered."""
        self.running.clear()
        for idle in self.idle:
            assert idle.wait(180), "a client's post did not end"

    def resume(self) -> None:
        self.running.set()

    def stop(self) -> None:
        self.stopping.set()
        self.running.set()
        for thread in self.threads:
            thread.join(timeout=180)


def _statuses(url: str, run_ids: set[str]) -> dict[str, str]:
    with psycopg.connect(url) as connection:
        rows = connection.execute(
            sql.SQL("SELECT run_id, status FROM {} WHERE run_id = ANY(%s)").format(
                _catalog("runs")
            ),
            (sorted(run_ids),),
        ).fetchall()
    return dict(rows)


def _leases(url: str) -> dict[str, tuple[str | None, bool]]:
    """Job -> (holder, whether the holder's heartbeat is alive)."""
    with psycopg.connect(url) as connection:
        rows = connection.execute(
            sql.SQL(
                "SELECT l.job, l.holder, coalesce(s.expires_at > now(), false) FROM {} l "
                "LEFT JOIN {} s ON s.id = l.holder"
            ).format(_catalog("leases"), _catalog("servers"))
        ).fetchall()
    return {job: (holder, live) for job, holder, live in rows}


def _owned_pending(url: str, server_id: str) -> list[str]:
    with psycopg.connect(url) as connection:
        rows = connection.execute(
            sql.SQL("SELECT run_id FROM {} WHERE status = 'pending' AND owner = %s").format(
                _catalog("runs")
            ),
            (server_id,),
        ).fetchall()
    return [r for (r,) in rows]


def _checkpoint(servers: Servers, clients: Clients, streams: list[str], what: str) -> None:
    """With the clients held: every acknowledged run committed exactly once, nothing else
    archived, every view equal to a batch query over the raw rows, every lease held by a
    live server (each job has one: every server runs every worker)."""
    clients.pause()
    try:
        acknowledged = set(clients.ledger.acknowledged)
        wait_until(
            lambda: (
                set(_statuses(servers.database_url, acknowledged).values()) <= {"committed"}
                and len(_statuses(servers.database_url, acknowledged)) == len(acknowledged)
            ),
            f"every acknowledged run committed ({what})",
            timeout=180,
        )
        engine = create_catalog_engine(servers.database_url)
        try:
            for name in streams:
                backfill_done(engine, name, timeout=180)
        finally:
            engine.dispose()
        _check_archives(servers.database_url, clients.ledger, streams)
        leases = _leases(servers.database_url)
        assert set(leases) == set(ALL_WORKERS), (what, leases)
        assert all(live for _, live in leases.values()), (what, leases)
        assert {h for h, _ in leases.values()} <= {servers.ids[n] for n in servers.live}, (
            what,
            leases,
        )
    finally:
        clients.resume()


def _took_over(url: str, dead: str, since: float) -> float:
    """Seconds from ``since`` (time.time()) until no lease is held by server ``dead`` and
    it owns no pending run."""

    def moved() -> bool:
        leases = _leases(url)
        return all(h != dead and live for h, live in leases.values()) and not _owned_pending(
            url, dead
        )

    wait_until(moved, f"server {dead}'s leases and runs taken over", timeout=60)
    return time.time() - since


@pytest.mark.slow
@pytest.mark.e2e
def test_servers_join_die_and_are_added_under_ingest(pg_url: str, tmp_path: Path) -> None:
    streams = ["per_min", "per_hour"]
    with new_database(pg_url) as url:
        servers = Servers(tmp_path, url)
        clients: Clients | None = None
        try:
            # The first server dies by its own hand once run "doomed" is in its Spark job,
            # a second after runs posted meanwhile were acknowledged (server/faults.py).
            first = servers.add("one")
            arm(first, "in_spark:server:doomed")
            servers.start("one")
            ddl = httpx.Client(base_url=first.url, timeout=120)
            for statement in (RAW, DERIVED["per_min"][0]):
                ddl.post("/streams", json={"sql": statement}).raise_for_status()
            clients = Clients(servers)
            wait_until(lambda: len(clients.ledger.acknowledged) >= 10, "runs on one server")
            _checkpoint(servers, clients, streams[:1], "one server")

            # A second server joins; DDL made there is seen on the first at once.
            servers.add("two")
            servers.start("two")
            second = servers.all["two"]
            created = httpx.post(
                f"{second.url}/streams", json={"sql": DERIVED["per_hour"][0]}, timeout=120
            )
            assert created.status_code == 201, created.text
            assert httpx.get(f"{first.url}/streams/per_hour", timeout=10).status_code == 200
            seen = len(clients.ledger.acknowledged)
            wait_until(lambda: len(clients.ledger.acknowledged) >= seen + 10, "runs on two")
            _checkpoint(servers, clients, streams, "two servers")

            servers.add("three")
            servers.start("three")
            seen = len(clients.ledger.acknowledged)
            wait_until(lambda: len(clients.ledger.acknowledged) >= seen + 10, "runs on three")
            _checkpoint(servers, clients, streams, "three servers")

            # kill -9 of the first, holding every lease (it came first) and pending runs.
            one = servers.ids["one"]
            assert {h for h, _ in _leases(url).values()} == {one}
            doomed = _body(random.Random(7), 300)
            clients.ledger.bodies["doomed"] = ("ev", doomed)
            assert clients.ledger.post(first.url, "doomed", doomed, wait=False)
            strike = fired(first, "in_spark", "doomed", within=120)
            servers.drop("one")  # the load balancer's health check
            held = _owned_pending(url, one)
            assert "doomed" in held, held  # acknowledged, pending, owned by the dead server
            took = _took_over(url, one, strike["at"])
            print(f"takeover of a dead server's runs and leases: {took:.1f} s")
            assert took <= TAKEOVER_LIMIT, took
            assert first.process is not None and first.process.poll() is not None
            _checkpoint(servers, clients, streams, "the first killed")
            assert_pending_when_struck(first, strike, "doomed")  # committed by another

            # Another server is added; then the holder of the leases leaves in good order
            # (SIGTERM): its leases move at the others' next heartbeat.
            servers.add("four")
            servers.start("four")
            seen = len(clients.ledger.acknowledged)
            wait_until(lambda: len(clients.ledger.acknowledged) >= seen + 10, "runs on four")
            _checkpoint(servers, clients, streams, "a fourth added")
            holder = next(h for h, _ in _leases(url).values())
            leaving = next(n for n, i in servers.ids.items() if i == holder)
            servers.drop(leaving)
            assert servers.all[leaving].stop() == 0
            since = time.time()  # it gave its leases back on its way out
            assert _took_over(url, holder, since) <= LEASE / 3 + 3.0
            info = httpx.get(f"{servers.all['four'].url}/info", timeout=10).json()
            assert {s["id"] for s in info["servers"] if s["alive"]} == {
                servers.ids[n] for n in servers.live
            }, info["servers"]
            clients.stop()
            _checkpoint(servers, clients, streams, "one left")
            assert len(clients.ledger.acknowledged) > 50
        finally:
            if clients is not None:
                clients.stop()
            servers.close()
