"""Upgrades: a database left by an earlier release gets today's PostgreSQL functions at the
next start, and a start with nothing changed leaves them alone; a data dir left by 0.1.0
gets a password for its superuser and its dashboard role least privilege.

The migrations run frozen copies of the SQL they ran when written, so running them today
builds exactly the previous release's schema; the start-up install then brings the
functions of sql/ up to date (server/catalog.py install_functions)."""

from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from psycopg import sql
from pyspark.sql import SparkSession

from rewriter import naming
from rewriter.ddl import create_waiting_trigger, table
from rewriter.plan import SerialAggregatePlan
from server import catalog
from server.catalog import MIGRATIONS_DIR, create_catalog_engine, migrate
from server.engines.embedded_pg import POSTGRES_BIN_PATH, EmbeddedPostgres
from server.security import READER_ROLE, configure_reader
from server.workers.backfill import wait_for
from server.workers.reducer import Reducer
from server.workers.serial import Materializer, Repairer
from server.workers.swapper import Swapper
from tests.conftest import Strata, new_database, plan_nodes, strata_client

# The head revision of the last release (0.1.0): its data dirs are migrated this far.
PREVIOUS_RELEASE_HEAD = "0006"

# Functions added since the last release: 0010's granting the reader a view, the change
# feed's trigger on the tables streams join (sql/005_feed.sql, installed at start), and the
# sketches' cheaper transitions and final functions (sql/002_aggregates.sql).
ADDED_SINCE_PREVIOUS_RELEASE = {
    "strata_grant_reader(regclass)",
    "strata_table_changed()",
    "strata_kmv_compact(bigint[])",
    "strata_kmv_gather(bigint[],bigint[])",
    "strata_ddsketch_sum(jsonb)",
    "strata_ddsketch_gather(jsonb,jsonb)",
}

# Written by 0.1.0 (tests/fixtures/releases/make_v0_1_0.py).
V0_1_0 = Path(__file__).resolve().parent / "fixtures" / "releases" / "v0.1.0.sql"

# Two objects as an earlier Strata defined them, differing from today's sql/ in body only:
# strata_window_start before date_bin (it rounded far from 1970), and a KMV union without
# its combine function.
STALE_DEFINITIONS = (
    """
CREATE OR REPLACE FUNCTION public.strata_window_start(t timestamptz, size_us bigint)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
  SELECT timestamptz 'epoch'
         + (floor(extract(epoch FROM t) * 1000000 / size_us) * size_us) * interval '1 microsecond'
$$
""",
    """
CREATE OR REPLACE AGGREGATE public.strata_kmv_union(bigint[]) (
  SFUNC = public.strata_kmv_add,
  STYPE = bigint[],
  INITCOND = '{}'
)
""",
)

FUNCTIONS = """
SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid), p.proacl::text
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = 'public' AND p.proname LIKE 'strata\\_%' AND p.prokind = 'f'
"""
AGGREGATES = """
SELECT p.oid::regprocedure::text, p.proacl::text, p.proparallel, p.prorettype::regtype::text,
       a.aggkind, a.aggnumdirectargs,
       a.aggtransfn::oid::regprocedure::text, a.aggfinalfn::oid::regprocedure::text,
       a.aggcombinefn::oid::regprocedure::text, a.aggserialfn::oid::regprocedure::text,
       a.aggdeserialfn::oid::regprocedure::text, a.aggmtransfn::oid::regprocedure::text,
       a.aggminvtransfn::oid::regprocedure::text, a.aggmfinalfn::oid::regprocedure::text,
       a.aggfinalextra, a.aggmfinalextra, a.aggfinalmodify, a.aggmfinalmodify,
       a.aggsortop::regoperator::text, a.aggtranstype::regtype::text, a.aggtransspace,
       a.aggmtranstype::regtype::text, a.aggmtransspace, a.agginitval, a.aggminitval
  FROM pg_aggregate a
  JOIN pg_proc p ON p.oid = a.aggfnoid
  JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = 'public' AND p.proname LIKE 'strata\\_%'
"""
ROUTINE_XMINS = """
SELECT p.oid::regprocedure::text, p.xmin::text
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = 'public' AND p.proname LIKE 'strata\\_%'
"""


def routines(url: str) -> dict[str, tuple[object, ...]]:
    """Every strata_ function (its definition) and aggregate (its catalog row) in public."""
    with psycopg.connect(url, autocommit=True) as conn:
        functions = {row[0]: row[1:] for row in conn.execute(FUNCTIONS)}
        aggregates = {row[0]: row[1:] for row in conn.execute(AGGREGATES)}
    assert not functions.keys() & aggregates.keys()
    return functions | aggregates


def defined_in_sql_files() -> set[str]:
    """The names of the functions and aggregates sql/*.sql creates."""
    pattern = re.compile(r"CREATE OR REPLACE (?:FUNCTION|AGGREGATE) public\.(\w+)", re.I)
    return {name for text in catalog.read_sql().values() for name in pattern.findall(text)}


def alembic_config(migrations_dir: Path = MIGRATIONS_DIR) -> Config:
    config = Config(str(migrations_dir / "alembic.ini"))
    config.set_main_option("script_location", str(migrations_dir))
    return config


def migrate_only(url: str, revision: str) -> None:
    """Run the migrations up to `revision` and nothing else, as the release that had
    `revision` as its head did at start-up."""
    engine = create_catalog_engine(url)
    try:
        with engine.connect() as connection:
            config = alembic_config()
            config.attributes["connection"] = connection
            command.upgrade(config, revision)
    finally:
        engine.dispose()


def clicks(rng: random.Random, minutes: float, rows: int = 200) -> str:
    """``rows`` clicks of campaigns a, b and c as NDJSON, at random times in the first
    ``minutes`` of 2025-05-01."""
    start = datetime(2025, 5, 1, tzinfo=UTC)
    return "".join(
        json.dumps(
            {
                "campaign": rng.choice(["a", "b", "c"]),
                "t": (start + timedelta(minutes=rng.uniform(0, minutes))).isoformat(),
            }
        )
        + "\n"
        for _ in range(rows)
    )


def clicks_per_minute(strata: Strata, raw: str, minute: str) -> None:
    """The raw stream ``raw`` of clicks (as ``clicks`` makes them) and the stream ``minute``
    of their count per campaign and minute (shown as its window end, ``t``)."""
    strata.create(f"CREATE STREAM {raw} (campaign text, t timestamptz) WITH (event_time = 't')")
    strata.create(
        f"CREATE STREAM {minute} AS SELECT campaign, count(*) AS n, window_end AS t "
        f"FROM TUMBLE({raw}, t, INTERVAL '1 minute') GROUP BY campaign, window_end"
    )


def per_minute_and_hop(strata: Strata, raw: str) -> dict[str, str]:
    """``clicks_per_minute`` as ``<raw>_minute``, and ``<raw>_hop``, their count per
    2-minute window sliding by a minute; the oracle of each over the raw rows, by name."""
    clicks_per_minute(strata, raw, f"{raw}_minute")
    strata.create(
        f"CREATE STREAM {raw}_hop AS SELECT count(*) AS n, window_end AS t "
        f"FROM HOP({raw}, t, INTERVAL '1 minute', INTERVAL '2 minutes') GROUP BY window_end"
    )
    minute = "date_bin('1 minute', t, timestamptz 'epoch')"
    return {
        f"{raw}_minute": f"SELECT campaign, count(*), {minute} + interval '1 minute' FROM {raw} "
        "GROUP BY 1, 3",
        f"{raw}_hop": f"SELECT count(*), e FROM {raw}, LATERAL (SELECT {minute} + interval "
        "'1 minute' * k AS e FROM generate_series(1, 2) k) w GROUP BY e",
    }


def reduced_and_late(strata: Strata, raw: str, rng: random.Random) -> None:
    """Clicks into ``raw``, reduced, then more: late rows into reduced windows, and new
    windows, waiting for the reducer."""
    strata.ingest(raw, clicks(rng, 20))
    Reducer(strata.service.engine, strata.service.plans, min_rows=0).run_once()
    strata.ingest(raw, clicks(rng, 30))


def views_equal_oracles(strata: Strata, oracles: dict[str, str]) -> bool:
    """Whether each view (by name) holds exactly the rows of its oracle query, now."""
    return all(
        sorted(strata.query(f"SELECT * FROM {v}")) == sorted(strata.query(o))
        for v, o in oracles.items()
    )


def downgrade_to(engine: sa.Engine, revision: str) -> None:
    """Run the migrations' downgrades down to ``revision``, on a running server's
    database."""
    config = alembic_config()
    with engine.connect() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, revision)
        connection.commit()


WAITING_WINDOWS_SQL = MIGRATIONS_DIR / "versions" / "sql" / "0030_waiting_windows.sql"


def list_waiting_windows(url: str, archives: list[str]) -> None:
    """What 0030 makes, on a database at an earlier revision whose earlier release a test
    plays with today's code (today's views, fold and commits read and keep the list of
    waiting windows): the table, its trigger function, and each of ``archives`` (partial
    archives) listed with its trigger. 0030 makes them again as they are."""
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(WAITING_WINDOWS_SQL.read_text().encode())
        for archive in archives:
            target = table(archive)
            connection.execute(
                sql.SQL(
                    "INSERT INTO strata_internal.waiting_windows (archive, window_start) "
                    "SELECT DISTINCT {}::regclass, window_start FROM {} ON CONFLICT DO NOTHING"
                ).format(
                    sql.Literal(f"{naming.INTERNAL_SCHEMA}.{archive}"),
                    sql.Identifier(naming.INTERNAL_SCHEMA, archive),
                )
            )
            connection.execute(create_waiting_trigger(target).encode())


def restore(url: str, dump: Path) -> None:
    result = subprocess.run(
        [str(POSTGRES_BIN_PATH / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1"]
        + ["-d", url, "-f", str(dump)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def start(url: str) -> None:
    """What a server does to its database at start (and every test fixture too)."""
    engine = create_catalog_engine(url)
    try:
        migrate(engine)
    finally:
        engine.dispose()


def installs(url: str) -> list[str]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT sha256 FROM strata_catalog.function_installs ORDER BY seq")
        return [sha256 for (sha256,) in rows]


@contextmanager
def fresh_install(pg_url: str) -> Iterator[dict[str, tuple[object, ...]]]:
    """The functions and aggregates of a brand-new database started by today's server."""
    with new_database(pg_url) as url:
        start(url)
        yield routines(url)


def test_the_previous_releases_database_gets_todays_functions_at_start(
    pg_url: str, fresh_db: str
) -> None:
    migrate_only(fresh_db, PREVIOUS_RELEASE_HEAD)
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        for statement in STALE_DEFINITIONS:
            conn.execute(statement)
    with fresh_install(pg_url) as expected:
        stale = routines(fresh_db)
        assert stale.keys() == expected.keys() - ADDED_SINCE_PREVIOUS_RELEASE
        changed = {name for name in stale if stale[name] != expected[name]}
        assert changed == {
            "strata_window_start(timestamp with time zone,bigint)",
            "strata_kmv_union(bigint[])",
            "strata_ddsketch_merge(jsonb)",
        }, "the test would prove nothing"

        start(fresh_db)

        upgraded = routines(fresh_db)
        assert {name for name in upgraded if upgraded[name] != expected[name]} == set()
        assert upgraded == expected
    # Every object of sql/ is there, the serial functions still reading the catalog as
    # their owner (migration 0006 made them so; sql/003 now says it too).
    assert defined_in_sql_files() == {name.split("(")[0] for name in upgraded}
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        assert conn.execute(
            "SELECT bool_and(prosecdef) FROM pg_proc WHERE proname LIKE 'strata_serial_%'"
        ).fetchone() == (True,)
    assert installs(fresh_db) == [catalog.sql_fingerprint(catalog.read_sql())]


def catalog_schema(url: str) -> dict[str, object]:
    """Strata's own schema: the catalog's tables, constraints and indexes, and the
    functions and aggregates in public."""
    with psycopg.connect(url, autocommit=True) as conn:
        return {
            "columns": sorted(
                conn.execute(
                    "SELECT table_name, column_name, ordinal_position, data_type, is_nullable,"
                    " column_default, is_identity,"
                    " col_description(format('%I.%I', table_schema, table_name)::regclass,"
                    " ordinal_position)"
                    " FROM information_schema.columns WHERE table_schema = 'strata_catalog'"
                ).fetchall()
            ),
            "constraints": sorted(
                conn.execute(
                    "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid)"
                    " FROM pg_constraint WHERE connamespace = 'strata_catalog'::regnamespace"
                ).fetchall()
            ),
            "indexes": sorted(
                conn.execute(
                    "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'strata_catalog'"
                ).fetchall()
            ),
            "revision": conn.execute(
                "SELECT version_num FROM strata_catalog.alembic_version"
            ).fetchall(),
            "routines": routines(url),
        }


def test_the_migrations_alone_build_0_1_0s_schema(pg_url: str, fresh_db: str) -> None:
    """Frozen, they do not follow sql/: run today, they build what 0.1.0 built (its dump)."""
    migrate_only(fresh_db, PREVIOUS_RELEASE_HEAD)
    with new_database(pg_url) as released:
        restore(released, V0_1_0)
        assert catalog_schema(fresh_db) == catalog_schema(released)


def test_a_start_with_nothing_changed_installs_nothing(fresh_db: str) -> None:
    start(fresh_db)
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        before = dict(conn.execute(ROUTINE_XMINS).fetchall())
    assert len(installs(fresh_db)) == 1

    start(fresh_db)

    with psycopg.connect(fresh_db, autocommit=True) as conn:
        assert dict(conn.execute(ROUTINE_XMINS).fetchall()) == before
    assert len(installs(fresh_db)) == 1


def test_a_changed_sql_file_is_installed_at_the_next_start(
    fresh_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    start(fresh_db)
    sql_dir = tmp_path / "sql"
    shutil.copytree(catalog.SQL_DIR, sql_dir)
    functions = sql_dir / "001_functions.sql"
    today = "SELECT date_bin(size_us * interval '1 microsecond', t, timestamptz 'epoch')"
    fixed = "SELECT date_bin(size_us * interval '1 microsecond', t, 'epoch'::timestamptz)"
    assert today in functions.read_text()
    functions.write_text(functions.read_text().replace(today, fixed))
    monkeypatch.setattr(catalog, "SQL_DIR", sql_dir)

    start(fresh_db)

    with psycopg.connect(fresh_db, autocommit=True) as conn:
        (definition,) = conn.execute(
            "SELECT pg_get_functiondef('public.strata_window_start'::regproc)"
        ).fetchone()  # type: ignore[misc]
    assert "'epoch'::timestamptz" in definition
    assert len(installs(fresh_db)) == 2


def test_a_migration_that_recreates_a_function_is_followed_by_an_install(
    fresh_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A later migration may (re)create a function from its frozen SQL, older than sql/
    (e.g. when upgrading again after a downgrade): sql/ is installed again, although the
    fingerprint of sql/ is the one recorded."""
    start(fresh_db)
    expected = routines(fresh_db)
    migrations = tmp_path / "migrations"
    shutil.copytree(MIGRATIONS_DIR, migrations, ignore=shutil.ignore_patterns("__pycache__"))
    (migrations / "versions" / "9999_stale.py").write_text(
        f'''"""Re-creates strata_window_start as an earlier release had it."""

from alembic import op

revision = "9999"
down_revision = "{head(MIGRATIONS_DIR)}"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute({STALE_DEFINITIONS[0]!r})
'''
    )
    monkeypatch.setattr(catalog, "MIGRATIONS_DIR", migrations)

    start(fresh_db)

    assert routines(fresh_db) == expected
    assert len(installs(fresh_db)) == 2


def head(migrations_dir: Path) -> str:
    revision = ScriptDirectory.from_config(alembic_config(migrations_dir)).get_current_head()
    assert revision is not None
    return revision


def test_the_install_is_one_transaction(
    fresh_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file that fails leaves every function (and the fingerprint) as it was."""
    start(fresh_db)
    before = routines(fresh_db)
    sql_dir = tmp_path / "sql"
    shutil.copytree(catalog.SQL_DIR, sql_dir)
    functions = sql_dir / "001_functions.sql"
    functions.write_text(
        functions.read_text().replace("timestamptz 'epoch'", "'epoch'::timestamptz")
    )
    (sql_dir / "999_broken.sql").write_text("SELECT no_such_function();\n")
    monkeypatch.setattr(catalog, "SQL_DIR", sql_dir)

    with pytest.raises(sa.exc.ProgrammingError, match="no_such_function"):
        start(fresh_db)

    assert routines(fresh_db) == before
    assert len(installs(fresh_db)) == 1


# ---------------------------------------------------------------------------------------
# A database as 0.1.0 left it (tests/fixtures/releases/make_v0_1_0.py wrote the dump),
# started by today's server.
# ---------------------------------------------------------------------------------------

MINUTE = "date_bin('1 minute', t, timestamptz 'epoch')"
FIVE_MINUTES = "date_bin('5 minutes', t, timestamptz 'epoch')"
# Each stream of the dump as a batch query over the raw archive (the view clicks).
V0_1_0_ORACLES = {
    "clicks_per_minute": (
        f"SELECT campaign, count(*), sum(price), count(DISTINCT user_id), stddev(price), "
        f"{MINUTE} + interval '1 minute' FROM clicks GROUP BY campaign, {MINUTE}"
    ),
    # A roll-up: each minute counts in the 5-minute window holding it.
    "clicks_per_5_minutes": (
        f"SELECT campaign, count(*), sum(price), {FIVE_MINUTES} + interval '5 minutes' "
        f"FROM clicks GROUP BY campaign, {FIVE_MINUTES}"
    ),
    # HOP(1 minute, 5 minutes): a row is in the five windows ending 1 to 5 minutes after
    # its minute starts.
    "clicks_sliding": (
        f"SELECT count(*), count(DISTINCT user_id), {MINUTE} + ends * interval '1 minute' "
        f"FROM clicks, generate_series(1, 5) AS ends GROUP BY {MINUTE} + ends * interval "
        "'1 minute'"
    ),
    "top_per_5_minutes": (
        f"SELECT max(n), count(*), w + interval '5 minutes' FROM (SELECT count(*) AS n, "
        f"{FIVE_MINUTES} AS w FROM clicks GROUP BY campaign, {MINUTE}, w) AS per_minute "
        "GROUP BY w"
    ),
}


def wrong_views(strata: Strata) -> list[str]:
    """The streams whose view differs from its batch query, all read in one snapshot."""
    wrong = []
    with psycopg.connect(strata.database_url) as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        for name, oracle in V0_1_0_ORACLES.items():
            # Counter: equal numbers are equal whatever their type or scale (types have
            # tests of their own, tests/test_differential.py).
            view = Counter(conn.execute(f"SELECT * FROM {name}").fetchall())
            if not view or view != Counter(conn.execute(oracle).fetchall()):
                wrong.append(name)
    return wrong


def stale_serial_views(strata: Strata) -> list[str]:
    """The serial streams whose view is not the one today's plan makes: the view SQL
    changed since (0021: the early-outs of the windows computed on read), and an upgrade
    must replace it. Compared as PostgreSQL prints both, each in a rolled-back
    transaction."""
    with strata.service.engine.connect() as connection:
        records = strata.service.plans.load(connection)
    stale = []
    with psycopg.connect(strata.database_url) as conn:
        for name, record in records.items():
            if not isinstance(record.plan, SerialAggregatePlan):
                continue
            conn.execute(
                sql.SQL("CREATE TEMP VIEW today AS {}").format(sql.SQL(record.plan.view_query))
            )
            stored, today = conn.execute(
                "SELECT pg_get_viewdef(%s::regclass), pg_get_viewdef('today'::regclass)",
                (sql.Identifier("public", name).as_string(),),
            ).fetchone() or (None, None)
            conn.rollback()
            if stored != today:
                stale.append(name)
    return stale


def test_todays_server_carries_on_with_a_database_0_1_0_left(
    pg_url: str, fresh_db: str, spark: SparkSession, tmp_path: Path
) -> None:
    # The fresh install also creates strata_reader, whom the dump's grants name (roles are
    # cluster-wide: the previous release's server had it).
    with fresh_install(pg_url) as expected:
        restore(fresh_db, V0_1_0)
        with psycopg.connect(fresh_db) as conn:
            assert conn.execute(
                "SELECT version_num FROM strata_catalog.alembic_version"
            ).fetchall() == [(PREVIOUS_RELEASE_HEAD,)]
            assert conn.execute("SELECT count(*) FROM clicks").fetchone() == (290,)

        with strata_client(fresh_db, spark, tmp_path) as strata:
            listed = {s["name"] for s in strata.client.get("/streams").json()}
            assert listed == {"clicks", *V0_1_0_ORACLES}
            assert routines(fresh_db) == expected
            assert wrong_views(strata) == []
            assert stale_serial_views(strata) == []
            # The reduced windows of the streams with keys are indexed on them (0022).
            indexes = strata.query(
                "SELECT indexname FROM pg_indexes WHERE schemaname = 'strata_internal' "
                "AND indexname LIKE '%\\_key\\_end'"
            )
            assert sorted(indexes) == [
                ("clicks_per_5_minutes__reduced_key_end",),
                ("clicks_per_minute__reduced_key_end",),
            ]
            # The windows 0.1.0 archived are in strata_window_status, their rows unknown.
            status = strata.query(
                "SELECT count(*), count(*) FILTER (WHERE rows IS NULL), count(DISTINCT stream) "
                "FROM strata_window_status"
            )[0]
            assert status[0] > 0 and status[1] == status[0] and status[2] >= 2
            progress = strata.client.get("/streams/top_per_5_minutes").json()["progress"]
            assert progress["serial"]["windows_awaiting_repair"] == 1

            # The late window 0.1.0 left awaiting repair is repaired, as any other.
            engine, plans = strata.service.engine, strata.service.plans
            assert Repairer(engine, plans).run_once() == {"top_per_5_minutes": 1}
            assert wrong_views(strata) == []

            # A new run, late and on time, into every stream, the serial one's closed
            # windows included.
            rng = random.Random(5)
            start = datetime(2025, 3, 1, tzinfo=UTC)
            minutes = [rng.uniform(0, 90) for _ in range(60)]
            body = "".join(
                json.dumps(
                    {
                        "campaign": rng.choice(["c1", "c4"]),
                        "user_id": rng.randrange(30),
                        "price": str(Decimal(rng.randrange(1, 10**6)) / 10**4),
                        "t": (start + timedelta(minutes=m)).isoformat(),
                    }
                )
                + "\n"
                for m in minutes
            )
            assert strata.ingest("clicks", body, run_id="after-upgrade")["rows"] == 60
            assert strata.query("SELECT count(*) FROM clicks") == [(350,)]
            assert wrong_views(strata) == []
            # The reducer moves what 0.1.0's reducers folded, and the new run, into the
            # consolidated tables the upgrade made.
            assert wrong_views(strata) == []
            Reducer(engine, plans, min_rows=0).run_once()
            partials = strata.query(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'strata_internal' "
                "AND tablename LIKE '%\\_\\_partial'"
            )
            assert partials
            for (partial,) in partials:
                left = strata.query(f"SELECT count(*) FROM strata_internal.{partial}")
                assert left == [(0,)], partial
            Materializer(engine, plans).run_once()
            Repairer(engine, plans).run_once()
            assert wrong_views(strata) == []

            # A stream 0.1.0 made changes its query (migration 0015): back-filled over the
            # rows 0.1.0 archived and the new run, then swapped in.
            response = strata.client.post(
                "/streams",
                json={
                    "sql": "ALTER STREAM clicks_per_5_minutes AS SELECT campaign, sum(n) AS n, "
                    "sum(revenue) AS revenue, window_end AS t FROM TUMBLE(clicks_per_minute, "
                    "t, INTERVAL '10 minutes') GROUP BY campaign, window_end"
                },
            )
            assert response.status_code == 202, response.text
            wait_for(engine, "clicks_per_5_minutes__next")
            assert Swapper(engine, plans).run_once()["clicks_per_5_minutes"] == 1
            ten = "date_bin('10 minutes', t, timestamptz 'epoch')"
            altered = strata.query("SELECT * FROM clicks_per_5_minutes")
            expected = strata.query(
                f"SELECT campaign, count(*), sum(price), {ten} + interval '10 minutes' "
                f"FROM clicks GROUP BY campaign, {ten}"
            )
            assert altered and Counter(altered) == Counter(expected)
            described = strata.client.get("/streams/clicks_per_5_minutes").json()
            assert described["version"] == 2 and len(described["history"]) == 1
            assert [w for w in wrong_views(strata) if w != "clicks_per_5_minutes"] == []


# ---------------------------------------------------------------------------------------
# A data dir as 0.1.0 left it, the cluster and not only the database: the embedded
# PostgreSQL's superuser had no password and its pg_hba.conf trusted it on loopback
# (tests/fixtures/releases/make_v0_1_0_pg_hba.py wrote the rules), and strata_reader could
# read every table in public.
# ---------------------------------------------------------------------------------------

V0_1_0_PG_HBA = V0_1_0.with_name("v0.1.0.pg_hba.conf")
# A table of the owner's own in public, as a dimension table streams join will be.
OWN_TABLE = (
    "CREATE TABLE public.campaign_budgets (campaign text PRIMARY KEY, budget numeric);"
    "INSERT INTO public.campaign_budgets VALUES ('c1', 100), ('c4', 250)"
)


def _as(url: str, user: str, password: str | None = None) -> str:
    parts = urlsplit(url)
    login = user if password is None else f"{user}:{password}"
    return urlunsplit(parts._replace(netloc=f"{login}@{parts.hostname}:{parts.port}"))


def make_v0_1_0_data_dir(data_dir: Path) -> EmbeddedPostgres:
    """An embedded PostgreSQL's data dir as 0.1.0 leaves it, PostgreSQL running: 0.1.0's
    rules, no password for the superuser, the `strata` database 0.1.0's dump, and a table
    the owner made in public meanwhile, which 0.1.0's default privileges gave the reader."""
    pg = EmbeddedPostgres(data_dir)
    url = pg.start()
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("ALTER ROLE postgres PASSWORD NULL")
        admin.execute(f"CREATE ROLE {READER_ROLE} NOLOGIN")  # as 0.1.0's migration 0006 did
        # Written over the file, which keeps its owner and mode.
        (pg.pgdata / "pg_hba.conf").write_text(V0_1_0_PG_HBA.read_text())
        admin.execute("SELECT pg_reload_conf()")
    pg.password_file.unlink()
    old_url = _as(url, "postgres")
    restore(old_url, V0_1_0)
    with psycopg.connect(old_url, autocommit=True) as owner:
        owner.execute(OWN_TABLE.encode())
        granted = owner.execute(
            "SELECT has_table_privilege(%s, 'public.campaign_budgets', 'SELECT')",
            (READER_ROLE,),
        ).fetchone()
        assert granted == (True,), "the test would prove nothing"
    return pg


@pytest.mark.parametrize("old_server", ["stopped", "running"])
def test_a_data_dir_0_1_0_left_gets_an_owner_password_and_least_privilege(
    tmp_path: Path, spark: SparkSession, old_server: str
) -> None:
    """With PostgreSQL stopped (as after 0.1.0's clean stop) and still running (as after a
    kill -9 of 0.1.0's server): the superuser gets a password and needs it; the reader
    keeps every stream view and loses the owner's table."""
    data_dir = tmp_path / "postgres"
    old = make_v0_1_0_data_dir(data_dir)
    old_url = _as(old.url, "postgres")
    if old_server == "stopped":
        old.stop()
    new = EmbeddedPostgres(data_dir)
    try:
        url = new.start()
        password = new.password_file.read_text().strip()
        assert urlsplit(url).password == password
        assert new.password_file.stat().st_mode & 0o077 == 0
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(old_url).close()
        assert password not in new.log_file.read_text()

        with strata_client(url, spark, tmp_path / "strata") as strata:
            assert strata.query("SELECT version_num FROM strata_catalog.alembic_version") == [
                (head(MIGRATIONS_DIR),)
            ]
            assert wrong_views(strata) == []
            strata.create("CREATE STREAM later (t timestamptz) WITH (event_time = 't')")
            configure_reader(strata.service.engine, "reader-pw")
            with psycopg.connect(_as(url, READER_ROLE, "reader-pw"), autocommit=True) as reader:
                for view in ["clicks", *V0_1_0_ORACLES, "later"]:
                    reader.execute(f"SELECT count(*) FROM {view}")
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    reader.execute("SELECT * FROM campaign_budgets")
            # Its owner still reads it, and may grant it.
            assert strata.query("SELECT sum(budget) FROM campaign_budgets") == [(350,)]
    finally:
        new.stop()
        old.stop()


# ---------------------------------------------------------------------------------------
# Column names: Strata now names unaliased items as PostgreSQL does (k::text is k); the
# streams of an earlier release keep the names their views were made with (0012).
# ---------------------------------------------------------------------------------------


def test_existing_streams_keep_their_column_names_after_the_naming_change(
    fresh_db: str, spark: SparkSession, tmp_path: Path
) -> None:
    old_sql = (
        "CREATE STREAM tagged AS SELECT campaign::text, ceiling(sum(price)), count(*), "
        "window_end FROM TUMBLE(visits, t, INTERVAL '1 hour') GROUP BY campaign::text, "
        "window_end"
    )
    # What the earlier release made of it: its names, in the view and in the plan.
    as_made = old_sql.replace("campaign::text,", 'campaign::text AS "cast",', 1).replace(
        "ceiling(sum(price)),", 'ceiling(sum(price)) AS "ceil",'
    )
    body = "".join(
        json.dumps({"campaign": c, "price": p, "t": f"2025-01-01T0{h}:10:00+00:00"}) + "\n"
        for c, p, h in [("a", 1.5, 1), ("b", 2.25, 1), ("a", 3.0, 2)]
    )
    with strata_client(fresh_db, spark, tmp_path / "before") as strata:
        strata.create(
            "CREATE STREAM visits (campaign text, price numeric(8,2), t timestamptz) "
            "WITH (event_time = 't')"
        )
        strata.create(as_made)
        strata.create(
            'CREATE STREAM per_day AS SELECT "cast", sum(count) AS n, window_end FROM '
            "TUMBLE(tagged, window_end, INTERVAL '1 day') GROUP BY \"cast\", window_end"
        )
        strata.ingest("visits", body)
    # The catalog as the earlier release left it: the statement as the user wrote it, at
    # the revision before 0012.
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("UPDATE strata_catalog.streams SET sql = %s WHERE name = 'tagged'", (old_sql,))
        conn.execute("UPDATE strata_catalog.alembic_version SET version_num = '0011'")
    with strata_client(fresh_db, spark, tmp_path / "after") as strata:
        described = strata.client.get("/streams/tagged").json()
        assert [c["name"] for c in described["columns"]] == ["cast", "ceil", "count", "window_end"]
        strata.ingest("visits", body.replace("2025-01-01", "2025-01-02"))
        assert sorted(strata.query('SELECT "cast", ceil, count FROM tagged')) == [
            ("a", 2, 1),
            ("a", 2, 1),
            ("a", 3, 1),
            ("a", 3, 1),
            ("b", 3, 1),
            ("b", 3, 1),
        ]
        assert sorted(strata.query('SELECT "cast", n FROM per_day')) == [
            ("a", 2),
            ("a", 2),
            ("b", 1),
            ("b", 1),
        ]
        # A stream created today gets PostgreSQL's names.
        made = strata.create(old_sql.replace("tagged", "tagged_today"))
        assert [c["name"] for c in made["columns"]] == [  # type: ignore[index]
            "campaign",
            "ceiling",
            "count",
            "window_end",
        ]


def test_downgrading_below_the_consolidated_tables_keeps_views_exact(strata: Strata) -> None:
    """The views 0013's downgrade leaves merge the consolidated rows with the unreduced ones
    on read, and upgrading again reads the consolidated tables as before."""
    clicks_per_minute(strata, "ev", "per_minute")
    strata.create(
        "CREATE STREAM sliding AS SELECT campaign, count(*) AS n, window_start FROM "
        "HOP(ev, t, INTERVAL '1 minute', INTERVAL '3 minutes') GROUP BY campaign, window_start"
    )
    rng = random.Random(4)
    start = datetime(2025, 5, 1, tzinfo=UTC)

    def run() -> str:
        return "".join(
            json.dumps(
                {
                    "campaign": rng.choice(["a", "b"]),
                    "t": (start + timedelta(seconds=rng.uniform(0, 600))).isoformat(),
                }
            )
            + "\n"
            for _ in range(40)
        )

    strata.ingest("ev", run())
    Reducer(strata.service.engine, strata.service.plans, min_rows=0).run_once()
    strata.ingest("ev", run())  # unreduced, beside the consolidated rows
    views = {v: sorted(strata.query(f"SELECT * FROM {v}")) for v in ("per_minute", "sliding")}
    downgrade_to(strata.service.engine, "0012")
    assert strata.query("SELECT version_num FROM strata_catalog.alembic_version") == [("0012",)]
    assert (
        "__reduced"
        not in strata.query("SELECT pg_get_viewdef('per_minute')")[0][0].split("UNION ALL")[0]
    )
    for view, rows in views.items():
        assert sorted(strata.query(f"SELECT * FROM {view}")) == rows, view
    migrate(strata.service.engine)
    for view, rows in views.items():
        assert sorted(strata.query(f"SELECT * FROM {view}")) == rows, view


def test_the_key_index_of_reduced_windows_comes_with_the_upgrade(strata: Strata) -> None:
    """A data dir at 0021 has no index on its reduced windows' keys and window end; 0022
    builds it over the windows already reduced, and its downgrade drops it (the release
    before does not name it), the views exact throughout."""
    clicks_per_minute(strata, "kv", "kv_minute")
    strata.create(
        "CREATE STREAM kv_all AS SELECT count(*) AS n, window_end AS t "
        "FROM TUMBLE(kv, t, INTERVAL '1 minute') GROUP BY window_end"
    )
    strata.ingest("kv", clicks(random.Random(8), 15, rows=300))
    Reducer(strata.service.engine, strata.service.plans, min_rows=0).run_once()
    minute = "date_bin('1 minute', t, timestamptz 'epoch') + interval '1 minute'"
    oracle = f"SELECT campaign, count(*), {minute} FROM kv GROUP BY 1, 3"
    expected = sorted(strata.query(oracle))
    assert len(expected) == 45

    def key_indexes() -> list[tuple[str]]:
        return strata.query(
            "SELECT indexname FROM pg_indexes WHERE schemaname = 'strata_internal' "
            "AND indexname LIKE 'kv\\_%\\_key\\_end'"
        )

    assert key_indexes() == [("kv_minute__reduced_key_end",)]  # kv_all has no key
    downgrade_to(strata.service.engine, "0021")
    assert key_indexes() == []
    assert sorted(strata.query("SELECT * FROM kv_minute")) == expected
    migrate(strata.service.engine)
    assert key_indexes() == [("kv_minute__reduced_key_end",)]
    assert sorted(strata.query("SELECT * FROM kv_minute")) == expected
    reindexed = strata.query(
        "SELECT count(*) FROM strata_internal.kv_minute__reduced WHERE key_0 = 'a'"
    )
    assert reindexed == [(sum(1 for row in expected if row[0] == "a"),)]


def test_serial_views_call_their_function_after_the_upgrade(strata: Strata) -> None:
    """0023 gives each serial stream the function its view computes windows on read with,
    and replaces the view; its downgrade puts the function's query back in the view (what
    the previous release read) and drops the function. Exact throughout, with windows
    archived, awaiting repair and not yet archived."""
    clicks_per_minute(strata, "sv", "sv_minute")
    strata.create(
        "CREATE STREAM sv_top AS SELECT max(n) AS top, window_end AS t "
        "FROM TUMBLE(sv_minute, t, INTERVAL '5 minutes') GROUP BY window_end"
    )
    rng = random.Random(9)
    strata.ingest("sv", clicks(rng, 30))
    Materializer(strata.service.engine, strata.service.plans).run_once()
    strata.ingest("sv", clicks(rng, 40))  # late rows into archived windows, and new windows
    five = "date_bin('5 minutes', t, timestamptz 'epoch')"
    oracle = (
        f"SELECT max(n), w + interval '5 minutes' FROM (SELECT count(*) AS n, {five} AS w "
        f"FROM sv GROUP BY campaign, date_bin('1 minute', t, timestamptz 'epoch'), w) m "
        "GROUP BY w"
    )
    expected = sorted(strata.query(oracle))
    assert len(expected) == 8
    assert strata.query("SELECT count(*) FROM strata_internal.sv_top__serial")[0][0] > 0
    assert strata.query("SELECT count(*) FROM strata_catalog.corrections")[0][0] > 0
    function = naming.serial_live_function("sv_top")

    def calls() -> bool:
        return function in strata.query("SELECT pg_get_viewdef('sv_top')")[0][0]

    def exists() -> bool:
        return bool(strata.query("SELECT count(*) FROM pg_proc WHERE proname = %s", function)[0][0])

    assert calls() and exists()
    assert sorted(strata.query("SELECT * FROM sv_top")) == expected
    downgrade_to(strata.service.engine, "0022")
    assert not calls() and not exists()
    assert sorted(strata.query("SELECT * FROM sv_top")) == expected
    migrate(strata.service.engine)
    assert calls() and exists()
    assert sorted(strata.query("SELECT * FROM sv_top")) == expected
    Repairer(strata.service.engine, strata.service.plans).run_once()
    Materializer(strata.service.engine, strata.service.plans).run_once()
    assert sorted(strata.query("SELECT * FROM sv_top")) == expected


def test_session_streams_key_index_comes_with_the_upgrade(strata: Strata) -> None:
    """A data dir at 0023 has no index of a raw archive for the sessions read by key; 0024
    builds it over the raw rows already archived, and its downgrade drops it (the release
    before does not name it), the sessions exact throughout (the Python model's)."""
    strata.create("CREATE STREAM ss (k text, t timestamptz) WITH (event_time = 't')")
    strata.create(
        "CREATE STREAM ss_visits AS SELECT k, count(*) AS n, window_start FROM "
        "SESSION(ss, t, INTERVAL '30 seconds') GROUP BY k, window_start"
    )
    rng = random.Random(10)
    start = datetime(2025, 5, 1, tzinfo=UTC)
    rows = sorted((rng.choice("abc"), rng.randrange(1800)) for _ in range(300))
    strata.ingest(
        "ss",
        "".join(
            json.dumps({"k": k, "t": (start + timedelta(seconds=s)).isoformat()}) + "\n"
            for k, s in rows
        ),
    )
    expected = []  # (k, rows, first second) per session: rows of k less than 30 s apart
    for k in "abc":
        seconds = [s for key, s in rows if key == k]
        first = previous = seconds[0]
        count = 0
        for s in seconds:
            if s - previous >= 30:
                expected.append((k, count, start + timedelta(seconds=first)))
                first, count = s, 0
            count, previous = count + 1, s
        expected.append((k, count, start + timedelta(seconds=first)))
    expected.sort()
    index = naming.session_index("ss", ["k", "t"])

    def indexed() -> bool:
        found = strata.query("SELECT count(*) FROM pg_indexes WHERE indexname = %s", index)
        return bool(found[0][0])

    assert indexed()
    downgrade_to(strata.service.engine, "0023")
    assert not indexed()
    assert sorted(strata.query("SELECT * FROM ss_visits")) == expected
    migrate(strata.service.engine)
    assert indexed()
    assert sorted(strata.query("SELECT * FROM ss_visits")) == expected
    assert sorted(strata.query("SELECT * FROM ss_visits WHERE k = 'b'")) == [
        e for e in expected if e[0] == "b"
    ]


def test_aggregate_views_find_their_waiting_windows_by_function_after_the_upgrade(
    strata: Strata,
) -> None:
    """0025 gives each aggregate stream the function its view finds the windows that wait
    for the reducer with, and replaces the view; its downgrade puts back what the previous
    release read there (SELECT DISTINCT over the partial archive) and drops the function.
    Exact throughout, with windows reduced, waiting, and both in one window (late rows)."""
    oracles = per_minute_and_hop(strata, "wv")
    reduced_and_late(strata, "wv", random.Random(13))
    expected = {view: sorted(strata.query(oracle)) for view, oracle in oracles.items()}
    assert strata.query("SELECT count(*) FROM strata_internal.wv_minute__reduced")[0][0] > 0
    assert strata.query("SELECT count(*) FROM strata_internal.wv_minute__partial")[0][0] > 0

    def calls() -> list[bool]:
        return [
            naming.waiting_windows_function(view)
            in strata.query("SELECT pg_get_viewdef(%s::regclass)", view)[0][0]
            for view in oracles
        ]

    def exists() -> list[bool]:
        return [
            bool(
                strata.query(
                    "SELECT count(*) FROM pg_proc WHERE proname = %s",
                    naming.waiting_windows_function(view),
                )[0][0]
            )
            for view in oracles
        ]

    def exact() -> bool:
        return all(sorted(strata.query(f"SELECT * FROM {v}")) == expected[v] for v in oracles)

    assert calls() == exists() == [True, True] and exact()
    downgrade_to(strata.service.engine, "0024")
    assert calls() == exists() == [False, False] and exact()
    migrate(strata.service.engine)
    assert calls() == exists() == [True, True] and exact()
    Reducer(strata.service.engine, strata.service.plans, min_rows=0).run_once()
    assert strata.query("SELECT count(*) FROM strata_internal.wv_minute__partial") == [(0,)]
    assert exact()


def test_aggregate_views_read_consolidated_rows_as_a_plain_table_after_the_upgrade(
    strata: Strata,
) -> None:
    """0027 replaces each aggregate stream's view with one whose consolidated rows are a
    UNION ALL branch without WHERE, which PostgreSQL scans as a plain table (no subquery
    scan node over it); its downgrade puts the filter back in that branch. Exact throughout,
    tumbling, HOP and HAVING alike, with windows reduced, waiting, and both (late rows)."""
    oracles = per_minute_and_hop(strata, "fv")
    strata.create(
        "CREATE STREAM fv_busy AS SELECT campaign, count(*) AS n, window_end AS t "
        "FROM TUMBLE(fv, t, INTERVAL '1 minute') GROUP BY campaign, window_end "
        "HAVING count(*) > 1"
    )
    oracles["fv_busy"] = (
        "SELECT campaign, count(*), date_bin('1 minute', t, timestamptz 'epoch') "
        "+ interval '1 minute' FROM fv GROUP BY 1, 3 HAVING count(*) > 1"
    )
    rng = random.Random(19)
    reduced_and_late(strata, "fv", rng)
    assert strata.query("SELECT count(*) FROM strata_internal.fv_minute__partial")[0][0] > 0

    def flattened() -> list[bool]:
        return [
            naming.VIEW_STORED_COLUMN
            in strata.query("SELECT pg_get_viewdef(%s::regclass)", v)[0][0]
            for v in oracles
        ]

    def exact() -> bool:
        return views_equal_oracles(strata, oracles)

    assert flattened() == [True, True, True] and exact()
    downgrade_to(strata.service.engine, "0026")
    assert flattened() == [False, False, False] and exact()
    migrate(strata.service.engine)
    assert flattened() == [True, True, True] and exact()
    strata.ingest("fv", clicks(rng, 10))  # late again, after the upgrade
    assert exact()
    Reducer(strata.service.engine, strata.service.plans, min_rows=0).run_once()
    assert strata.query("SELECT count(*) FROM strata_internal.fv_minute__partial") == [(0,)]
    assert exact()
    # Caught up, the consolidated table is scanned as it is, under no subquery scan node
    # (a HAVING stays in its branch: it filters the consolidated rows themselves).
    for view, scanned in (("fv_minute", True), ("fv_hop", True), ("fv_busy", False)):
        lines = [r[0] for r in strata.query(f"EXPLAIN SELECT * FROM {view}")]
        parent = _parent_node(lines, f" on {view}__reduced c ")
        assert ("Subquery Scan" not in parent) == scanned, "\n".join(lines)


def _parent_node(lines: list[str], scan: str) -> str:
    """The node of an EXPLAIN plan (its lines) right above the one whose line holds ``scan``:
    the nearest line before it indented less."""
    found = next(i for i, line in enumerate(lines) if scan in line)
    depth = len(lines[found]) - len(lines[found].lstrip(" ->"))
    return next(
        line
        for line in reversed(lines[:found])
        if line.lstrip().startswith("->") or line == lines[0]
        if len(line) - len(line.lstrip(" ->")) < depth
    )


def test_top_n_streams_keep_their_windows_after_the_upgrade(strata: Strata) -> None:
    """0026 keeps a top-N stream that ranks each window of an aggregate stream as a serial
    stream: the upgrade makes its archive and function and replaces its view (windows
    ranked on read until the materializer archives them); the downgrade gives back the
    view the previous release ranked on read and drops the archive and its serial state.
    Exact throughout, with windows archived, corrected by late rows, and neither."""
    clicks_per_minute(strata, "tv", "tv_minute")
    strata.create(
        "CREATE STREAM tv_top AS SELECT campaign, n, t FROM (SELECT campaign, n, t, "
        "ROW_NUMBER() OVER (PARTITION BY t ORDER BY n DESC, campaign) AS rn FROM tv_minute) x "
        "WHERE rn <= 2"
    )
    engine, plans = strata.service.engine, strata.service.plans
    rng = random.Random(17)
    strata.ingest("tv", clicks(rng, 20))
    assert sum(Materializer(engine, plans).run_once().values()) > 0
    strata.ingest("tv", clicks(rng, 15, rows=60))  # late rows into archived windows
    oracle = (
        "SELECT campaign, n, w + interval '1 minute' FROM (SELECT campaign, n, w, "
        "row_number() OVER (PARTITION BY w ORDER BY n DESC, campaign) AS r FROM (SELECT "
        "campaign, count(*) AS n, date_bin('1 minute', t, timestamptz 'epoch') AS w FROM tv "
        "GROUP BY 1, 3) c) x WHERE r <= 2"
    )
    archive = f"{naming.INTERNAL_SCHEMA}.{naming.serial_archive_table('tv_top')}"

    def exact() -> bool:
        return sorted(strata.query("SELECT * FROM tv_top")) == sorted(strata.query(oracle))

    def kept() -> bool:
        made = strata.query("SELECT to_regclass(%s) IS NOT NULL", archive)[0][0]
        view = strata.query("SELECT pg_get_viewdef('tv_top'::regclass)")[0][0]
        assert made == (naming.serial_archive_table("tv_top") in view)
        return bool(made)

    def corrected() -> int:
        return int(
            strata.query("SELECT count(*) FROM strata_catalog.corrections WHERE stream = 'tv_top'")[
                0
            ][0]
        )

    assert kept() and corrected() > 0 and exact()
    downgrade_to(engine, "0025")
    assert not kept() and corrected() == 0 and exact()
    assert strata.query("SELECT count(*) FROM strata_catalog.serial_progress") == [(0,)]
    migrate(engine)
    assert kept() and exact()
    assert strata.query(f"SELECT count(*) FROM {archive}") == [(0,)]  # type: ignore[arg-type]
    Materializer(engine, plans).run_once()
    Repairer(engine, plans).run_once()
    assert strata.query(f"SELECT count(*) FROM {archive}")[0][0] > 0  # type: ignore[arg-type]
    strata.ingest("tv", clicks(rng, 15, rows=30))  # late again, after the upgrade
    assert corrected() > 0 and exact()
    Repairer(engine, plans).run_once()
    assert corrected() == 0 and exact()


def test_aggregate_views_read_their_waiting_windows_from_a_list_after_the_upgrade(
    strata: Strata,
) -> None:
    """0030 lists the windows whose partial rows wait for the reducer in a table (filled
    from each partial archive as it is), gives each partial archive the trigger that keeps
    listing them, and each stream's function reads the list; its downgrade puts back the
    functions that skip through the archive's index and drops the triggers and the table.
    Exact throughout, with windows reduced, waiting, and both; and after the upgrade, late
    rows are listed as they commit and unlisted as they are folded."""
    oracles = per_minute_and_hop(strata, "ww")
    rng = random.Random(30)
    reduced_and_late(strata, "ww", rng)
    expected = {view: sorted(strata.query(oracle)) for view, oracle in oracles.items()}
    archives = [f"strata_internal.{view}__partial" for view in oracles]

    def exact() -> bool:
        return all(sorted(strata.query(f"SELECT * FROM {v}")) == expected[v] for v in oracles)

    def listed(archive: str) -> list[tuple]:
        return strata.query(
            "SELECT window_start FROM strata_internal.waiting_windows "
            "WHERE archive = %s::regclass ORDER BY 1",
            archive,
        )

    def distinct(archive: str) -> list[tuple]:
        return strata.query(f"SELECT DISTINCT window_start FROM {archive} ORDER BY 1")

    def triggers() -> int:
        return strata.query(
            "SELECT count(*) FROM pg_trigger WHERE tgname = %s", naming.WAITING_TRIGGER
        )[0][0]

    assert all(distinct(a) and listed(a) == distinct(a) for a in archives) and exact()
    downgrade_to(strata.service.engine, "0029")
    assert strata.query("SELECT to_regclass('strata_internal.waiting_windows')") == [(None,)]
    assert triggers() == 0 and exact()
    migrate(strata.service.engine)
    assert triggers() == len(archives)
    assert all(listed(a) == distinct(a) for a in archives) and exact()
    strata.ingest("ww", clicks(rng, 30))
    expected = {view: sorted(strata.query(oracle)) for view, oracle in oracles.items()}
    assert all(listed(a) == distinct(a) for a in archives) and exact()
    Reducer(strata.service.engine, strata.service.plans, min_rows=0).run_once()
    assert all(listed(a) == distinct(a) == [] for a in archives) and exact()


def test_serial_views_compute_windows_awaiting_repair_in_a_function_of_their_own_after_the_upgrade(
    strata: Strata,
) -> None:
    """0031 gives each serial stream a function of its windows awaiting repair, which its
    view joins with the windows listed (the function of the windows not materialized yet
    then computes those only), and replaces its view; its downgrade puts back the one
    function computing both, the view calling it alone, and drops the new function. Exact
    throughout (a MAX over COUNT and a top-N), with windows archived, awaiting repair, and
    not materialized yet; and late again after the upgrade, before and after the repair."""
    clicks_per_minute(strata, "sr", "sr_minute")
    strata.create(
        "CREATE STREAM sr_max AS SELECT max(n) AS top, window_end AS t "
        "FROM TUMBLE(sr_minute, t, INTERVAL '5 minutes') GROUP BY window_end"
    )
    strata.create(
        "CREATE STREAM sr_top AS SELECT campaign, n, t FROM (SELECT campaign, n, t, "
        "ROW_NUMBER() OVER (PARTITION BY t ORDER BY n DESC, campaign) AS rn FROM sr_minute) x "
        "WHERE rn <= 2"
    )
    counts = (
        "SELECT campaign, count(*) AS n, date_bin('1 minute', t, timestamptz 'epoch') AS w "
        "FROM sr GROUP BY 1, 3"
    )
    oracles = {
        "sr_max": "SELECT max(n), date_bin('5 minutes', w, timestamptz 'epoch') "
        f"+ interval '5 minutes' FROM ({counts}) c GROUP BY 2",
        "sr_top": "SELECT campaign, n, w + interval '1 minute' FROM (SELECT campaign, n, w, "
        "row_number() OVER (PARTITION BY w ORDER BY n DESC, campaign) AS r "
        f"FROM ({counts}) c) x WHERE r <= 2",
    }
    engine, plans = strata.service.engine, strata.service.plans
    rng = random.Random(31)
    strata.ingest("sr", clicks(rng, 20))
    assert sum(Materializer(engine, plans).run_once().values()) > 0
    strata.ingest("sr", clicks(rng, 25, rows=60))  # late rows, and windows not archived yet

    def exact() -> bool:
        return views_equal_oracles(strata, oracles)

    def joined() -> list[bool]:
        made = []
        for view in oracles:
            function = naming.serial_awaiting_function(view)
            called = function in strata.query("SELECT pg_get_viewdef(%s::regclass)", view)[0][0]
            exists = strata.query("SELECT count(*) FROM pg_proc WHERE proname = %s", function)
            assert called == (exists == [(1,)])
            made.append(called)
        return made

    def corrected() -> int:
        return int(strata.query("SELECT count(*) FROM strata_catalog.corrections")[0][0])

    assert joined() == [True, True] and corrected() > 0 and exact()
    downgrade_to(engine, "0030")
    assert joined() == [False, False] and corrected() > 0 and exact()
    migrate(engine)
    assert joined() == [True, True] and exact()
    strata.ingest("sr", clicks(rng, 20, rows=40))  # late again, after the upgrade
    assert corrected() > 0 and exact()
    Repairer(engine, plans).run_once()
    assert corrected() == 0 and exact()


def test_aggregate_views_read_waiting_windows_by_their_list_after_the_upgrade(
    strata: Strata,
) -> None:
    """0032 makes each aggregate view of tumbling windows read the partial rows and states
    of its waiting windows window by window from their list: a read of one minute reaches
    the partial archive through its index, for that minute's rows, where it scanned every
    partial row and filtered them on ``window_start + interval`` (as after the downgrade).
    Exact throughout, with windows reduced, waiting, and both."""
    oracles = per_minute_and_hop(strata, "lw")
    rng = random.Random(32)
    reduced_and_late(strata, "lw", rng)
    archive = "lw_minute__partial"

    def exact() -> bool:
        return views_equal_oracles(strata, oracles)

    def filtered_out(query: str) -> int:
        """Partial rows ``query`` read from the archive and dropped by a filter."""
        plan = strata.query(f"EXPLAIN (ANALYZE, FORMAT JSON) {query}")[0][0][0]["Plan"]
        return sum(
            int(node.get("Rows Removed by Filter", 0))
            for node in plan_nodes(plan)
            if node.get("Relation Name") == archive
        )

    minute = "lw_minute"

    def minutes_read(scanned: bool) -> None:
        """A reduced minute with late rows and a minute not reduced yet, each read alone:
        exact, and the archive's other rows read and dropped (``scanned``) or not."""
        for k in (5, 25):
            end = datetime(2025, 5, 1, tzinfo=UTC) + timedelta(minutes=k + 1)
            waiting = strata.query(
                f"SELECT count(*) FROM strata_internal.{archive} WHERE window_start = %s",
                end - timedelta(minutes=1),
            )[0][0]
            assert waiting > 0
            query = f"SELECT * FROM {minute} WHERE t = '{end.isoformat()}'"
            assert (filtered_out(query) > 0) == scanned, query
            expected = [r for r in strata.query(oracles[minute]) if r[2] == end]
            assert expected and sorted(strata.query(query)) == sorted(expected)

    assert exact()
    minutes_read(scanned=False)
    downgrade_to(strata.service.engine, "0031")
    assert exact()
    minutes_read(scanned=True)
    migrate(strata.service.engine)
    assert exact()
    strata.ingest("lw", clicks(rng, 30))  # late again, after the upgrade
    assert exact()
    minutes_read(scanned=False)
    Reducer(strata.service.engine, strata.service.plans, min_rows=0).run_once()
    assert strata.query(f"SELECT count(*) FROM strata_internal.{archive}") == [(0,)]
    assert exact()
