"""Creating and stopping the SparkSession Strata computes with.

The driver JVM runs in a session of its own. A terminal's Ctrl-C (SIGINT to the foreground
process group) and a kill of `strata up`'s process group reach `strata up` alone, which
then stops Spark itself, in order; pyspark's launcher also ties the JVM to our stdin pipe,
so it exits when we are gone, however we went. Signals that reach every process anyway
(`systemctl stop` signals the whole unit) may end the JVM before we stop it: stopping a
session whose JVM is gone, or goes meanwhile, is no error.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

import psutil
from pyspark import SparkConf, SparkContext
from pyspark.java_gateway import launch_gateway
from pyspark.sql import SparkSession, SQLContext

from server.engines.cluster import on_this_machine
from server.engines.java import find_java_home
from server.settings import DEFAULTS

log = logging.getLogger(__name__)

DEFAULT_MASTER = "local[*]"

# The driver JVM's options (see create_spark_session for why each).
DRIVER_JAVA_OPTIONS = "-Duser.timezone=UTC -XX:GCTimeRatio=4"

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
        # GCTimeRatio=4 (G1's default is 12): the heap grows only while collections take
        # more than a fifth of the time. Batches allocate fast but keep little (a warmed-up
        # driver held 80 MB live in a 1.3 GB heap); the smaller heap cut the ingest
        # benchmark's peak memory by about a third at the same speed. The heap's maximum
        # (STRATA_SPARK_DRIVER_MEMORY, 1g as in Spark) caps it: at 2g the ingest benchmark's
        # JVM still held 1.2 GB, at 1g 0.8 GB, at the same rows per second.
        "spark.driver.extraJavaOptions": DRIVER_JAVA_OPTIONS,
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
            # The default of 200 shuffle partitions makes small local jobs crawl; one per
            # core is as fast at a back-fill's chunk and faster at a run.
            "spark.sql.shuffle.partitions": str(local_cores(master)),
            # A batch is a few small jobs: re-planning each of them after every stage
            # (adaptive execution) costs more than it saves at that size (bench/ingest.py:
            # about a fifth of a 50,000-row batch's Spark time).
            "spark.sql.adaptive.enabled": "false",
            # Don't depend on the hostname resolving, nor listen beyond this machine.
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
        }
    conf |= extra_conf or {}

    started = time.monotonic()
    _launch_jvm(master, app_name, conf)
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in conf.items():
        builder = builder.config(key, value)
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


class Starting:
    """A SparkSession being made in a thread of its own, so that the caller starts something
    else meanwhile (`strata up` starts PostgreSQL and migrates its catalog while Spark's JVM
    starts: neither needs the other). pyspark then leaves SIGINT's handler alone, as it
    does for a context made outside the main thread."""

    def __init__(self, start: Callable[[], SparkSession]) -> None:
        self._session: SparkSession | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, args=(start,), name="strata-spark-start", daemon=True
        )
        self._thread.start()

    def _run(self, start: Callable[[], SparkSession]) -> None:
        try:
            self._session = start()
        except BaseException as error:  # noqa: BLE001 - raised again by result()
            self._error = error

    def result(self) -> SparkSession:
        """The session, once made; what its start raised, if it failed. A signal's
        handler interrupts the wait."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._session is not None
        return self._session

    def abandon(self, timeout: float) -> None:
        """The start-up was cut short: end the JVM being launched, and stop the session if
        it was made all the same, within about ``timeout`` seconds."""
        kill_driver_jvms()
        self._thread.join(timeout)
        if self._session is not None:
            stop_spark_session(self._session, max(1.0, timeout))
        # A JVM launched between the first kill and the thread's end, if any.
        kill_driver_jvms()


def local_cores(master: str) -> int:
    """The cores a local master uses: N of local[N], the machine's for local[*] and local."""
    if master == "local":
        return 1
    found = re.fullmatch(r"local(?:-cluster)?\[(\d+)(?:,.*)?\]", master)
    if found:
        return max(int(found.group(1)), 1)
    return os.cpu_count() or 1


def _launch_jvm(master: str, app_name: str, conf: dict[str, str]) -> None:
    """Start the driver JVM, as getOrCreate would, but in a session of its own (see the
    module docstring); no-op while one runs. The JVM gets every setting at launch, as
    getOrCreate would pass them (memory, Java options), which then makes the context."""
    with SparkContext._lock:
        if SparkContext._gateway is None:
            launch = SparkConf().setMaster(master).setAppName(app_name).setAll(list(conf.items()))
            gateway = launch_gateway(launch, popen_kwargs={"start_new_session": True})
            SparkContext._gateway = gateway
            SparkContext._jvm = gateway.jvm


def stop_spark_session(spark: SparkSession, timeout: float = 60.0) -> None:
    """Stop the session and its driver JVM within about `timeout` seconds (killing the JVM
    if it takes longer), and remove the temp dir create_spark_session made, if any. A JVM
    already gone, or going meanwhile, is only noted."""
    deadline = time.monotonic() + timeout
    proc = getattr(spark.sparkContext._gateway, "proc", None)
    if jvm_died(spark):
        log.info("Spark's JVM had already exited")
    else:
        # spark.stop() in a thread of its own: a JVM that hangs must not hold us beyond
        # the timeout, and we kill it below.
        failure: list[BaseException] = []

        def stop() -> None:
            try:
                spark.stop()
            except BaseException as error:  # noqa: BLE001 - reported below
                failure.append(error)

        stopping = threading.Thread(target=stop, name="strata-spark-stop", daemon=True)
        stopping.start()
        stopping.join(max(0.0, deadline - time.monotonic() - min(2.0, timeout / 4)))
        if stopping.is_alive():
            log.warning("Spark did not stop within %.1fs; killing its JVM", timeout)
        elif failure and not jvm_died(spark, 1.0):
            log.warning("Stopping Spark failed (%s); ending its JVM", failure[0])
        elif failure:
            log.info("Spark's JVM exited while it was being stopped")
    discard_spark_session(spark)
    if proc is not None:
        _end_jvm(proc, max(1.0, deadline - time.monotonic()))


def _end_jvm(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Let the driver JVM exit, as it does when our stdin pipe to it closes; kill it if it
    is still there after `timeout` seconds."""
    if proc.stdin is not None:
        with suppress(OSError):
            proc.stdin.close()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        log.warning("Spark's JVM (pid %d) did not exit; killing it", proc.pid)
        proc.kill()
        proc.wait()


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
    """Forget a session whose JVM died (or that was stopped), so that create_spark_session
    starts a new JVM.

    ``spark.stop()`` cannot be used on a dead JVM: it talks to it and fails before it
    resets pyspark's process-wide singletons, which would hand the dead session out again.
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


def kill_driver_jvms() -> None:
    """Kill every driver JVM this process started that still runs: one being launched
    when a stop cut the start short. Normally there is none."""
    for child in psutil.Process().children(recursive=True):
        with suppress(psutil.Error):
            if child.name() == "java":
                log.warning("killing Spark's JVM (pid %d), still running", child.pid)
                child.kill()


def driver_jvm(server_pid: int) -> psutil.Process | None:
    """The Spark driver JVM that the process ``server_pid`` (a `strata up`) runs, if any: for
    tools that watch a server from outside (benchmarks, crash tests)."""
    try:
        children = psutil.Process(server_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return None
    for child in children:
        try:
            if child.name() == "java":
                return child
        except psutil.Error:  # a child that ended since the listing (spark-submit's shell)
            continue
    return None
