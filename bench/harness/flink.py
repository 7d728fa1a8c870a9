"""Apache Flink SQL as a baseline (peer_flink): what a Flink user runs to get windowed
aggregates of files, in a local mini-cluster of PyFlink (``apache-flink`` from PyPI; its
JVM is the Java runtime Strata finds, server/engines/java.py: nothing is downloaded at run
time, no connector jar beyond those PyFlink ships).

PyFlink cannot share Strata's virtual environment: it pins py4j 0.10.9.7 (pyspark 4.0 pins
0.10.9.9), pandas < 2.3 and pyarrow < 21. So it lives in a virtual environment of its own,
``.venv-flink`` beside ``.venv`` (``STRATA_FLINK_VENV`` names another), made and filled on
first use with the requirements of pyproject.toml's ``[tool.strata.bench] flink``, and the
Flink side of a benchmark runs there as a subprocess (bench/harness/flink_worker.py),
driven by a JSON spec of Flink SQL statements; its results are CSV files that this side
COPYs into PostgreSQL, where they are checked like any engine's.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import tomllib
import venv
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psycopg

from bench.harness.errors import BenchError
from server.engines.java import find_java_home

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().parent / "flink_worker.py"
MARK = "FLINK-RESULT "
# What every job runs with: one task slot's worth (parallelism 1), times in UTC.
CONFIG = {
    "parallelism.default": "1",
    "table.exec.resource.default-parallelism": "1",
    "table.local-time-zone": "UTC",
}
# The ISO instants of the generated CSV (2024-01-01T01:02:03.004Z) as Flink's CSV format
# reads a TIMESTAMP(3) (2024-01-01 01:02:03.004, UTC by the session's zone).
_ISO = re.compile(rb"(\d{4}-\d\d-\d\d)T(\d\d:\d\d:\d\d(?:\.\d+)?)Z")


def requirements() -> list[str]:
    """The packages of Flink's environment (pyproject.toml, ``[tool.strata.bench] flink``)."""
    with (ROOT / "pyproject.toml").open("rb") as file:
        project = tomllib.load(file)
    found: list[str] = project["tool"]["strata"]["bench"]["flink"]
    return found


def venv_dir() -> Path:
    return Path(os.environ.get("STRATA_FLINK_VENV") or ROOT / ".venv-flink")


def ensure_flink() -> Path:
    """The Python of Flink's virtual environment, made and filled first if it is not (or holds
    other requirements than pyproject.toml's): a few minutes the first time, from PyPI."""
    home = venv_dir()
    python = home / "bin" / "python"
    stamp = home / ".installed"
    wanted = "\n".join(requirements())
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    print(f"installing {', '.join(requirements())} into {home}", flush=True)
    venv.EnvBuilder(with_pip=True, clear=True).create(home)
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", *requirements()],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise BenchError(f"installing Flink failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    stamp.write_text(wanted)
    return python


@dataclass
class FlinkJob:
    """One Flink job: ``statements`` (the source and sink tables) once, then ``inserts`` as
    one job ``runs`` times, each after emptying ``outputs`` (the sinks' directories)."""

    name: str
    statements: list[str]
    inserts: list[str]
    outputs: list[str]
    runs: int = 2
    reset: list[str] = field(default_factory=list)  # before each run (DROP TABLE of a CTAS)


@dataclass
class FlinkRun:
    wall_s: float  # from submitting the job until it finished, as a user waits for it
    net_s: float  # Flink's net runtime of the job (without its submission)


@dataclass
class FlinkOutcome:
    runs: dict[str, list[FlinkRun]]  # of the jobs that ran
    seconds: float  # the whole subprocess, JVM start included
    errors: dict[str, str] = field(default_factory=dict)  # why the others did not
    log: list[str] = field(default_factory=list)

    def of(self, name: str) -> list[FlinkRun]:
        """The runs of job ``name``; BenchError if it failed."""
        if name in self.errors:
            raise BenchError(f"Flink job {name} failed: {self.errors[name]}")
        return self.runs[name]


def run_flink(jobs: list[FlinkJob], work: Path, timeout: float = 1800.0) -> FlinkOutcome:
    """Run ``jobs`` one after the other in one PyFlink process (one JVM) of Flink's
    environment; returns each job's runs. Raises BenchError with the output's tail when
    the process fails."""
    python = ensure_flink()
    work.mkdir(parents=True, exist_ok=True)
    spec = work / "flink-spec.json"
    spec.write_text(json.dumps({"config": CONFIG, "jobs": [asdict(job) for job in jobs]}))
    logs = work / "flink-log"
    logs.mkdir(exist_ok=True)
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")
    }
    env |= {
        "JAVA_HOME": find_java_home(),
        "FLINK_LOG_DIR": str(logs),
        "JVM_ARGS": "-Duser.timezone=UTC",
        "TZ": "UTC",
    }
    started = time.monotonic()
    try:
        done = subprocess.run(
            [str(python), str(WORKER), str(spec)],
            capture_output=True,
            text=True,
            env=env,
            cwd=work,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as timed_out:
        raise BenchError(f"Flink did not finish within {timeout:.0f}s") from timed_out
    seconds = time.monotonic() - started
    lines = done.stdout.splitlines()
    found = [line for line in lines if line.startswith(MARK)]
    if done.returncode != 0 or not found:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-60:])
        raise BenchError(f"Flink failed (exit code {done.returncode}):\n{tail}")
    raw = json.loads(found[-1][len(MARK) :])
    runs = {
        name: [FlinkRun(**run) for run in job_runs]
        for name, job_runs in raw.items()
        if isinstance(job_runs, list)
    }
    errors = {name: said["error"] for name, said in raw.items() if isinstance(said, dict)}
    log = [line for line in lines if not line.startswith(MARK)]
    return FlinkOutcome(runs, seconds, errors, log)


def flink_csv(bodies: Iterable[bytes], path: Path) -> None:
    """The CSV bodies (each with a header line) as one file of Flink's CSV, in their order:
    headers dropped, instants as Flink reads them. One file is one split, read in order by
    a source of parallelism 1, so Flink takes the rows in the order the runs arrive."""
    with path.open("wb") as out:
        for body in bodies:
            out.write(_ISO.sub(rb"\1 \2", body[body.index(b"\n") + 1 :]))


def read_output(directory: Path) -> bytes:
    """The rows a filesystem sink wrote into ``directory``: its finished part files (an
    unfinished one is hidden, its name starting with a dot)."""
    parts = sorted(p for p in directory.rglob("*") if p.is_file() and not p.name.startswith("."))
    return b"".join(p.read_bytes() for p in parts)


def copy_output(
    database_url: str, directory: Path, table: str, columns: str, *, search_path: str = ""
) -> int:
    """COPY Flink's output in ``directory`` (CSV, instants in UTC, an empty field NULL) into a
    new PostgreSQL table ``table`` of ``columns`` (column definitions, or ``AS SELECT ...
    WITH NO DATA``); returns its rows."""
    body = read_output(directory)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("SET TIME ZONE 'UTC'")
        if search_path:
            conn.execute(f"SET search_path TO {search_path}")  # type: ignore[arg-type]
        conn.execute(f"DROP TABLE IF EXISTS {table}")  # type: ignore[arg-type]
        definition = columns if columns.startswith("AS ") else f"({columns})"
        conn.execute(f"CREATE TABLE {table} {definition}")  # type: ignore[arg-type]
        with conn.cursor() as cursor:
            with cursor.copy(f"COPY {table} FROM STDIN (FORMAT csv)") as copy:  # type: ignore[arg-type]
                copy.write(body)
            row = cursor.execute(f"SELECT count(*) FROM {table}").fetchone()  # type: ignore[arg-type]
    return int(row[0]) if row else 0


if __name__ == "__main__":  # python -m bench.harness.flink: make Flink's environment
    print(ensure_flink())
    sys.exit(0)
