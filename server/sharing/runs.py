"""Runs any server can finish: each pending run's body in PostgreSQL, and who owns it.

A server sharing the database records a run with itself as owner and the run's body (its
spool file's Parquet bytes) in run_bodies, in the transaction that records the run, before
the acknowledgment; the commit transaction deletes the body with the commit marker. Its
pending runs are then never only on its disk: when its heartbeat expires (servers.py's
row, kept by membership.py), ``claim`` gives them to the first live server that asks,
which writes each body into its own spool (``local``) and commits it as its own.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from pathlib import Path

import sqlalchemy as sa

from server import catalog
from server.catalog import RunRecord
from server.ingest.spool import Spool

log = logging.getLogger("strata.sharing")

servers = sa.Table(
    "servers",
    catalog.metadata,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("http", sa.Text),
    sa.Column("started_at", sa.DateTime(timezone=True)),
    sa.Column("heartbeat_at", sa.DateTime(timezone=True)),
    sa.Column("expires_at", sa.DateTime(timezone=True)),
)
run_bodies = sa.Table(
    "run_bodies",
    catalog.metadata,
    sa.Column("seq", sa.BigInteger, primary_key=True),
    sa.Column("body", sa.LargeBinary),
)


def alive() -> sa.Select[tuple[str]]:
    """The ids of the servers whose heartbeat has not expired (by PostgreSQL's clock)."""
    return sa.select(servers.c.id).where(servers.c.expires_at > sa.func.now())


class SharedRuns:
    """This server's side of run ownership: it is ``owner`` of the runs it records."""

    def __init__(self, engine: sa.Engine, owner: str, spool: Spool) -> None:
        self.engine = engine
        self.owner = owner
        self.spool = spool

    def store(self, connection: sa.Connection, seq: int, path: Path) -> None:
        """Keep run ``seq``'s body (its spool file) in the transaction that records it."""
        connection.execute(sa.insert(run_bodies).values(seq=seq, body=path.read_bytes()))

    def forget(self, connection: sa.Connection, seqs: Iterable[int]) -> None:
        """Drop the bodies of runs committed or rejected in ``connection``'s transaction."""
        connection.execute(sa.delete(run_bodies).where(run_bodies.c.seq.in_(list(seqs))))

    def claim(self) -> list[int]:
        """Take the pending runs no live server owns (their server died or left, or they
        come from before the database was shared); their sequence numbers."""
        runs = catalog.runs
        with self.engine.begin() as connection:
            claimed = (
                connection.execute(
                    sa.update(runs)
                    .where(
                        runs.c.status == "pending",
                        sa.or_(runs.c.owner.is_(None), runs.c.owner.not_in(alive())),
                    )
                    .values(owner=self.owner)
                    .returning(runs.c.seq)
                )
                .scalars()
                .all()
            )
        if claimed:
            log.info("claimed %d pending runs of servers no longer alive", len(claimed))
        return sorted(claimed)

    def local(self, run: RunRecord) -> RunRecord:
        """``run`` with a spool file of this server's: its own, or one written from the body
        kept in PostgreSQL (a run claimed from another server). A run with neither is
        returned as it is (the pipeline rejects it as lost)."""
        if run.spool_path and self.spool.holds(run.spool_path):
            return run
        with self.engine.connect() as connection:
            body = connection.execute(
                sa.select(run_bodies.c.body).where(run_bodies.c.seq == run.seq)
            ).scalar_one_or_none()
        if body is None:
            return run
        path = str(self.spool.restore(run.seq, body))
        with self.engine.begin() as connection:
            connection.execute(
                sa.update(catalog.runs)
                .where(catalog.runs.c.seq == run.seq, catalog.runs.c.status == "pending")
                .values(spool_path=path)
            )
        return dataclasses.replace(run, spool_path=path)
