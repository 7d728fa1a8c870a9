"""The catalog: streams (with the user's original SQL), columns, dependencies and runs.

Plans are never stored: every derived form is recomputed from the stored SQL by the
rewriter, one deterministic function, so a new Strata version re-derives them consistently.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from psycopg import sql
from sqlalchemy.dialects import postgresql

from rewriter import StreamPlan, rewrite
from rewriter.errors import InvalidSQL
from rewriter.naming import (
    CATALOG_SCHEMA,
    INTERNAL_SCHEMA,
    join_archive_table,
    partial_archive_table,
    raw_archive_table,
)
from rewriter.plan import (
    JoinStreamPlan,
    OnReadStreamPlan,
    ParallelAggregatePlan,
    ProjectionStreamPlan,
    RawStreamPlan,
    ReadJoinStreamPlan,
    ReadUnionStreamPlan,
    SerialAggregatePlan,
)
from rewriter.resolve_window import GLOBAL_WINDOW_US
from rewriter.sql_functions import SqlFunction, is_function_json
from rewriter.tables import TableColumn, TableSchema

# The streams a batch of runs computes something for (partial rows, mapped rows, joined
# rows), and the serial ones on top.
ComputedPlan = ProjectionStreamPlan | ParallelAggregatePlan | SerialAggregatePlan | JoinStreamPlan

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"
# The PostgreSQL functions and aggregates the plans rely on, installed at every start. In a
# checkout (and an editable install) beside server/; a wheel ships it there as package data.
SQL_DIR = Path(__file__).resolve().parent.parent / "sql"
# Held while migrating and installing: two servers starting on one database wait in turn.
MIGRATION_LOCK = 4242001

metadata = sa.MetaData(schema=CATALOG_SCHEMA)
streams = sa.Table(
    "streams",
    metadata,
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("kind", sa.Text),
    sa.Column("sql", sa.Text),
    sa.Column("created_seq", sa.BigInteger),
    sa.Column("created_at", sa.DateTime(timezone=True)),
    sa.Column("tables", postgresql.JSONB),
    sa.Column("version", sa.Integer),
)
# The definitions a stream had before an ALTER STREAM replaced them (migration 0015).
stream_history = sa.Table(
    "stream_history",
    metadata,
    sa.Column("stream", sa.Text, primary_key=True),
    sa.Column("version", sa.Integer, primary_key=True),
    sa.Column("sql", sa.Text),
    sa.Column("defined_at", sa.DateTime(timezone=True)),
    sa.Column("replaced_at", sa.DateTime(timezone=True)),
)
# Per stream, its last ALTER STREAM (server/alter.py): the new definition, the streams
# built beside it ([name built under, name swapped to], in creation order), the path taken
# and the state ("building" until the swap, then "done").
alters = sa.Table(
    "alters",
    metadata,
    sa.Column("stream", sa.Text, primary_key=True),
    sa.Column("version", sa.Integer),
    sa.Column("sql", sa.Text),
    sa.Column("members", postgresql.JSONB),
    sa.Column("path", sa.Text),
    sa.Column("state", sa.Text),
    sa.Column("started_at", sa.DateTime(timezone=True)),
    sa.Column("swapped_at", sa.DateTime(timezone=True)),
)
stream_columns = sa.Table(
    "stream_columns",
    metadata,
    sa.Column("stream", sa.Text, primary_key=True),
    sa.Column("ordinal", sa.Integer, primary_key=True),
    sa.Column("name", sa.Text),
    sa.Column("type", sa.Text),
)
stream_dependencies = sa.Table(
    "stream_dependencies",
    metadata,
    sa.Column("stream", sa.Text, primary_key=True),
    sa.Column("depends_on", sa.Text, primary_key=True),
)
runs = sa.Table(
    "runs",
    metadata,
    sa.Column("seq", sa.BigInteger, primary_key=True),
    sa.Column("run_id", sa.Text),
    sa.Column("stream", sa.Text),
    sa.Column("status", sa.Text),
    sa.Column("rows", sa.BigInteger),
    sa.Column("error", sa.Text),
    sa.Column("spool_path", sa.Text),
    sa.Column("received_at", sa.DateTime(timezone=True)),
    sa.Column("committed_at", sa.DateTime(timezone=True)),
    # Migration 0016: the position of the run in this node's commit log (replication), and
    # the DDL position of its stream's CREATE in a cluster.
    sa.Column("commit_pos", sa.BigInteger),
    sa.Column("origin", sa.BigInteger),
    sa.Column("digest", sa.Text),
    # Migration 0019: the server that finishes a pending run, when several share the
    # database (server/sharing/); NULL on a server alone.
    sa.Column("owner", sa.Text),
)

stream_progress = sa.Table(
    "stream_progress",
    metadata,
    sa.Column("stream", sa.Text, primary_key=True),
    sa.Column("watermark", sa.DateTime(timezone=True)),
    sa.Column("rows", sa.BigInteger),
    sa.Column("runs", sa.BigInteger),
    sa.Column("late_rows", sa.BigInteger),
    sa.Column("late_runs", sa.BigInteger),
    sa.Column("max_lateness", sa.Interval),
    sa.Column("last_late_at", sa.DateTime(timezone=True)),
)
window_lateness = sa.Table(
    "window_lateness",
    metadata,
    sa.Column("stream", sa.Text, primary_key=True),
    sa.Column("window_start", sa.DateTime(timezone=True), primary_key=True),
    sa.Column("late_rows", sa.BigInteger),
    sa.Column("late_runs", sa.BigInteger),
    sa.Column("last_late_at", sa.DateTime(timezone=True)),
)
# Per stream and pane (a window of a TUMBLE stream): the raw rows its runs brought and
# when a run last changed it (server/ingest/progress.py). rows is NULL for the windows a
# database had before it kept these (migration 0014).
window_changes = sa.Table(
    "window_changes",
    metadata,
    sa.Column("stream", sa.Text, primary_key=True),
    sa.Column("window_start", sa.DateTime(timezone=True), primary_key=True),
    sa.Column("rows", sa.BigInteger),
    sa.Column("runs", sa.BigInteger),
    sa.Column("last_changed_at", sa.DateTime(timezone=True)),
)
# Per windowed aggregate stream, what public.strata_window_status needs of its plan: its
# window, the stream whose panes place rows into its windows (itself, or a serial stream's
# source) and its raw sources (the watermarks that close its windows).
stream_windows = sa.Table(
    "stream_windows",
    metadata,
    sa.Column("stream", sa.Text, primary_key=True),
    sa.Column("size_us", sa.BigInteger, nullable=False),
    sa.Column("slide_us", sa.BigInteger, nullable=False),
    sa.Column("placed_by", sa.Text),
    sa.Column("pane_us", sa.BigInteger),
    sa.Column("raw_sources", postgresql.ARRAY(sa.Text), nullable=False),
)

backfills = sa.Table(
    "backfills",
    metadata,
    sa.Column("stream", sa.Text, primary_key=True),
    sa.Column("total_rows", sa.BigInteger),
    sa.Column("done_rows", sa.BigInteger),
    sa.Column("started_at", sa.DateTime(timezone=True)),
    sa.Column("finished_at", sa.DateTime(timezone=True)),
)
backfill_runs = sa.Table(
    "backfill_runs",
    metadata,
    sa.Column("stream", sa.Text, primary_key=True),
    sa.Column("run", sa.BigInteger, primary_key=True),
    sa.Column("source", sa.Text),
    sa.Column("rows", sa.BigInteger),
)

serial_progress = sa.Table(
    "serial_progress",
    metadata,
    sa.Column("stream", sa.Text, primary_key=True),
    sa.Column("materialized_until", sa.DateTime(timezone=True)),
    sa.Column("windows", sa.BigInteger),
    sa.Column("updated_at", sa.DateTime(timezone=True)),
)
corrections = sa.Table(
    "corrections",
    metadata,
    sa.Column("stream", sa.Text, primary_key=True),
    sa.Column("window_start", sa.DateTime(timezone=True), primary_key=True),
    sa.Column("late_rows", sa.BigInteger),
    sa.Column("noted_at", sa.DateTime(timezone=True)),
)
window_revisions = sa.Table(
    "window_revisions",
    metadata,
    sa.Column("stream", sa.Text, primary_key=True),
    sa.Column("window_start", sa.DateTime(timezone=True), primary_key=True),
    sa.Column("revisions", sa.BigInteger),
    sa.Column("repaired_at", sa.DateTime(timezone=True)),
)
# Per raw stream, bumped by each commit of its runs that feeds a join (server/ingest/joins.py).
source_versions = sa.Table(
    "source_versions",
    metadata,
    sa.Column("stream", sa.Text, primary_key=True),
    sa.Column("version", sa.BigInteger),
)

function_installs = sa.Table(
    "function_installs",
    metadata,
    sa.Column("seq", sa.BigInteger, primary_key=True),
    sa.Column("sha256", sa.Text),
    sa.Column("installed_at", sa.DateTime(timezone=True)),
)


def sqlalchemy_url(database_url: str) -> str:
    """postgresql://... as psql spells it -> the SQLAlchemy URL for the psycopg 3 driver."""
    for prefix in ("postgresql://", "postgres://"):
        if database_url.startswith(prefix):
            return "postgresql+psycopg://" + database_url[len(prefix) :]
    return database_url


def create_catalog_engine(database_url: str) -> sa.Engine:
    return sa.create_engine(
        sqlalchemy_url(database_url), pool_size=10, max_overflow=20, pool_pre_ping=True
    )


def migrate(engine: sa.Engine) -> None:
    """Apply the Alembic migrations in migrations/, then install the functions of sql/
    (both idempotent): what a server does at every start."""
    config = Config(str(MIGRATIONS_DIR / "alembic.ini"))
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    with engine.connect() as connection:
        connection.execute(sa.text("SELECT pg_advisory_lock(:lock)"), {"lock": MIGRATION_LOCK})
        try:
            before = _revision(connection)
            config.attributes["connection"] = connection
            command.upgrade(config, "head")
            # A migration may have (re)created functions from its frozen SQL (after a
            # downgrade, say), older than the sql/ the fingerprint names.
            install_functions(connection, force=_revision(connection) != before)
        finally:
            connection.rollback()
            connection.execute(
                sa.text("SELECT pg_advisory_unlock(:lock)"), {"lock": MIGRATION_LOCK}
            )
            connection.commit()


def _revision(connection: sa.Connection) -> str | None:
    context = MigrationContext.configure(connection, opts={"version_table_schema": CATALOG_SCHEMA})
    revision = context.get_current_revision()
    connection.commit()
    return revision


def read_sql() -> dict[str, str]:
    """The text of each file of sql/ by its name, in the order they are installed (later
    files use earlier ones)."""
    return {path.name: path.read_text() for path in sorted(SQL_DIR.glob("*.sql"))}


def sql_fingerprint(sources: dict[str, str]) -> str:
    """sha256 of the files' names and texts, in order."""
    digest = hashlib.sha256()
    for name, text in sources.items():
        for part in (name.encode(), text.encode()):
            digest.update(len(part).to_bytes(8, "big"))
            digest.update(part)
    return digest.hexdigest()


def install_functions(connection: sa.Connection, *, force: bool = False) -> bool:
    """(Re)install every function and aggregate of sql/ unless the same sql/ was the last
    installed (or ``force``); True if it installed. Call it with the migration lock held.

    The migrations create the functions as they were when each migration was written;
    this brings them to what sql/ holds now, so a database migrated by an earlier release
    gets every fix since. The files are run in one transaction together with the record of
    their fingerprint: a view never sees some functions replaced and others not, and a
    failed install leaves the previous functions and fingerprint, to be tried again at the
    next start. Every statement in sql/ is re-runnable (CREATE OR REPLACE); a change that
    CREATE OR REPLACE cannot make needs a migration (see sql/001_functions.sql).
    """
    sources = read_sql()
    if not sources:
        raise FileNotFoundError(f"no PostgreSQL functions to install in {SQL_DIR}")
    fingerprint = sql_fingerprint(sources)
    with connection.begin():
        last = connection.execute(
            sa.select(function_installs.c.sha256).order_by(function_installs.c.seq.desc()).limit(1)
        ).scalar()
        if last == fingerprint and not force:
            return False
        for text in sources.values():
            # Without parameters, so that psycopg sends the file as it is (several
            # statements, '%' in comments) in one simple query.
            connection.exec_driver_sql(text, execution_options={"no_parameters": True})
        connection.execute(sa.insert(function_installs).values(sha256=fingerprint))
    return True


@dataclass(frozen=True)
class StreamRecord:
    name: str
    kind: str
    sql: str
    created_at: datetime
    plan: StreamPlan
    version: int = 1


@dataclass(frozen=True)
class RunRecord:
    seq: int
    run_id: str
    stream: str
    status: str
    rows: int
    error: str | None
    spool_path: str | None

    def to_dict(self) -> dict[str, object]:
        return {
            "run_id": self.run_id,
            "stream": self.stream,
            "status": self.status,
            "rows": self.rows,
            "error": self.error,
        }


class PlanCache:
    """Plans of all streams, recomputed from their SQL in creation order and memoised."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # By name, SQL and creation: a stream built on an altered one keeps its SQL, and
        # is recorded anew (server/alter.py) with the plan of the new definition below it.
        self._by_sql: dict[tuple[str, str, int], StreamPlan] = {}

    def load(self, connection: sa.Connection, *, versioned: bool = True) -> dict[str, StreamRecord]:
        """Every stream, in creation order. ``versioned=False`` for a catalog older than
        migration 0015 (the migrations before it read plans too): every version is 1."""
        version = streams.c.version if versioned else sa.literal(1).label("version")
        rows = connection.execute(
            sa.select(
                streams.c.name,
                streams.c.kind,
                streams.c.sql,
                streams.c.created_at,
                streams.c.tables,
                streams.c.created_seq,
                version,
            ).order_by(streams.c.created_seq)
        ).all()
        plans: dict[str, StreamPlan] = {}
        records: dict[str, StreamRecord] = {}
        with self._lock:
            for row in rows:
                # A plan depends on its sources' plans; those of the same SQL are the same.
                key = (row.name, row.sql, row.created_seq)
                plan = self._by_sql.get(key)
                if plan is None:
                    plan = rewrite(row.sql, plans, _tables(row.tables), _functions(row.tables))
                    self._by_sql[key] = plan
                plans[row.name] = plan
                records[row.name] = StreamRecord(
                    row.name, row.kind, row.sql, row.created_at, plan, row.version or 1
                )
        return records

    def hold(self, connection: sa.Connection, plan: StreamPlan) -> bool:
        """Lock ``plan``'s stream in the catalog (FOR SHARE, until the transaction ends) and
        say whether ``plan`` is still its plan. A worker's step starts with it: an ALTER's
        swap, which replaces the stream's row, waits for the steps in flight, and a step
        planned before a swap does nothing (the next pass plans anew)."""
        row = connection.execute(
            sa.select(streams.c.name, streams.c.sql, streams.c.created_seq)
            .where(streams.c.name == plan.name)
            .with_for_update(read=True)
        ).first()
        if row is None:
            return False
        with self._lock:
            held = self._by_sql.get((row.name, row.sql, row.created_seq))
        return held is not None and (held is plan or held == plan)


_TABLE_COLUMNS = sa.text(
    """
    SELECT a.attname AS name, format_type(a.atttypid, a.atttypmod) AS pg_type,
           array_position(k.indkey::int2[], a.attnum) AS key_position
    FROM pg_attribute a
    LEFT JOIN pg_index k ON k.indrelid = a.attrelid AND k.indisprimary
    WHERE a.attrelid = CAST(:relation AS regclass) AND a.attnum > 0 AND NOT a.attisdropped
    ORDER BY a.attnum
    """
)
_RELATION = sa.text(
    """
    SELECT n.nspname NOT IN (:internal, :catalog) AS usable,
           has_table_privilege(c.oid, 'SELECT') AS readable
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.oid = to_regclass(:relation) AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
    """
)


def read_tables(
    connection: sa.Connection, names: list[tuple[str | None, str]], streams: Mapping[str, object]
) -> dict[str, TableSchema]:
    """The PostgreSQL tables (and views) among ``names`` that are not streams: their columns
    and primary keys, by the name the statement uses. Strata's own schemas are not offered."""
    found: dict[str, TableSchema] = {}
    for schema, name in names:
        if schema is None and name in streams:
            continue
        relation = sql.Identifier(*([schema] if schema else []), name).as_string()
        found_relation = connection.execute(
            _RELATION,
            {"relation": relation, "internal": INTERNAL_SCHEMA, "catalog": CATALOG_SCHEMA},
        ).first()
        if found_relation is None or not found_relation.usable:
            continue
        if not found_relation.readable:
            raise InvalidSQL(
                f"Strata's PostgreSQL role may not read {relation}: GRANT SELECT ON {relation} "
                "TO the role in STRATA_DATABASE_URL (strata info shows it)"
            )
        rows = connection.execute(_TABLE_COLUMNS, {"relation": relation}).all()
        keyed = sorted(
            (r for r in rows if r.key_position is not None), key=lambda r: r.key_position
        )
        key = tuple(r.name for r in keyed)
        shown = f"{schema}.{name}" if schema else name
        found[shown] = TableSchema(
            name=shown,
            columns=tuple(TableColumn(r.name, r.pg_type) for r in rows),
            key=key,
        )
    return found


def stored_tables(stored: list[dict[str, object]] | None) -> dict[str, TableSchema]:
    """The tables a stream was planned against, as its catalog row keeps them."""
    return _tables(stored)


def stored_functions(stored: list[dict[str, object]] | None) -> dict[str, SqlFunction]:
    """The user functions a stream was planned with, as its catalog row keeps them."""
    return _functions(stored)


# The ``tables`` column keeps what a stream was planned against in PostgreSQL's catalog:
# the tables it joins, and the user functions it calls (entries of their own shape).
def _tables(stored: list[dict[str, object]] | None) -> dict[str, TableSchema]:
    kept = (t for t in stored or [] if not is_function_json(t))
    return {t.name: t for t in map(TableSchema.from_json, kept)}


def _functions(stored: list[dict[str, object]] | None) -> dict[str, SqlFunction]:
    kept = (f for f in stored or [] if is_function_json(f))
    return {f.name: f for f in map(SqlFunction.from_json, kept)}


def dependents(records: dict[str, StreamRecord], raw: str) -> list[ComputedPlan]:
    """Streams computed from the runs of the raw stream ``raw`` (parallel aggregates and the
    projections they read), directly or through roll-ups, in creation order, so every stream
    comes after the streams it reads."""
    return [
        r.plan
        for r in records.values()
        if isinstance(r.plan, ProjectionStreamPlan | ParallelAggregatePlan | JoinStreamPlan)
        and raw in r.plan.raw_sources
    ]


def archive_table(plan: ComputedPlan) -> str:
    """The internal table a batch's rows for ``plan`` go to: a join's rows or partial rows
    (a projection archives nothing)."""
    if isinstance(plan, JoinStreamPlan):
        return join_archive_table(plan.name)
    return partial_archive_table(plan.name)


def lineage(
    records: dict[str, StreamRecord], plan: ParallelAggregatePlan | SerialAggregatePlan
) -> list[ComputedPlan]:
    """The streams ``plan`` is computed through, from its raw sources (or from the join
    stream whose archived rows it reads) down to it."""
    chain: list[ComputedPlan] = [plan]
    while True:
        source = records[chain[0].dependencies[0]].plan
        if isinstance(source, RawStreamPlan | JoinStreamPlan):
            return chain
        assert not isinstance(
            source, ReadJoinStreamPlan | ReadUnionStreamPlan | OnReadStreamPlan
        ), "no stream is built on it"
        chain.insert(0, source)
        if isinstance(source, ProjectionStreamPlan):
            return chain


def row_source(
    records: dict[str, StreamRecord], plan: ParallelAggregatePlan | SerialAggregatePlan
) -> StreamPlan:
    """The stream whose rows ``plan``'s lineage starts from: a raw stream, or a join."""
    return records[lineage(records, plan)[0].dependencies[0]].plan


def through_join(
    records: dict[str, StreamRecord], plan: ParallelAggregatePlan | SerialAggregatePlan
) -> bool:
    """Whether ``plan``'s rows come through a join stream."""
    return isinstance(row_source(records, plan), JoinStreamPlan)


def insert_stream(
    connection: sa.Connection,
    plan: StreamPlan,
    sql: str,
    tables: Mapping[str, TableSchema] | None = None,
    functions: Mapping[str, SqlFunction] | None = None,
    version: int = 1,
) -> None:
    """Record a new stream; ``tables`` are the tables it was planned against (those it
    joins are kept with it), ``functions`` the user functions it calls (kept with it: their
    bodies are taken when it is created); ``version`` counts its definitions
    (server/alter.py)."""
    joined = plan.tables if isinstance(plan, ReadJoinStreamPlan | ParallelAggregatePlan) else ()
    kept = [tables[t].to_json() for t in joined] if tables and joined else []
    kept += [f.to_json() for f in (functions or {}).values()]
    connection.execute(
        sa.insert(streams).values(
            name=plan.name, kind=plan.kind, sql=sql, tables=kept or None, version=version
        )
    )
    if isinstance(plan, RawStreamPlan):
        connection.execute(
            sa.insert(stream_columns),
            [
                {"stream": plan.name, "ordinal": i, "name": c.name, "type": c.type.pg()}
                for i, c in enumerate(plan.columns)
            ],
        )
    else:
        connection.execute(
            sa.insert(stream_dependencies),
            [{"stream": plan.name, "depends_on": d} for d in plan.dependencies],
        )


def track_versions(connection: sa.Connection, sources: tuple[str, ...]) -> None:
    """Give the raw streams ``sources`` a commit version (server/ingest/joins.py), in the
    transaction that creates a join of them: every commit that feeds the join then finds
    its row to lock (a row a first commit inserted could not be locked by another)."""
    insert = sa.dialects.postgresql.insert(source_versions)
    connection.execute(
        insert.values([{"stream": s, "version": 0} for s in sources]).on_conflict_do_nothing()
    )


def lock_streams_to_drop(connection: sa.Connection, name: str) -> None:
    """Lock the catalog rows of ``name`` and of the streams made with it (named
    ``<name>__...``) FOR UPDATE, in name order, before a DROP takes any of their tables.
    A worker's step locks its stream's row FOR SHARE first and its tables after
    (PlanCache.hold): a DROP that took the tables first and the row after deadlocked with
    a step between the two (seen as a DROP failing while the reducer folded). So the DROP
    waits for the step in flight, and a step after it finds the stream gone."""
    connection.execute(
        sa.select(streams.c.name)
        .where(
            sa.or_(
                streams.c.name == name,
                streams.c.name.startswith(name + "__", autoescape=True),
            )
        )
        .order_by(streams.c.name)
        .with_for_update()
    ).all()


def delete_stream(connection: sa.Connection, name: str) -> None:
    """Forget the stream ``name`` (its history of definitions stays: see drop_history)."""
    connection.execute(sa.delete(runs).where(runs.c.stream == name))
    connection.execute(sa.delete(streams).where(streams.c.name == name))
    for kept in (window_changes, window_lateness, stream_windows):
        connection.execute(sa.delete(kept).where(kept.c.stream == name))


def drop_history(connection: sa.Connection, name: str) -> None:
    """Forget the definitions and the ALTERs of a dropped stream."""
    for kept in (stream_history, alters):
        connection.execute(sa.delete(kept).where(kept.c.stream == name))


# The catalog tables whose rows belong to a stream (by its name in "stream"), besides the
# stream's own row and its dependencies: what a swap moves from one name to another.
_STREAM_STATE = (
    stream_progress,
    window_lateness,
    window_changes,
    stream_windows,
    backfills,
    backfill_runs,
    serial_progress,
    corrections,
    window_revisions,
)


def move_stream_state(connection: sa.Connection, source: str, target: str) -> None:
    """Give the catalog rows of stream ``source`` to stream ``target`` (whose own were
    deleted), in the caller's transaction."""
    for kept in _STREAM_STATE:
        connection.execute(sa.update(kept).where(kept.c.stream == source).values(stream=target))
    connection.execute(
        sa.update(stream_windows)
        .where(stream_windows.c.placed_by == source)
        .values(placed_by=target)
    )


def forget_stream_state(connection: sa.Connection, name: str) -> None:
    """Delete the catalog rows of stream ``name`` besides its own row."""
    for kept in _STREAM_STATE:
        connection.execute(sa.delete(kept).where(kept.c.stream == name))


def execute_plan_sql(connection: sa.Connection, statement: str | sql.Composable) -> None:
    """Run a plan's SQL straight through psycopg, without parameters: it may hold a
    literal '%' (modulo), which parameter interpolation would take for a placeholder."""
    driver = connection.connection.driver_connection
    assert driver is not None
    driver.execute(statement)


def lock_raw_archives(connection: sa.Connection, sources: Iterable[str]) -> None:
    """SHARE locks on the raw archives of ``sources``: wait for the run commits in flight
    into them, and hold new ones back until the transaction ends."""
    for name in sources:
        execute_plan_sql(
            connection,
            sql.SQL("LOCK TABLE {} IN SHARE MODE").format(
                sql.Identifier(INTERNAL_SCHEMA, raw_archive_table(name))
            ),
        )


def lock_ddl(connection: sa.Connection) -> None:
    """One stream DDL at a time (until the transaction ends), so that a CREATE checks its
    name and sources, a DROP its dependents and an ALTER's swap its streams against a
    catalog no other DDL changes meanwhile: two DROPs of one name cannot both succeed, nor
    a DROP of a source slip between the planning and the commit of a stream derived from
    it."""
    connection.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": DDL_LOCK})


DDL_LOCK = 4242002  # beside MIGRATION_LOCK


def window_facts(plans: Mapping[str, StreamPlan], plan: StreamPlan) -> dict[str, object] | None:
    """The row of stream_windows for ``plan``, or None for a stream without windows."""
    if not isinstance(plan, ParallelAggregatePlan | SerialAggregatePlan):
        return None
    if plan.window_size_us == GLOBAL_WINDOW_US:  # an aggregate without a window
        return None
    placed_by: ParallelAggregatePlan | None = None
    if isinstance(plan, ParallelAggregatePlan):
        placed_by = plan
    else:
        source = plans.get(plan.source)
        if isinstance(source, ParallelAggregatePlan):
            placed_by = source
    return {
        "stream": plan.name,
        "size_us": plan.window_size_us,
        "slide_us": plan.window_slide_us,
        "placed_by": placed_by.name if placed_by else None,
        "pane_us": placed_by.pane_us if placed_by else None,
        "raw_sources": list(plan.raw_sources),
    }


def record_windows(connection: sa.Connection, plans: Mapping[str, StreamPlan]) -> None:
    """Write stream_windows for every windowed stream of ``plans`` (idempotent)."""
    rows = [f for p in plans.values() if (f := window_facts(plans, p)) is not None]
    if not rows:
        return
    insert = postgresql.insert(stream_windows).values(rows)
    connection.execute(
        insert.on_conflict_do_update(
            index_elements=[stream_windows.c.stream],
            set_={c: insert.excluded[c] for c in rows[0] if c != "stream"},
        )
    )


def _run(row: sa.Row) -> RunRecord:
    return RunRecord(
        row.seq, row.run_id, row.stream, row.status, row.rows, row.error, row.spool_path
    )


def get_run(connection: sa.Connection, run_id: str) -> RunRecord | None:
    row = connection.execute(sa.select(runs).where(runs.c.run_id == run_id)).first()
    return _run(row) if row else None


def get_run_by_seq(connection: sa.Connection, seq: int) -> RunRecord | None:
    row = connection.execute(sa.select(runs).where(runs.c.seq == seq)).first()
    return _run(row) if row else None


def next_run_seq(connection: sa.Connection) -> int:
    """A fresh run sequence number (gaps are harmless: numbers only need to be unique)."""
    return int(
        connection.execute(
            sa.text("SELECT nextval(pg_get_serial_sequence(:table, 'seq'))"),
            {"table": f"{CATALOG_SCHEMA}.runs"},
        ).scalar_one()
    )


def claim_run(
    connection: sa.Connection,
    seq: int,
    run_id: str,
    stream: str,
    rows: int,
    spool_path: str,
    origin: int | None = None,
    digest: str | None = None,
    owner: str | None = None,
) -> RunRecord | None:
    """Record a pending run; None if the run id is taken (the first one wins). ``origin``
    and ``digest``: in a cluster, the DDL position of the stream's CREATE and the hash of
    the run's rows (server/replication/digest.py); ``owner``: with servers sharing the
    database, the one that finishes the run (server/sharing/)."""
    statement = (
        sa.dialects.postgresql.insert(runs)
        .values(
            seq=seq,
            run_id=run_id,
            stream=stream,
            status="pending",
            rows=rows,
            spool_path=spool_path,
            origin=origin,
            digest=digest,
            owner=owner,
        )
        .on_conflict_do_nothing(index_elements=["run_id"])
        .returning(*runs.c)
    )
    row = connection.execute(statement).first()
    return _run(row) if row else None


def pending_runs(connection: sa.Connection) -> list[RunRecord]:
    rows = connection.execute(
        sa.select(runs).where(runs.c.status == "pending").order_by(runs.c.seq)
    ).all()
    return [_run(r) for r in rows]


def reject_run(connection: sa.Connection, seq: int, error: str) -> None:
    connection.execute(
        sa.update(runs)
        .where(runs.c.seq == seq, runs.c.status == "pending")
        .values(status="rejected", error=error)
    )
