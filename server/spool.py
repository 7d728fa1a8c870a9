"""The run spool: validated runs written durably (fsynced) before they are acknowledged.

A run is spooled as an Arrow IPC file named by a fresh UUID (never by the client's run
id), fsynced together with its directory, and removed only after its rows are committed
in PostgreSQL. On restart, every pending run in the catalog is processed again from here.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pyarrow as pa


class Spool:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)

    def write(self, table: pa.Table) -> Path:
        final = self.directory / f"{uuid.uuid4().hex}.arrow"
        partial = final.with_suffix(".tmp")
        with pa.OSFile(str(partial), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        _fsync_path(partial)
        os.replace(partial, final)
        _fsync_path(self.directory)
        return final

    def read(self, path: str | Path) -> pa.Table:
        with pa.memory_map(str(path), "r") as source:
            return pa.ipc.open_file(source).read_all()

    def remove(self, path: str | Path) -> None:
        Path(path).unlink(missing_ok=True)

    def sweep(self, keep: set[str]) -> int:
        """Delete spool files no pending run refers to (left by a crash before the claim)."""
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
