"""`strata load`: files, directories, globs or stdin, CSV or NDJSON, cut into runs of a
chosen number of rows and posted with bounded concurrency (to one node, or failing over
between the nodes of a cluster). Each run's id is derived from its file and byte offset and
a hash of its bytes, so that running the same command again loads nothing twice: the
server answers a known run id with its first result. A run refused for its content stops
the load with the file and line at fault.
"""

from __future__ import annotations

import glob
import hashlib
import re
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from server.client import FailoverClient, RunRefused

CONTENT_TYPES = {"csv": "text/csv", "ndjson": "application/x-ndjson"}


@dataclass(frozen=True)
class Chunk:
    """One run of a load: the lines [first_line, last_line] of ``source`` (1-based, a CSV
    header not counted in them but sent first)."""

    source: str
    offset: int
    first_line: int
    last_line: int
    rows: int
    body: bytes
    header_lines: int  # lines of the body before the first data line (a CSV header)

    @property
    def run_id(self) -> str:
        name = re.sub(r"[^A-Za-z0-9._/-]", "_", self.source)[-80:]
        digest = hashlib.sha256(self.body).hexdigest()[:16]
        return f"load:{name}@{self.offset}:{digest}"

    def line_of(self, body_line: int) -> int:
        """The file's line for line ``body_line`` of this run's body (1-based)."""
        if body_line <= self.header_lines:
            return body_line
        return self.first_line + body_line - self.header_lines - 1


class LoadFailed(Exception):  # noqa: N818 - what the user reads
    """A run was refused for its content: names the file and line."""


def sources(paths: list[str]) -> Iterator[str]:
    """Every file the arguments name, in a stable order: a directory's files (recursively,
    sorted), a glob's matches (sorted), ``-`` for stdin."""
    for path in paths:
        if path == "-":
            yield path
            continue
        if any(c in path for c in "*?["):
            matches = sorted(glob.glob(path, recursive=True))
            if not matches:
                raise LoadFailed(f"{path}: no file matches")
            yield from (m for m in matches if Path(m).is_file())
            continue
        given = Path(path)
        if given.is_dir():
            yield from (str(p) for p in sorted(given.rglob("*")) if p.is_file())
        elif given.is_file():
            yield path
        else:
            raise LoadFailed(f"{path}: no such file or directory")


def format_of(source: str, given: str | None) -> str:
    if given:
        return given
    return "csv" if source.lower().endswith((".csv", ".csv.txt")) else "ndjson"


def chunks(source: str, stream: BinaryIO, fmt: str, run_rows: int) -> Iterator[Chunk]:
    """Cut one file into runs of at most ``run_rows`` rows. A CSV file's header goes with
    every run; a CSV record never splits (a quoted field may hold line breaks)."""
    header = b""
    header_lines = 0
    offset = 0
    line_no = 0
    if fmt == "csv":
        header = stream.readline()
        offset, line_no, header_lines = len(header), 1, 1
    pending: list[bytes] = []
    rows = 0
    start_offset, start_line = offset, line_no + 1
    quoted = False
    for line in stream:
        line_no += 1
        pending.append(line)
        if fmt == "csv":
            quoted ^= line.count(b'"') % 2 == 1
            if quoted:
                continue  # the record goes on in the next line
        if line.strip():
            rows += 1
        if rows >= run_rows:
            body = header + b"".join(pending)
            yield Chunk(source, start_offset, start_line, line_no, rows, body, header_lines)
            start_offset += sum(len(p) for p in pending)
            start_line = line_no + 1
            pending, rows = [], 0
    if rows:
        body = header + b"".join(pending)
        yield Chunk(source, start_offset, start_line, line_no, rows, body, header_lines)


@dataclass
class Progress:
    runs: int = 0
    rows: int = 0
    started: float = 0.0

    def line(self) -> str:
        seconds = max(time.monotonic() - self.started, 1e-9)
        return f"{self.runs:,} runs, {self.rows:,} rows, {self.rows / seconds:,.0f} rows/s"


def load(
    stream: str,
    paths: list[str],
    nodes: list[str],
    *,
    fmt: str | None = None,
    run_rows: int = 20_000,
    concurrency: int = 4,
    token: str | None = None,
    wait_commit: bool = False,
    deadline: float = 600.0,
    quiet: bool = False,
) -> Progress:
    """Load every file of ``paths`` into raw stream ``stream``; returns what was posted.
    Raises LoadFailed naming the file and line of the first run refused."""
    progress = Progress(started=time.monotonic())
    lock = threading.Lock()
    shown = [0.0]

    def post(client: FailoverClient, chunk: Chunk, content_type: str) -> None:
        try:
            client.post_run(
                stream,
                chunk.body,
                run_id=chunk.run_id,
                content_type=content_type,
                wait=wait_commit,
            )
        except RunRefused as refused:
            said = refused.body if isinstance(refused.body, dict) else {"error": refused.body}
            line = said.get("line")
            where = (
                f"{chunk.source}:{chunk.line_of(line)}"
                if isinstance(line, int)
                else f"{chunk.source}:{chunk.first_line}-{chunk.last_line}"
            )
            # The server counts lines in the run's body: the file's line replaces it.
            error = re.sub(r"^line \d+, ", "", str(said.get("error")))
            raise LoadFailed(f"{where}: {error}") from None
        with lock:
            progress.runs += 1
            progress.rows += chunk.rows
            now = time.monotonic()
            if not quiet and now - shown[0] > 1:
                shown[0] = now
                print(f"\rstrata load: {progress.line()}", end="", file=sys.stderr, flush=True)

    with (
        FailoverClient(nodes, token=token, timeout=120, deadline=deadline) as client,
        ThreadPoolExecutor(concurrency) as pool,
    ):
        running: set[Future[None]] = set()
        for source in sources(paths):
            fmt_here = format_of(source, fmt)
            opened = sys.stdin.buffer if source == "-" else open(source, "rb")  # noqa: SIM115
            try:
                for chunk in chunks(source, opened, fmt_here, run_rows):
                    if len(running) >= concurrency * 2:  # bounded: the rest waits unread
                        done, running = wait(running, return_when=FIRST_COMPLETED)
                        for future in done:
                            future.result()
                    running.add(pool.submit(post, client, chunk, CONTENT_TYPES[fmt_here]))
            finally:
                if opened is not sys.stdin.buffer:
                    opened.close()
        for future in running:
            future.result()
    if not quiet:
        print(f"\rstrata load: {progress.line()}", file=sys.stderr, flush=True)
    return progress
