"""Peak memory of a running Strata server, its Spark JVM and its embedded PostgreSQL.

Memory is counted as PSS (proportional set size, /proc/<pid>/smaps_rollup): a page shared
by several processes (PostgreSQL's shared buffers, mapped by every backend) counts once in
all, split among them, so the processes' figures add up. The sampler reads every process
of the server's tree (the Spark driver JVM is its child) and of the embedded PostgreSQL's
postmaster (``PGDATA/postmaster.pid``; PostgreSQL runs detached from the server).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import psutil

MB = 1024 * 1024


@dataclass
class Peak:
    """The largest sum of the processes' PSS seen at one sample, in MB, and its parts."""

    total_mb: float = 0.0
    parts_mb: dict[str, float] = field(default_factory=dict)
    samples: int = 0

    def describe(self) -> str:
        parts = ", ".join(f"{name} {mb:,.0f}" for name, mb in self.parts_mb.items())
        return f"peak memory {self.total_mb:,.0f} MB ({parts}; PSS)"


def _group(process: psutil.Process, server_pid: int) -> str:
    if process.pid == server_pid:
        return "server"
    name = process.name()
    return "Spark JVM" if name == "java" else "PostgreSQL" if "postgres" in name else "server"


class PeakMemory:
    """A background sampler (``with PeakMemory(pid, pgdata) as peak:``) of the summed PSS of
    the server's processes every ``interval`` seconds; ``peak`` holds the largest sum."""

    def __init__(self, server_pid: int, pgdata: Path | None, interval: float = 0.2) -> None:
        self.server_pid = server_pid
        self.pgdata = pgdata
        self.interval = interval
        self.peak = Peak()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peak-memory", daemon=True)

    def __enter__(self) -> Peak:
        self.sample()
        self._thread.start()
        return self.peak

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def _roots(self) -> list[int]:
        roots = [self.server_pid]
        pid_file = self.pgdata / "postmaster.pid" if self.pgdata else None
        if pid_file is not None and pid_file.exists():
            first = pid_file.read_text().split("\n", 1)[0].strip()
            if first.isdigit():
                roots.append(int(first))
        return roots

    def sample(self) -> None:
        parts: dict[str, float] = {}
        seen: set[int] = set()
        for root in self._roots():
            try:
                top = psutil.Process(root)
                processes = [top, *top.children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
            for process in processes:
                if process.pid in seen:
                    continue
                seen.add(process.pid)
                try:
                    pss = process.memory_full_info().pss / MB
                    group = _group(process, self.server_pid)
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue  # a backend that ended between the listing and the read
                parts[group] = parts.get(group, 0.0) + pss
        self.peak.samples += 1
        total = sum(parts.values())
        if total > self.peak.total_mb:
            self.peak.total_mb = total
            self.peak.parts_mb = dict(sorted(parts.items()))
