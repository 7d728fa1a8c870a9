"""The run spool: validated runs written durably (fsynced) before they are acknowledged.

A run is spooled as a Parquet file named by its catalog sequence number (never by the
client's run id), with that number in its run column, fsynced together with its
directory, and removed only after its rows are committed in PostgreSQL. On restart, every
pending run in the catalog is processed again from here. Spark (in local mode) reads the
files directly, which is several times faster than shipping the rows from the driver.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

# A run's file: RUN_PREFIX, its sequence number, .parquet (a file being written is hidden).
RUN_PREFIX = "run-"


@dataclass(frozen=True)
class Pending:
    """The spool's backlog: the bytes of its files, and the seconds since its oldest run
    file was written (0 when it holds none): how long the run longest waiting for its
    commit has waited since this spool took it (a run restored from PostgreSQL, where
    servers share a database: since its restore; a restart keeps the files and times)."""

    bytes: int
    oldest_seconds: float


class Spool:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)

    def write(self, seq: int, table: pa.Table) -> Path:
        # No compression: the file lives for seconds, and writing it is on the ack path.
        return self._place(seq, lambda partial: pq.write_table(table, partial, compression="none"))

    def restore(self, seq: int, body: bytes) -> Path:
        """Write a run's spool file from its Parquet bytes (kept in PostgreSQL when servers
        share the database: server/sharing/runs.py)."""
        return self._place(seq, lambda partial: partial.write_bytes(body))

    def _place(self, seq: int, write: Callable[[Path], object]) -> Path:
        final = self.directory / f"{RUN_PREFIX}{seq}.parquet"
        partial = self.directory / f".run-{seq}-{uuid.uuid4().hex}.tmp"
        write(partial)
        _fsync_path(partial)
        os.replace(partial, final)
        _fsync_path(self.directory)
        return final

    def holds(self, path: str | Path) -> bool:
        """Whether ``path`` is a file of this spool (not another server's)."""
        path = Path(path)
        return path.parent.resolve() == self.directory.resolve() and path.exists()

    def read(self, path: str | Path) -> pa.Table:
        return pq.read_table(path)

    def remove(self, path: str | Path) -> None:
        Path(path).unlink(missing_ok=True)

    def pending(self) -> Pending:
        """What waits in the spool, from one scan of the directory (one file per run):
        runs acknowledged and not yet committed, and runs being written."""
        total, now = 0, time.time()
        oldest = now
        with os.scandir(self.directory) as entries:
            for entry in entries:
                try:
                    stat = entry.stat()
                except FileNotFoundError:  # committed (or renamed) meanwhile
                    continue
                total += stat.st_size
                if entry.name.startswith(RUN_PREFIX):  # not a run being written
                    oldest = min(oldest, stat.st_mtime)
        return Pending(total, max(0.0, now - oldest))

    def sweep(self, keep: set[str]) -> int:
        """Delete spool files no pending run refers to (left by a crash before the claim).
        Only at start, before this server takes runs: no other process writes here (servers
        sharing a database each have their own data directory, and keep the bodies of
        their runs in PostgreSQL besides)."""
        removed = 0
        for path in self.directory.iterdir():
            if str(path) not in keep:
                path.unlink(missing_ok=True)
                removed += 1
        return removed


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
