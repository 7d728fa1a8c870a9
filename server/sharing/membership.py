"""This server among the others over one PostgreSQL: its heartbeat, the leases of the
background jobs it runs, and the runs of the servers that died.

Every third of the lease duration, one thread (``Membership``) pushes this server's
expiry forward, renews the leases it holds and takes those that are free or expired
(one statement), then claims the pending runs of servers no longer alive and hands them
to the ingest pipeline. A worker asks ``holds(job)`` before each pass and each step, and
``fence`` inside each step's transaction before it commits.
"""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timedelta

import sqlalchemy as sa
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy.dialects import postgresql

from server import catalog
from server.sharing.runs import SharedRuns, alive, servers
from server.workers.loop import Background

leases = sa.Table(
    "leases",
    catalog.metadata,
    sa.Column("job", sa.Text, primary_key=True),
    sa.Column("holder", sa.Text),
    sa.Column("taken_at", sa.DateTime(timezone=True)),
    sa.Column("expires_at", sa.DateTime(timezone=True)),
)
# Of the lease duration: how often the heartbeat renews, and how much of it this server
# trusts a renewal for (the rest absorbs a slow statement's return).
RENEW_SHARE = 1 / 3
TRUST_SHARE = 0.9
# Of the lease duration: how long before its lease expires a step may still commit (see
# ``fence``); a commit takes far less.
FENCE_SHARE = 1 / 6
# Lease durations after its expiry that a dead server is still listed (GET /info).
FORGET_AFTER = 30


def new_server_id() -> str:
    """A fresh id per start: a restarted server is a new one, which finds its previous
    incarnation's runs among those of dead servers."""
    return f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"


class Membership(Background):
    """The heartbeat of server ``runs.owner``, the leases of ``jobs`` it runs, and the
    claim of dead servers' runs (given to ``resume``). ``taken(job)`` is called when this
    server takes a lease it did not hold: that worker's pass should start now."""

    name = "membership"

    def __init__(
        self,
        engine: sa.Engine,
        runs: SharedRuns,
        *,
        http: str,
        jobs: Iterable[str],
        lease_duration: float,
        resume: Callable[[list[int]], None],
        taken: Callable[[str], None],
    ) -> None:
        super().__init__()
        self.engine = engine
        self.runs = runs
        self.server_id = runs.owner
        self.http = http
        self.jobs = sorted(jobs)
        self.lease_duration = lease_duration
        self.resume = resume
        self.taken = taken
        self._trusted_until: dict[str, float] = {}  # by job, time.monotonic()

    def holds(self, job: str) -> bool:
        """Whether this server holds ``job``'s lease now (no query: the last renewal's)."""
        return self._trusted_until.get(job, 0.0) > time.monotonic()

    def fence(self, connection: sa.Connection, job: str) -> bool:
        """In a step's transaction, just before it commits: whether this server still holds
        ``job``'s lease, with at least FENCE_SHARE of the lease left by the clock now. No
        other server takes a lease before it expires, so a step that passes commits while
        its job is still this server's; one that fails rolls back (a server paused past its
        lease cannot write over its successor's work)."""
        margin = timedelta(seconds=self.lease_duration * FENCE_SHARE)
        held = connection.execute(
            sa.select(leases.c.job).where(
                leases.c.job == job,
                leases.c.holder == self.server_id,
                leases.c.expires_at > sa.func.clock_timestamp() + margin,
            )
        ).first()
        return held is not None

    def join(self) -> list[int]:
        """Announce this server and take the leases free; the pending runs it claimed from
        servers no longer alive (before this server takes any run of its own)."""
        self.beat()
        return self.runs.claim()

    def beat(self) -> None:
        """Push this server's expiry forward, renew and take leases."""
        started = time.monotonic()
        expiry = sa.func.now() + timedelta(seconds=self.lease_duration)
        with self.engine.begin() as connection:
            beat = postgresql.insert(servers).values(
                id=self.server_id, http=self.http, expires_at=expiry
            )
            connection.execute(
                beat.on_conflict_do_update(
                    index_elements=[servers.c.id],
                    set_={"heartbeat_at": sa.func.now(), "expires_at": expiry},
                )
            )
            held = set(self._take(connection, expiry)) if self.jobs else set()
        trusted = started + self.lease_duration * TRUST_SHARE
        for job in self.jobs:
            if job not in held:
                self._trusted_until.pop(job, None)
                continue
            new = not self.holds(job)
            self._trusted_until[job] = trusted
            if new:
                self.log.info("took the lease of %s", job)
                self.taken(job)

    def _take(self, connection: sa.Connection, expiry: sa.ColumnElement[datetime]) -> list[str]:
        """Renew the leases this server holds and take the free or expired ones, in one
        statement: a lease changes holder only when it is free or has expired."""
        rows = [
            {"job": job, "holder": self.server_id, "taken_at": sa.func.now(), "expires_at": expiry}
            for job in self.jobs
        ]
        take = postgresql.insert(leases).values(rows)
        mine = leases.c.holder == take.excluded.holder
        statement = take.on_conflict_do_update(
            index_elements=[leases.c.job],
            set_={
                "holder": take.excluded.holder,
                "expires_at": take.excluded.expires_at,
                "taken_at": sa.case((mine, leases.c.taken_at), else_=take.excluded.taken_at),
            },
            where=sa.or_(mine, leases.c.holder.is_(None), leases.c.expires_at <= sa.func.now()),
        ).returning(leases.c.job)
        return list(connection.execute(statement).scalars())

    def _loop(self) -> None:
        while not self._stopping.wait(self.lease_duration * RENEW_SHARE):
            try:
                self.beat()
                claimed = self.runs.claim()
                if claimed:
                    self.resume(claimed)
                self._forget_dead()
            except Exception as error:  # PostgreSQL away: the leases lapse, and come back
                first = (str(error).strip().splitlines() or [type(error).__name__])[0]
                self.log.warning("heartbeat failed: %s", first)

    def _forget_dead(self) -> None:
        """Drop the rows of servers dead for a while whose runs were all claimed (each
        start is a new server: without this, restarts would pile up)."""
        runs = catalog.runs
        owners = sa.select(runs.c.owner).where(
            runs.c.status == "pending", runs.c.owner.is_not(None)
        )
        with self.engine.begin() as connection:
            connection.execute(
                sa.delete(servers).where(
                    servers.c.expires_at
                    < sa.func.now() - timedelta(seconds=FORGET_AFTER * self.lease_duration),
                    servers.c.id.not_in(owners),
                )
            )

    def leave(self) -> None:
        """Stop the heartbeat and give the leases back; the pending runs left go to the
        next server that beats. Called once this server's workers and pipeline stopped."""
        self.stop(timeout=5.0)
        self._trusted_until.clear()
        try:
            with self.engine.begin() as connection:
                connection.execute(
                    sa.update(leases)
                    .where(leases.c.holder == self.server_id)
                    .values(holder=None, expires_at=None)
                )
                connection.execute(sa.delete(servers).where(servers.c.id == self.server_id))
        except sa.exc.OperationalError as error:  # PostgreSQL away: they simply expire
            first = (str(error.orig).strip().splitlines() or ["unreachable"])[0]
            self.log.warning("could not give the leases back (%s); they expire", first)


class LeaseCollector(Collector):
    """/metrics of a server sharing the database: the jobs whose lease it holds now, and
    how many servers are alive, at each scrape."""

    def __init__(self, membership: Membership) -> None:
        self.membership = membership

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        held = GaugeMetricFamily(
            "strata_lease_held",
            "1 if this server holds the job's lease (runs the job) now, else 0.",
            labels=["job"],
        )
        for job in self.membership.jobs:
            held.add_metric([job], 1.0 if self.membership.holds(job) else 0.0)
        yield held
        live = GaugeMetricFamily(
            "strata_servers_alive", "Servers sharing this database whose heartbeat is live."
        )
        try:
            with self.membership.engine.connect() as connection:
                count = connection.execute(
                    sa.select(sa.func.count()).select_from(alive().subquery())
                ).scalar_one()
        except sa.exc.OperationalError:  # PostgreSQL away: the gauge is left out
            return
        live.add_metric([], float(count))
        yield live


def status(engine: sa.Engine) -> dict[str, object]:
    """The servers sharing the database (alive or not yet forgotten) and who holds which
    job's lease until when: GET /info's ``servers`` and ``leases``."""
    with engine.connect() as connection:
        live = set(connection.execute(alive()).scalars())
        found = connection.execute(sa.select(servers).order_by(servers.c.started_at)).all()
        held = connection.execute(sa.select(leases).order_by(leases.c.job)).all()
    return {
        "servers": [
            {
                "id": row.id,
                "http": row.http,
                "started_at": row.started_at.isoformat(),
                "heartbeat_at": row.heartbeat_at.isoformat(),
                "alive": row.id in live,
            }
            for row in found
        ],
        "leases": {
            row.job: {
                "holder": row.holder,
                "expires_at": row.expires_at.isoformat() if row.expires_at else None,
                "holder_alive": row.holder in live,
            }
            for row in held
        },
    }
