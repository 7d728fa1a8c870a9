"""Creating and stopping the SparkSession Strata computes with."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import suppress
from pathlib import Path

import psutil
from pyspark import SparkContext
from pyspark.sql import SparkSession, SQLContext

from server.engines.cluster import on_this_machine
from server.engines.java import find_java_home
from server.settings import DEFAULTS

log = logging.getLogger(__name__)

DEFAULT_MASTER = "local[*]"

# Scratch dirs that create_spark_session made itself, removed again by stop_spark_session.
_owned_temp_dirs: dict[int, Path] = {}


def create_spark_session(
    master: str | None = None,
    *,
    app_name: str = "strata",
    local_dir: Path | None = None,
    driver_memory: str = DEFAULTS.spark_driver_memory,
    extra_conf: dict[str, str] | None = None,
) -> SparkSession:
    """Start (or return the running) SparkSession, configured the way Strata relies on.

    `local_dir` receives Spark's scratch files and warehouse; without one a temp dir is
    used, so that nothing is ever written to the current directory. `extra_conf` wins
    over every default. Needs no network: no spark.jars.packages.
    """
    master = master or DEFAULT_MASTER
    # spark-submit reads these from the environment when it launches the JVM.
    os.environ["JAVA_HOME"] = find_java_home()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    temp_dir: Path | None = None
    if local_dir is None:
        temp_dir = local_dir = Path(tempfile.mkdtemp(prefix="strata-spark-"))
    local_dir = Path(local_dir).resolve()
    (local_dir / "scratch").mkdir(parents=True, exist_ok=True)

    conf = {
        "spark.sql.session.timeZone": "UTC",
        # Errors (overflow, bad casts) instead of silent NULLs.
        "spark.sql.ansi.enabled": "true",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.ui.enabled": "false",
        # Keep the exact scale of decimal + - * as PostgreSQL does (raise on overflow under
        # ANSI) instead of rounding results to fewer decimals.
        "spark.sql.decimalOperations.allowPrecisionLoss": "false",
        # Progress bars would end up in the server's log.
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": driver_memory,
        # Timestamps without zone are interpreted the same in the JVM and in the session.
        "spark.driver.extraJavaOptions": "-Duser.timezone=UTC",
        "spark.executor.extraJavaOptions": "-Duser.timezone=UTC",
        "spark.local.dir": str(local_dir / "scratch"),
        "spark.sql.warehouse.dir": str(local_dir / "warehouse"),
        # No Hive: it would put metastore_db/ and derby.log in the current directory.
        "spark.sql.catalogImplementation": "in-memory",
        # The driver keeps the details of past jobs for the UI, which Strata never shows,
        # up to 1,000 jobs and SQL executions and 100,000 tasks by default: a long-running
        # server with a job per batch grows by that much. Keep only the recent ones.
        "spark.ui.retainedJobs": "50",
        "spark.ui.retainedStages": "50",
        "spark.ui.retainedTasks": "1000",
        "spark.sql.ui.retainedExecutions": "50",
    }
    if on_this_machine(master):  # local mode, or a standalone cluster on loopback
        # Otherwise Spark warns that the hostname resolves to a loopback address.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        conf |= {
            # The default of 200 shuffle partitions makes small local jobs crawl.
            "spark.sql.shuffle.partitions": "4",
            # Don't depend on the hostname resolving, nor listen beyond this machine.
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
        }
    conf |= extra_conf or {}

    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in conf.items():
        builder = builder.config(key, value)
    started = time.monotonic()
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    log.info("Spark session (%s) ready in %.1fs", master, time.monotonic() - started)
    if temp_dir is not None:
        if spark.sparkContext.getConf().get("spark.local.dir") == conf["spark.local.dir"]:
            _owned_temp_dirs[id(spark)] = temp_dir
        else:
            # getOrCreate returned a session that was already running: it never saw our conf.
            log.warning("Reusing the running SparkSession; its static settings are unchanged")
            shutil.rmtree(temp_dir, ignore_errors=True)
    return spark


def stop_spark_session(spark: SparkSession) -> None:
    """Stop the session and remove the temp dir create_spark_session made for it, if any."""
    if jvm_died(spark):  # nothing to stop, only to forget
        discard_spark_session(spark)
        return
    spark.stop()
    temp_dir = _owned_temp_dirs.pop(id(spark), None)
    if temp_dir is not None:
        shutil.rmtree(temp_dir, ignore_errors=True)


def jvm_pid(spark: SparkSession) -> int | None:
    """PID of the session's driver JVM while it runs (None once it died)."""
    proc = getattr(spark.sparkContext._gateway, "proc", None)  # set by pyspark's launcher
    return None if proc is None or proc.poll() is not None else int(proc.pid)


def jvm_died(spark: SparkSession, grace: float = 0.0) -> bool:
    """Whether the session's driver JVM exited (waiting up to ``grace`` seconds for it: a
    JVM being killed closes its sockets a moment before it is gone)."""
    proc = getattr(spark.sparkContext._gateway, "proc", None)
    if proc is None:
        return False
    with suppress(subprocess.TimeoutExpired):
        proc.wait(grace)
    return proc.poll() is not None


def discard_spark_session(spark: SparkSession) -> None:
    """Forget a session whose JVM died, so that create_spark_session starts a new JVM.

    ``spark.stop()`` cannot be used: it talks to the dead JVM and fails before it resets
    pyspark's process-wide singletons, which would hand the dead session out again.
    """
    context = spark.sparkContext
    context._jsc = None
    with suppress(Exception):
        context._accumulatorServer.shutdown()
    gateway = SparkContext._gateway
    if gateway is not None:
        with suppress(Exception):
            gateway.shutdown()
    with SparkContext._lock:
        SparkContext._gateway = None
        SparkContext._jvm = None
        SparkContext._active_spark_context = None
    SparkSession._instantiatedSession = None
    SparkSession._activeSession = None
    SQLContext._instantiatedContext = None
    temp_dir = _owned_temp_dirs.pop(id(spark), None)
    if temp_dir is not None:
        shutil.rmtree(temp_dir, ignore_errors=True)


def driver_jvm(server_pid: int) -> psutil.Process | None:
    """The Spark driver JVM that the process ``server_pid`` (a `strata up`) runs, if any: for
    tools that watch a server from outside (benchmarks, crash tests)."""
    try:
        children = psutil.Process(server_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return None
    return next((c for c in children if c.name() == "java"), None)
