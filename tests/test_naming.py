"""Derived names fit PostgreSQL's 63-byte identifiers (rewriter/naming.py), and existing
databases get them through migration 0008, which renames the objects PostgreSQL had cut."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
import sqlglot
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from pyspark.sql import SparkSession
from sqlglot import exp

from rewriter import (
    JoinStreamPlan,
    ParallelAggregatePlan,
    ProjectionStreamPlan,
    RawStreamPlan,
    SerialAggregatePlan,
    StreamPlan,
    naming,
    rewrite,
)
from server import catalog
from server.catalog import MIGRATIONS_DIR, create_catalog_engine
from server.engines.backend import SparkBackend
from server.runtime import assemble
from server.service import StrataService
from server.settings import Settings
from tests.conftest import strata_client
from tests.test_upgrade import WAITING_WINDOWS_SQL


def _longest(prefix: str) -> str:
    return naming.check_stream_name(f"{prefix}_".ljust(naming.MAX_STREAM_NAME, "x"))


RAW = _longest("raw")
PROJECTION = _longest("projection")
PARALLEL = _longest("parallel")
HOP = _longest("hop")
ROLLUP = _longest("rollup")
SERIAL = _longest("serial")
LONGEST_COLUMN = "v" * naming.MAX_IDENTIFIER
STATEMENTS = {
    RAW: f"CREATE STREAM {RAW} (campaign text, {LONGEST_COLUMN} bigint, t timestamptz) "
    "WITH (event_time = 't', retention = '30 days')",
    PROJECTION: f"CREATE STREAM {PROJECTION} AS SELECT campaign, {LONGEST_COLUMN} * 2 AS doubled, "
    f"t FROM {RAW}",
    PARALLEL: f"CREATE STREAM {PARALLEL} AS SELECT campaign, count(*) AS c, "
    f"sum({LONGEST_COLUMN}) AS {LONGEST_COLUMN}, window_end AS t "
    f"FROM TUMBLE({RAW}, t, INTERVAL '1 minute') GROUP BY campaign, window_end",
    HOP: f"CREATE STREAM {HOP} AS SELECT campaign, avg(doubled) AS a, window_start, window_end "
    f"FROM HOP({PROJECTION}, t, INTERVAL '1 minute', INTERVAL '5 minutes') "
    "GROUP BY campaign, window_start, window_end",
    ROLLUP: f"CREATE STREAM {ROLLUP} AS SELECT campaign, sum(c) AS c, window_end AS t "
    f"FROM TUMBLE({PARALLEL}, t, INTERVAL '5 minutes') GROUP BY campaign, window_end",
    SERIAL: f"CREATE STREAM {SERIAL} AS SELECT max(c) AS top, window_end AS t "
    f"FROM TUMBLE({PARALLEL}, t, INTERVAL '1 minute') GROUP BY window_end",
}
KINDS: dict[str, type] = {
    RAW: RawStreamPlan,
    PROJECTION: ProjectionStreamPlan,
    PARALLEL: ParallelAggregatePlan,
    HOP: ParallelAggregatePlan,
    ROLLUP: ParallelAggregatePlan,
    SERIAL: SerialAggregatePlan,
}


def _plans() -> dict[str, StreamPlan]:
    plans: dict[str, StreamPlan] = {}
    for name, statement in STATEMENTS.items():
        plans[name] = rewrite(statement, plans)
        assert isinstance(plans[name], KINDS[name]), name
    return plans


# A function a plan creates (rewriter.ddl.create_set_function): its schema, name and body.
FUNCTION = re.compile(
    r'CREATE OR REPLACE FUNCTION "([^"]+)"\."([^"]+)"\(\) .*? AS \$(\w+)\$ (.*) \$\3\$', re.S
)


def _created(statement: str) -> tuple[tuple[str, str], list[str]]:
    """The relation (schema, name) a CREATE statement makes, and the columns it gives it."""
    create = sqlglot.parse_one(statement, read="postgres")
    assert isinstance(create, exp.Create), statement
    target = create.this
    if isinstance(target, exp.Index):
        table = target.args["table"]
        return (table.db, target.name), []
    if isinstance(target, exp.Schema):
        return (target.this.db, target.this.name), [c.name for c in target.expressions]
    assert isinstance(target, exp.Table) and isinstance(create.expression, exp.Query)
    return (target.db, target.name), list(create.expression.named_selects)


JOIN = _longest("join")
JOIN_STATEMENT = (
    f"CREATE STREAM {JOIN} AS SELECT a.campaign, b.{LONGEST_COLUMN}, b.t FROM {RAW} a "
    f"JOIN {RAW} b ON a.{LONGEST_COLUMN} = b.{LONGEST_COLUMN} AND a.campaign = b.campaign"
)


@pytest.mark.parametrize("stream", [*STATEMENTS, JOIN], ids=lambda s: s.split("_")[0])
def test_every_name_a_plan_creates_fits_and_is_its_own(stream: str) -> None:
    plans = _plans()
    plans[JOIN] = rewrite(JOIN_STATEMENT, plans)
    assert isinstance(plans[JOIN], JoinStreamPlan)
    plan = plans[stream]
    relations = []
    for statement in plan.create_statements:
        function = FUNCTION.fullmatch(statement)
        if function is not None:  # sqlglot does not read CREATE FUNCTION; its body it does
            schema, name, _, body = function.groups()
            assert len(name.encode()) <= naming.MAX_IDENTIFIER, name
            statement = body
            relations.append(("function", schema, name))
        for identifier in sqlglot.parse_one(statement, read="postgres").find_all(exp.Identifier):
            assert len(identifier.name.encode()) <= naming.MAX_IDENTIFIER, identifier.name
        if function is not None or statement.startswith(TRIGGER):
            continue  # a trigger's name is its table's, not in the schema's namespace
        relation, columns = _created(statement)
        relations.append(relation)
        assert len(set(columns)) == len(columns), f"{relation}: {columns}"
    # Tables, indexes and views share one namespace per schema.
    assert len(set(relations)) == len(relations), relations


def test_fit_keeps_short_names_and_shortens_long_ones_apart() -> None:
    assert naming.fit("impsns__partial_window") == "impsns__partial_window"
    exact = "n" * naming.MAX_IDENTIFIER
    assert naming.fit(exact) == exact
    long_names = [f"{'a' * 60}_{suffix}" for suffix in ("window", "windows", "wind")]
    fitted = [naming.fit(name) for name in long_names]
    assert all(len(name.encode()) == naming.MAX_IDENTIFIER for name in fitted)
    assert len(set(fitted)) == len(fitted)  # PostgreSQL would have cut all three alike
    assert [naming.fit(name) for name in long_names] == fitted
    assert fitted[0].startswith("a" * 54 + "_")


def _alembic(connection: sa.Connection) -> Config:
    config = Config(str(MIGRATIONS_DIR / "alembic.ini"))
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["connection"] = connection
    return config


TRIGGER = "CREATE TRIGGER "
# What every aggregate stream shares: the list of waiting windows (migration 0030).
SHARED = {naming.WAITING_WINDOWS_TABLE, f"{naming.WAITING_WINDOWS_TABLE}_pkey"}


def _internal_relations(url: str) -> set[str]:
    with psycopg.connect(url) as connection:
        rows = connection.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s",
            (naming.INTERNAL_SCHEMA,),
        ).fetchall()
    return {row[0] for row in rows} - SHARED


def _planned_relations(plans: dict[str, StreamPlan]) -> set[str]:
    return {
        name
        for plan in plans.values()
        for statement in plan.create_statements
        if FUNCTION.fullmatch(statement) is None  # relations only
        and not statement.startswith(TRIGGER)
        for (schema, name), _ in [_created(statement)]
        if schema == naming.INTERNAL_SCHEMA
    }


STREAMS = f"{naming.CATALOG_SCHEMA}.streams"


@pytest.fixture
def old_database(
    fresh_db: str, spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """A database at the migration before 0008 whose streams were created by Strata as it
    was before naming shortened long names: PostgreSQL cut them to 63 bytes."""
    engine = create_catalog_engine(fresh_db)
    try:
        with engine.connect() as connection:
            config = _alembic(connection)
            before = ScriptDirectory.from_config(config).get_revision("0008").down_revision
            assert isinstance(before, str)
            command.upgrade(config, before)
            connection.commit()
        with monkeypatch.context() as old_naming:
            # (The consolidated tables of reduced windows and serial streams' functions are
            # newer than 0008: named as today.)
            fit = naming.fit
            old_naming.setattr(
                naming,
                "fit",
                lambda name: (
                    fit(name)
                    if "__reduced" in name or name.startswith(("strata_live_", "strata_awaiting_"))
                    else name
                ),
            )
            # Nor did it grant the reader each view (migration 0010 and its function are
            # later than this database).
            old_naming.setattr(StrataService, "_grant_reader", staticmethod(lambda c, n: None))
            settings = Settings(data_dir=tmp_path / "old", database_url=fresh_db, workers=())
            service = assemble(settings, fresh_db, engine, SparkBackend(spark)).service
            # Today's catalog code reads the columns migrations 0011 and 0015 add and the
            # tables 0014 and 0015 add; they are there only while the streams are made
            # (they join no table, so the column stays NULL; every version is 1).
            later = [
                catalog.stream_windows,
                catalog.window_changes,
                catalog.alters,
                catalog.stream_history,
            ]
            with engine.begin() as connection:
                connection.execute(
                    sa.text(
                        f"ALTER TABLE {naming.CATALOG_SCHEMA}.streams ADD tables jsonb, "
                        "ADD version integer NOT NULL DEFAULT 1"
                    )
                )
                for table in later:
                    table.create(connection)
            # Today's plans list their waiting windows (migration 0030): only while the
            # streams are made, like the catalog's tables above.
            with psycopg.connect(fresh_db, autocommit=True) as driver:
                driver.execute(WAITING_WINDOWS_SQL.read_text().encode())
            for statement in STATEMENTS.values():
                service.create_stream(statement)
            with psycopg.connect(fresh_db, autocommit=True) as driver:
                driver.execute(
                    "DROP TABLE strata_internal.waiting_windows; "
                    "DROP FUNCTION strata_internal.strata_list_waiting_windows() CASCADE"
                )
            with engine.begin() as connection:
                connection.execute(
                    sa.text(
                        f"ALTER TABLE {naming.CATALOG_SCHEMA}.streams DROP tables, DROP version"
                    )
                )
                for table in later:
                    table.drop(connection)
        yield fresh_db
    finally:
        engine.dispose()


def test_migration_renames_the_objects_postgresql_cut(
    old_database: str, spark: SparkSession, tmp_path: Path
) -> None:
    plans = _plans()
    cut = {
        f"{stream}{suffix}"[: naming.MAX_IDENTIFIER]
        for stream in (PARALLEL, HOP, ROLLUP)
        for suffix in ("__partial_window",)
    } | {f"{SERIAL}__serial_window"[: naming.MAX_IDENTIFIER]}
    before = _internal_relations(old_database)
    assert cut <= before
    assert not _planned_relations(plans) <= before

    with strata_client(old_database, spark, tmp_path) as strata:  # migrates to the head
        assert _internal_relations(old_database) == _planned_relations(plans)
        rows = [
            {"campaign": "c1", LONGEST_COLUMN: 3, "t": "2024-05-01T00:00:10Z"},
            {"campaign": "c1", LONGEST_COLUMN: 4, "t": "2024-05-01T00:00:20Z"},
            {"campaign": "c2", LONGEST_COLUMN: 5, "t": "2024-05-01T00:00:30Z"},
        ]
        strata.ingest(RAW, "".join(json.dumps(r) + "\n" for r in rows))
        assert sorted(strata.query(f"SELECT campaign, c FROM {PARALLEL}")) == [("c1", 2), ("c2", 1)]
        assert strata.query(f"SELECT top FROM {SERIAL}") == [(2,)]
        assert sorted(strata.query(f"SELECT campaign, c FROM {ROLLUP}")) == [("c1", 2), ("c2", 1)]

        with strata.service.engine.connect() as connection:
            config = _alembic(connection)
            before = ScriptDirectory.from_config(config).get_revision("0008").down_revision
            assert isinstance(before, str)
            command.downgrade(config, before)  # undo 0008 (and what came after it)
            connection.commit()
        assert cut <= _internal_relations(old_database)
        with strata.service.engine.connect() as connection:
            command.upgrade(_alembic(connection), "head")
            connection.commit()
        assert _internal_relations(old_database) == _planned_relations(plans)

        for stream in reversed(STATEMENTS):
            assert strata.client.delete(f"/streams/{stream}").status_code in (200, 204)
        assert _internal_relations(old_database) == set()
