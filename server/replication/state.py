"""What a node keeps of the cluster in its own catalog (migration 0016): its incarnation,
the DDL it applied, the owner's DDL log, each stream's origin, its cursor on each peer's
commit log, and the commit log it offers its peers."""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

from rewriter.naming import CATALOG_SCHEMA
from server.catalog import runs

cluster_state = sa.Table(
    "cluster_state",
    sa.MetaData(schema=CATALOG_SCHEMA),
    sa.Column("key", sa.Text, primary_key=True),
    sa.Column("value", sa.Text),
)
_meta = cluster_state.metadata
ddl_log = sa.Table(
    "ddl_log",
    _meta,
    sa.Column("pos", sa.BigInteger, primary_key=True),
    sa.Column("kind", sa.Text),
    sa.Column("stream", sa.Text),
    sa.Column("sql", sa.Text),
    sa.Column("at", sa.DateTime(timezone=True)),
)
stream_origins = sa.Table(
    "stream_origins",
    _meta,
    sa.Column("stream", sa.Text, primary_key=True),
    sa.Column("ddl_pos", sa.BigInteger),
)
peer_cursors = sa.Table(
    "peer_cursors",
    _meta,
    sa.Column("peer", sa.Text, primary_key=True),
    sa.Column("incarnation", sa.Text, primary_key=True),
    sa.Column("pos", sa.BigInteger),
    sa.Column("updated_at", sa.DateTime(timezone=True)),
)


@dataclass(frozen=True)
class DdlEntry:
    """One statement of the DDL owner's log: ``kind`` is create, alter or drop."""

    pos: int
    kind: str
    stream: str
    sql: str

    def to_dict(self) -> dict[str, object]:
        return {"pos": self.pos, "kind": self.kind, "stream": self.stream, "sql": self.sql}


@dataclass(frozen=True)
class Committed:
    """A run as a node's commit log offers it to its peers."""

    pos: int
    run_id: str
    stream: str
    seq: int
    rows: int
    origin: int | None  # the DDL position of its stream's CREATE
    digest: str | None  # of its rows (server/replication/digest.py)

    def to_dict(self) -> dict[str, object]:
        return {
            "pos": self.pos,
            "run_id": self.run_id,
            "stream": self.stream,
            "rows": self.rows,
            "origin": self.origin,
            "digest": self.digest,
        }


def _get(connection: sa.Connection, key: str) -> str | None:
    value = connection.execute(
        sa.select(cluster_state.c.value).where(cluster_state.c.key == key)
    ).scalar()
    return None if value is None else str(value)


def incarnation(connection: sa.Connection) -> str:
    """This data directory's identity: a node wiped and started again is a new one."""
    value = _get(connection, "incarnation")
    assert value is not None, "migration 0016 sets the incarnation"
    return value


def ddl_applied(connection: sa.Connection) -> int:
    return int(_get(connection, "ddl_applied") or 0)


def set_ddl_applied(connection: sa.Connection, pos: int) -> None:
    connection.execute(
        sa.update(cluster_state).where(cluster_state.c.key == "ddl_applied").values(value=str(pos))
    )


def append_ddl(connection: sa.Connection, kind: str, stream: str, text: str) -> int:
    """Give a statement its place in the cluster's one order of DDL (owner only)."""
    pos = connection.execute(
        sa.insert(ddl_log).values(kind=kind, stream=stream, sql=text).returning(ddl_log.c.pos)
    ).scalar_one()
    return int(pos)


def insert_ddl(connection: sa.Connection, entry: DdlEntry) -> None:
    """Keep an entry of the owner's log at its place (every node keeps a copy of the log,
    from which an owner started again empty takes it back)."""
    statement = sa.dialects.postgresql.insert(ddl_log).values(
        pos=entry.pos, kind=entry.kind, stream=entry.stream, sql=entry.sql
    )
    connection.execute(statement.on_conflict_do_nothing(index_elements=[ddl_log.c.pos]))


def continue_ddl_log(connection: sa.Connection) -> None:
    """Let the next appended entry follow the last one kept (after insert_ddl)."""
    connection.execute(
        sa.select(
            sa.func.setval(
                sa.func.pg_get_serial_sequence(f"{CATALOG_SCHEMA}.ddl_log", "pos"),
                sa.func.greatest(sa.select(sa.func.max(ddl_log.c.pos)).scalar_subquery(), 1),
            )
        )
    )


def ddl_after(connection: sa.Connection, pos: int, limit: int = 1000) -> list[DdlEntry]:
    rows = connection.execute(
        sa.select(ddl_log).where(ddl_log.c.pos > pos).order_by(ddl_log.c.pos).limit(limit)
    ).all()
    return [DdlEntry(r.pos, r.kind, r.stream, r.sql) for r in rows]


def ddl_logged(connection: sa.Connection) -> bool:
    return connection.execute(sa.select(sa.func.count()).select_from(ddl_log)).scalar_one() > 0


def set_origin(connection: sa.Connection, stream: str, pos: int | None) -> None:
    connection.execute(sa.delete(stream_origins).where(stream_origins.c.stream == stream))
    if pos is not None:
        connection.execute(sa.insert(stream_origins).values(stream=stream, ddl_pos=pos))


def origins(connection: sa.Connection) -> dict[str, int]:
    rows = connection.execute(sa.select(stream_origins)).all()
    return {r.stream: int(r.ddl_pos) for r in rows}


def cursor(connection: sa.Connection, peer: str, of_incarnation: str) -> int:
    value = connection.execute(
        sa.select(peer_cursors.c.pos).where(
            peer_cursors.c.peer == peer, peer_cursors.c.incarnation == of_incarnation
        )
    ).scalar()
    return int(value or 0)


def save_cursor(connection: sa.Connection, peer: str, of_incarnation: str, pos: int) -> None:
    statement = sa.dialects.postgresql.insert(peer_cursors).values(
        peer=peer, incarnation=of_incarnation, pos=pos, updated_at=sa.func.now()
    )
    connection.execute(
        statement.on_conflict_do_update(
            index_elements=[peer_cursors.c.peer, peer_cursors.c.incarnation],
            set_={"pos": pos, "updated_at": sa.func.now()},
        )
    )


def commit_position(connection: sa.Connection) -> int:
    """The last commit position of this node's log (0 before any run)."""
    return int(connection.execute(sa.select(sa.func.max(runs.c.commit_pos))).scalar() or 0)


def committed_after(connection: sa.Connection, pos: int, limit: int) -> list[Committed]:
    """The runs this node committed after position ``pos``, in commit order, with the
    origin of their stream (runs of a stream since dropped, even if one of the same name
    was created again, are left out)."""
    rows = connection.execute(
        sa.select(
            runs.c.commit_pos,
            runs.c.run_id,
            runs.c.stream,
            runs.c.seq,
            runs.c.rows,
            runs.c.origin,
            runs.c.digest,
        )
        .select_from(runs.outerjoin(stream_origins, stream_origins.c.stream == runs.c.stream))
        .where(
            runs.c.commit_pos > pos,
            runs.c.origin.is_not_distinct_from(stream_origins.c.ddl_pos),
        )
        .order_by(runs.c.commit_pos)
        .limit(limit)
    ).all()
    return [
        Committed(r.commit_pos, r.run_id, r.stream, r.seq, r.rows, r.origin, r.digest) for r in rows
    ]


def known_runs(connection: sa.Connection, run_ids: list[str]) -> dict[str, str | None]:
    """Which of ``run_ids`` this node has a record of (pending, committed or rejected),
    with the digest of its rows."""
    if not run_ids:
        return {}
    rows = connection.execute(
        sa.select(runs.c.run_id, runs.c.digest).where(runs.c.run_id.in_(run_ids))
    ).all()
    return {r.run_id: r.digest for r in rows}


run_conflicts = sa.Table(
    "run_conflicts",
    _meta,
    sa.Column("run_id", sa.Text, primary_key=True),
    sa.Column("peer", sa.Text, primary_key=True),
    sa.Column("kept", sa.Text),
    sa.Column("other", sa.Text),
    sa.Column("noted_at", sa.DateTime(timezone=True)),
)


def note_conflict(connection: sa.Connection, run_id: str, peer: str, kept: str, other: str) -> None:
    """Run ``run_id`` has rows of digest ``kept`` here and of ``other`` at ``peer``."""
    statement = sa.dialects.postgresql.insert(run_conflicts).values(
        run_id=run_id, peer=peer, kept=kept, other=other, noted_at=sa.func.now()
    )
    connection.execute(
        statement.on_conflict_do_update(
            index_elements=[run_conflicts.c.run_id, run_conflicts.c.peer],
            set_={"kept": kept, "other": other, "noted_at": sa.func.now()},
        )
    )


def conflicts_of(connection: sa.Connection, run_id: str) -> list[tuple[str, str, str]]:
    """(peer, digest kept here, the peer's digest) of each conflict noted for a run."""
    rows = connection.execute(
        sa.select(run_conflicts.c.peer, run_conflicts.c.kept, run_conflicts.c.other).where(
            run_conflicts.c.run_id == run_id
        )
    ).all()
    return [(r.peer, r.kept, r.other) for r in rows]


def unsettled(connection: sa.Connection) -> dict[str, tuple[str, dict[str, str]]]:
    """The committed runs in conflict whose rows here are not the cluster's choice (the
    smallest digest seen): run id -> (digest held here, each peer's digest)."""
    rows = connection.execute(
        sa.select(runs.c.run_id, runs.c.digest, run_conflicts.c.peer, run_conflicts.c.other)
        .select_from(run_conflicts.join(runs, runs.c.run_id == run_conflicts.c.run_id))
        .where(runs.c.status == "committed")
        .order_by(runs.c.run_id, run_conflicts.c.peer)
    ).all()
    found: dict[str, tuple[str, dict[str, str]]] = {}
    for row in rows:
        found.setdefault(row.run_id, (row.digest, {}))[1][row.peer] = row.other
    return {
        run_id: (held, others)
        for run_id, (held, others) in found.items()
        if min(held, *others.values()) != held
    }


def conflict_count(connection: sa.Connection) -> int:
    return int(
        connection.execute(
            sa.select(sa.func.count(sa.distinct(run_conflicts.c.run_id)))
        ).scalar_one()
    )


def committed_count(connection: sa.Connection) -> int:
    return int(
        connection.execute(
            sa.select(sa.func.count()).select_from(runs).where(runs.c.commit_pos.is_not(None))
        ).scalar_one()
    )


def committed_after_count(connection: sa.Connection, pos: int) -> int:
    """How many runs this node committed after position ``pos``."""
    return int(
        connection.execute(
            sa.select(sa.func.count()).select_from(runs).where(runs.c.commit_pos > pos)
        ).scalar_one()
    )
