"""A webhook sink's receiver for the tests, run as a process of its own (killed with -9 and
started again by them): it keeps the rows it was sent in SQLite, with the last position it
applied stored in the same transaction, as docs/sinks.md tells receivers to, and a ledger
of every change it applied.

    python -m tests.sink_receiver PORT DATABASE [--reply-delay S] [--fail-every N]

Each batch: changes at or below the stored position are skipped (a batch sent again after
its answer was lost), a snapshot replaces the rows, the rest are applied; then the
position. A change that does not follow the stored position is noted as a gap. Around the
transaction it appends ``applied N`` and, after ``--reply-delay`` seconds, ``answered N``
to DATABASE.log (fsynced), so a test can kill it between the two: applied, not answered.
``--fail-every N`` answers every N-th request 503 without applying it.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import threading
import time
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS rows (sink TEXT NOT NULL, key TEXT NOT NULL, row TEXT NOT NULL, "
    "PRIMARY KEY (sink, key))",
    "CREATE TABLE IF NOT EXISTS state (sink TEXT PRIMARY KEY, position INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS ledger (sink TEXT NOT NULL, kind TEXT NOT NULL, "
    "position INTEGER NOT NULL, op TEXT, key TEXT)",
)


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


class Receiver:
    def __init__(self, database: str, reply_delay: float, fail_every: int) -> None:
        self.database = database
        self.reply_delay = reply_delay
        self.fail_every = fail_every
        self.requests = 0
        self.lock = threading.Lock()  # one batch at a time, as a receiver's table would
        with self._connect() as connection:
            for statement in SCHEMA:
                connection.execute(statement)

    def _connect(self) -> sqlite3.Connection:
        connection = sqlite3.connect(self.database, isolation_level=None)
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=FULL")
        return connection

    def note(self, line: str) -> None:
        with open(self.database + ".log", "a", encoding="utf-8") as out:
            out.write(line + "\n")
            out.flush()
            os.fsync(out.fileno())

    def take(self, batch: dict[str, Any]) -> int:
        """Apply a batch; 200, or 503 for a request chosen to fail."""
        with self.lock:
            self.requests += 1
            if self.fail_every and self.requests % self.fail_every == 0:
                return 503
            connection = self._connect()
            try:
                connection.execute("BEGIN IMMEDIATE")
                self._apply(connection, batch)
                connection.execute("COMMIT")
            finally:
                connection.close()
            self.note(f"applied {batch['position']}")
        time.sleep(self.reply_delay)
        self.note(f"answered {batch['position']}")
        return 200

    @staticmethod
    def _apply(connection: sqlite3.Connection, batch: dict[str, Any]) -> None:
        sink, position = batch["sink"], batch["position"]
        found = connection.execute("SELECT position FROM state WHERE sink = ?", (sink,))
        stored = found.fetchone()
        last = None if stored is None else stored[0]
        if batch["snapshot"]:
            connection.execute("DELETE FROM rows WHERE sink = ?", (sink,))
            for change in batch["changes"]:
                connection.execute(
                    "INSERT INTO rows VALUES (?, ?, ?)",
                    (sink, canonical(change["key"]), canonical(change["new"])),
                )
            connection.execute(
                "INSERT INTO ledger VALUES (?, 'snapshot', ?, NULL, NULL)", (sink, position)
            )
            last = position
        else:
            for change in batch["changes"]:
                at = change["position"]
                if last is not None and at <= last:  # applied with an earlier copy of the batch
                    connection.execute(
                        "INSERT INTO ledger VALUES (?, 'skipped', ?, NULL, NULL)", (sink, at)
                    )
                    continue
                if last is not None and at != last + 1:
                    connection.execute(
                        "INSERT INTO ledger VALUES (?, 'gap', ?, NULL, NULL)", (sink, at)
                    )
                key = canonical(change["key"])
                if change["op"] == "delete":
                    connection.execute("DELETE FROM rows WHERE sink = ? AND key = ?", (sink, key))
                else:
                    connection.execute(
                        "INSERT INTO rows VALUES (?, ?, ?) ON CONFLICT (sink, key) DO UPDATE "
                        "SET row = excluded.row",
                        (sink, key, canonical(change["new"])),
                    )
                connection.execute(
                    "INSERT INTO ledger VALUES (?, 'change', ?, ?, ?)",
                    (sink, at, change["op"], key),
                )
                last = at
            last = position if last is None else last
        connection.execute(
            "INSERT INTO state VALUES (?, ?) ON CONFLICT (sink) DO UPDATE "
            "SET position = excluded.position",
            (sink, max(position, last)),
        )


def serve(port: int, receiver: Receiver) -> None:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers["content-length"]))
            batch = json.loads(body, parse_float=Decimal)
            status = receiver.take(batch)
            self.send_response(status)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("database")
    parser.add_argument("--reply-delay", type=float, default=0.0)
    parser.add_argument("--fail-every", type=int, default=0)
    args = parser.parse_args()
    serve(args.port, Receiver(args.database, args.reply_delay, args.fail_every))


if __name__ == "__main__":
    main()
