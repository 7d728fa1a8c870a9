"""A Spark standalone cluster on this machine's loopback: one Master and N Workers.

Started with the ``spark-class`` launcher that ships in the pyspark package (no Spark
download), with the Java runtime ``server.engines.java`` finds, on free ports of 127.0.0.1 and with
every file (logs, work dirs) in one directory. ``strata cluster`` runs one until Ctrl-C;
the cluster tests and ``bench/scaleout.py`` start their own::

    with LocalCluster(workers=2) as cluster:
        os.environ["STRATA_SPARK_MASTER"] = cluster.master_url

Each daemon is a process group of its own (a Worker's executors are its children), which
``stop`` ends: SIGTERM, then SIGKILL after a grace period.

Executors of such a cluster run on this machine, so they read the spool's Parquet files
at the driver's paths (``executors_share_disk``); a real cluster needs the data dir on
storage every machine mounts at the same path, or rows are shipped from the driver.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from contextlib import suppress
from pathlib import Path
from types import TracebackType
from typing import IO, Any
from urllib.parse import urlsplit

import pyspark

from server.engines.java import find_java_home
from server.errors import ClusterError
from server.net import free_port

log = logging.getLogger(__name__)

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


def spark_home() -> Path:
    """The Spark distribution inside the pyspark package (bin/spark-class, jars/)."""
    return Path(pyspark.__file__).resolve().parent


def master_hosts(master: str) -> list[str]:
    """Hosts of a standalone master URL (``spark://h1:7077,h2:7077`` names several); []
    for any other kind of master."""
    if not master.startswith("spark://"):
        return []
    return [urlsplit(f"spark://{part}").hostname or "" for part in master[8:].split(",")]


def on_this_machine(master: str) -> bool:
    """Whether every executor of ``master`` runs on this machine: local mode, or a
    standalone master on loopback (its workers must then be local too)."""
    if master.startswith("local"):
        return True
    hosts = master_hosts(master)
    return bool(hosts) and all(host in LOOPBACK_HOSTS for host in hosts)


def executors_share_disk(master: str, shared_storage: bool | None = None) -> bool:
    """Whether executors can read files the driver wrote at the driver's paths (the spool's
    and back-fill's Parquet files). ``shared_storage`` (STRATA_SHARED_SPOOL) decides when
    set; unset, only executors on this machine are assumed to."""
    return on_this_machine(master) if shared_storage is None else shared_storage


class _Daemon:
    """One Master or Worker JVM: ``spark-class`` execs java, so the pid is the JVM's."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], logs: Path) -> None:
        self.name = name
        self.log = logs / f"{name}.log"
        self._out: IO[bytes] = self.log.open("ab")
        self.process = subprocess.Popen(
            ["bash", str(spark_home() / "bin" / "spark-class"), *args],
            stdin=subprocess.DEVNULL,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its own process group, executors included
        )

    def running(self) -> bool:
        return self.process.poll() is None

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def send(self, sig: int) -> None:
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, sig)

    def stop(self, grace: float) -> None:
        if self.running():
            self.send(signal.SIGTERM)
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                self.send(signal.SIGKILL)
                self.process.wait(10)
        # Executors the Worker started may outlive a JVM that ignored SIGTERM's group kill.
        self.send(signal.SIGKILL)
        self._out.close()


class LocalCluster:
    """A standalone Master and ``workers`` Workers of ``cores`` cores and ``memory`` each,
    listening on 127.0.0.1 only. ``directory`` holds their logs and work dirs (a temp dir,
    removed by ``stop``, when not given)."""

    def __init__(
        self,
        workers: int = 1,
        *,
        cores: int = 1,
        memory: str = "1g",
        port: int | None = None,
        webui_port: int | None = None,
        directory: Path | None = None,
        daemon_memory: str = "256m",
        join: str | None = None,
    ) -> None:
        """``join``: the URL of a running Master (``spark://127.0.0.1:7077``) to add the
        Workers to, instead of starting a Master."""
        if workers < 0 or cores < 1:
            raise ValueError("workers must be >= 0 and cores >= 1")
        self.join = join
        self.workers_wanted = workers
        self.cores = cores
        self.memory = memory
        self.port = port
        self.webui_port = webui_port
        self.daemon_memory = daemon_memory
        self._own_directory = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix="strata-cluster-"))
        self.master: _Daemon | None = None
        self.workers: list[_Daemon] = []
        self._ui_ports: list[int] = []  # each Worker's web UI, by which the Master names it

    @property
    def master_url(self) -> str:
        return self.join or f"spark://127.0.0.1:{self.port}"

    @property
    def web_url(self) -> str:
        """The Master's web UI; ``/json/`` below it is the cluster's state."""
        return f"http://127.0.0.1:{self.webui_port}"

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
        conf = self.directory / "conf"  # empty: no spark-env.sh or defaults from elsewhere
        conf.mkdir(parents=True, exist_ok=True)
        return env | {
            "JAVA_HOME": find_java_home(),
            "SPARK_HOME": str(spark_home()),
            "SPARK_CONF_DIR": str(conf),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOCAL_HOSTNAME": "127.0.0.1",
            "SPARK_LOG_DIR": str(self.directory / "logs"),
            "SPARK_DAEMON_MEMORY": self.daemon_memory,
            # Executors run Python (if ever) with the same interpreter as the driver.
            "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
        }

    def start(self, timeout: float = 180.0) -> LocalCluster:
        """Start the Master and the Workers; return once every Worker is registered."""
        deadline = time.monotonic() + timeout
        (self.directory / "logs").mkdir(parents=True, exist_ok=True)
        try:
            if self.join is None:
                self._start_master(deadline)
            for _ in range(self.workers_wanted):
                self._start_worker()
            if self.join is None:
                self.wait_for_workers(len(self.workers), deadline - time.monotonic())
        except BaseException:
            self.stop()
            raise
        log.info(
            "Spark standalone cluster %s: %d workers (%d core, %s each); UI %s",
            self.master_url,
            len(self.workers),
            self.cores,
            self.memory,
            self.web_url,
        )
        return self

    def _start_master(self, deadline: float) -> None:
        chosen = bool(self.port)  # None or 0: free ports, and another try on a clash
        for _attempt in range(3):  # a free port may be taken before the Master binds it
            self.port = self.port or free_port()
            self.webui_port = self.webui_port or free_port()
            self.master = _Daemon(
                "master",
                [
                    MASTER_CLASS,
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--webui-port",
                    str(self.webui_port),
                ],
                self._env(),
                self.directory / "logs",
            )
            while time.monotonic() < deadline and self.master.running():
                if self._state() is not None:
                    return
                time.sleep(0.5)
            if self.master.running():
                break  # timed out, not a port clash
            self.master.stop(5)
            if chosen:
                break
            self.port = self.webui_port = None
        tail = self.master.tail() if self.master else ""
        raise ClusterError(f"the Spark Master did not start:\n{tail}")

    def add_worker(self, timeout: float = 120.0) -> int:
        """Start one more Worker while the cluster runs; return its index once the Master
        has it as alive (the applications running get an executor on it)."""
        self._start_worker()
        index = len(self.workers) - 1
        deadline = time.monotonic() + timeout
        port = self._ui_ports[index]
        while time.monotonic() < deadline:
            if not self.workers[index].running():
                raise ClusterError(f"Spark worker-{index} exited:\n{self.workers[index].tail()}")
            workers = (self._state() or {}).get("workers", [])
            if any(
                w.get("state") == "ALIVE" and str(w.get("webuiaddress", "")).endswith(f":{port}")
                for w in workers
            ):
                return index
            time.sleep(0.3)
        raise ClusterError(f"Spark worker-{index} did not register in time")

    def kill_worker(self, index: int) -> None:
        """SIGKILL Worker ``index`` and its executors (its process group), as a machine
        that dies takes them: tasks running there are lost, and Spark runs them again."""
        worker = self.workers[index]
        worker.send(signal.SIGKILL)
        worker.process.wait(30)

    def _start_worker(self) -> None:
        index = len(self.workers)
        self._ui_ports.append(free_port())
        work = self.directory / f"worker-{index}"
        (work / "scratch").mkdir(parents=True, exist_ok=True)
        # Executors' scratch (shuffle) files: under the cluster's directory, not /tmp.
        env = self._env() | {"SPARK_LOCAL_DIRS": str(work / "scratch")}
        self.workers.append(
            _Daemon(
                f"worker-{index}",
                [
                    WORKER_CLASS,
                    "--host",
                    "127.0.0.1",
                    "--webui-port",
                    str(self._ui_ports[index]),
                    "--cores",
                    str(self.cores),
                    "--memory",
                    self.memory,
                    "--work-dir",
                    str(work),
                    self.master_url,
                ],
                env,
                self.directory / "logs",
            )
        )

    def _state(self) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(f"{self.web_url}/json/", timeout=5) as response:
                return json.loads(response.read())  # type: ignore[no-any-return]
        except (OSError, urllib.error.URLError, ValueError):
            return None

    def state(self) -> dict[str, Any]:
        """The Master's view of the cluster (aliveworkers, cores, activeapps, ...)."""
        state = self._state()
        if state is None:
            raise ClusterError("the Spark Master does not answer")
        return state

    def alive_workers(self) -> int:
        return int(self.state().get("aliveworkers", 0))

    def wait_for_workers(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + max(timeout, 1.0)
        while time.monotonic() < deadline:
            dead = [w for w in self.workers if not w.running()]
            if dead:
                raise ClusterError(f"Spark {dead[0].name} exited:\n{dead[0].tail()}")
            state = self._state()
            if state is not None and int(state.get("aliveworkers", 0)) >= count:
                return
            time.sleep(0.5)
        tails = "\n".join(f"--- {w.name}\n{w.tail(1500)}" for w in self.workers)
        raise ClusterError(f"{count} Spark workers did not register in time:\n{tails}")

    def stop(self, grace: float = 15.0) -> None:
        """Stop the Workers (and their executors), then the Master; remove a temp dir."""
        for worker in reversed(self.workers):
            worker.stop(grace)
        if self.master is not None:
            self.master.stop(grace)
        self.workers, self.master, self._ui_ports = [], None, []
        if self._own_directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
