"""Upgrades: a database left by an earlier release gets today's PostgreSQL functions at the
next start, and a start with nothing changed leaves them alone.

The migrations run frozen copies of the SQL they ran when written, so running them today
builds exactly the previous release's schema; the start-up install then brings the
functions of sql/ up to date (server/catalog.py install_functions)."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

from server import catalog
from server.catalog import MIGRATIONS_DIR, create_catalog_engine, migrate
from tests.conftest import new_database

# The head revision of the last release (0.1.0): its data dirs are migrated this far.
PREVIOUS_RELEASE_HEAD = "0006"

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
        assert stale.keys() == expected.keys()
        changed = {name for name in expected if stale[name] != expected[name]}
        assert changed == {
            "strata_window_start(timestamp with time zone,bigint)",
            "strata_kmv_union(bigint[])",
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


def test_the_migrations_alone_build_the_previous_releases_functions(
    pg_url: str, fresh_db: str
) -> None:
    """Frozen, they do not follow sql/: run today, they give what 0.1.0 installed, which
    is today's sql/ still (when sql/ changes, this test keeps the frozen copies honest:
    move the expectation to the functions' old definitions)."""
    migrate_only(fresh_db, PREVIOUS_RELEASE_HEAD)
    with fresh_install(pg_url) as expected:
        assert routines(fresh_db) == expected


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
