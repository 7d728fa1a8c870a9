"""A data dir of the previous release (6ff4ded) keeps working: its superuser gets a
password, its reader loses the grant on everything in public but the stream views.

The fixture (tests/fixtures/release_6ff4ded/, made by that release's own code with its
generate.py) holds the database - a pg_dump of streams, runs, an owner's table in public
and 0006's broad default privileges - and the pg_hba.conf that release leaves. The test
puts them into a cluster of its own, whose superuser has no password, as that release's
had none, and starts today's code on it: with PostgreSQL stopped, as after a clean stop,
and still running, as after a kill -9 of the old server.
"""

from __future__ import annotations

import subprocess
from decimal import Decimal
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from pyspark.sql import SparkSession

from server.engines.embedded_pg import POSTGRES_BIN_PATH, EmbeddedPostgres
from server.security import READER_ROLE, configure_reader
from tests.conftest import strata_client
from tests.test_auth import ROWS

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "release_6ff4ded"


def _without_password(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"postgres@{parts.hostname}:{parts.port}"))


def _as(url: str, user: str, password: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{user}:{password}@{parts.hostname}:{parts.port}"))


def make_old_data_dir(data_dir: Path) -> EmbeddedPostgres:
    """The data dir release 6ff4ded leaves, its PostgreSQL running (stop it if wanted)."""
    pg = EmbeddedPostgres(data_dir)
    url = pg.start()
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("ALTER ROLE postgres PASSWORD NULL")
        admin.execute(f"CREATE ROLE {READER_ROLE} NOLOGIN")  # as its migration 0006 did
        # Its rules (written over the file, which keeps its owner and mode).
        (pg.pgdata / "pg_hba.conf").write_text((FIXTURE / "pg_hba.conf").read_text())
        admin.execute("SELECT pg_reload_conf()")
    pg.password_file.unlink()
    subprocess.run(
        [str(POSTGRES_BIN_PATH / "psql"), _without_password(url), "-X", "-q"]
        + ["-v", "ON_ERROR_STOP=1", "-f", str(FIXTURE / "strata.sql")],
        check=True,
        capture_output=True,
    )
    return pg


@pytest.mark.parametrize("old_server", ["stopped", "running"])
def test_upgrade_from_the_previous_release(
    tmp_path: Path, spark: SparkSession, old_server: str
) -> None:
    data_dir = tmp_path / "postgres"
    old = make_old_data_dir(data_dir)
    old_url = _without_password(old.url)
    if old_server == "stopped":
        old.stop()
    new = EmbeddedPostgres(data_dir)
    try:
        url = new.start()
        # The superuser has a password now, kept owner-only, and needs it.
        password = new.password_file.read_text().strip()
        assert urlsplit(url).password == password
        assert new.password_file.stat().st_mode & 0o077 == 0
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(old_url).close()
        assert password not in new.log_file.read_text()

        with strata_client(url, spark, tmp_path / "strata") as strata:
            assert strata.query("SELECT version_num FROM strata_catalog.alembic_version") == [
                ("0009",)
            ]
            # The release's streams and runs are all there, and new runs join them.
            assert {s["name"] for s in strata.client.get("/streams").json()} == {
                "impsns",
                "impsn_count",
                "impsn_top",
            }
            assert strata.client.get("/runs/old-1").json()["status"] == "committed"
            strata.ingest("impsns", ROWS, run_id="new-1")
            assert strata.query("SELECT count(*) FROM impsns") == [(9,)]
            oracle = strata.query(
                "SELECT campaign, count(*), date_bin('1 minute', t, 'epoch') + '1 minute' "
                "FROM impsns GROUP BY 1, 3 ORDER BY 3, 1"
            )
            assert strata.query("SELECT campaign, c, t FROM impsn_count ORDER BY 3, 1") == oracle
            # The reader reads the stream views, old and new, and not the owner's table.
            strata.create("CREATE STREAM later (t timestamptz) WITH (event_time = 't')")
            configure_reader(strata.service.engine, "reader-pw")
            reader_url = _as(url, READER_ROLE, "reader-pw")
            with psycopg.connect(reader_url, autocommit=True) as reader:
                assert reader.execute("SELECT count(*) FROM impsns").fetchone() == (9,)
                assert reader.execute("SELECT sum(c) FROM impsn_count").fetchone() == (9,)
                assert reader.execute("SELECT max(top) FROM impsn_top").fetchone() == (6,)
                assert reader.execute("SELECT count(*) FROM later").fetchone() == (0,)
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    reader.execute("SELECT * FROM campaign_budgets")
            # Its owner can still read it, and grant it.
            assert strata.query("SELECT sum(budget) FROM campaign_budgets") == [(Decimal(350),)]
    finally:
        new.stop()
        old.stop()
