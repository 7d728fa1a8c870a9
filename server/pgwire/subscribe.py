"""A stream's change feed over the SQL port (server/feed/), in the forms psql and psycopg
users know from Materialize: ``DECLARE c CURSOR FOR SUBSCRIBE name [SINCE n]`` then
``FETCH n c WITH (timeout = '1s')``, and ``COPY (SUBSCRIBE name) TO STDOUT``, whose rows
psql prints as they come.

A subscription without SINCE starts with the stream's rows (inserts at the position they
are current at, cause ``snapshot``), then every change after; with SINCE n, the changes
after position n. Each row is one change, with the HTTP feed's fields as columns. A
subscription cursor belongs to the session, not to a transaction: it lives until CLOSE
or the end of the connection. Exactly once is the client's to keep: it stores the last
position it applied in the same transaction as what it applied, and resumes with SINCE.
"""

from __future__ import annotations

from server.feed import Change, Feed, open_feed
from server.pgwire.statements import Subscribe
from server.service import StrataService

INT8_OID, TEXT_OID, BOOL_OID, FLOAT8_OID, JSONB_OID = 20, 25, 16, 701, 3802
COLUMNS: list[tuple[str, int]] = [
    ("position", INT8_OID),
    ("op", TEXT_OID),
    ("key", JSONB_OID),
    ("old", JSONB_OID),
    ("new", JSONB_OID),
    ("late", BOOL_OID),
    ("lateness_seconds", FLOAT8_OID),
    ("revision", INT8_OID),
    ("cause", TEXT_OID),
]
# How often a waiting FETCH or a COPY (SUBSCRIBE ...) looks for new changes.
POLL_SECONDS = 0.1


class Subscription:
    """A subscriber's place in a feed: the snapshot rows not delivered yet, then the feed."""

    def __init__(self, feed: Feed, first: list[Change]) -> None:
        self.feed = feed
        self.pending = list(first)

    def take(self, limit: int | None) -> list[Change]:
        """Up to ``limit`` (None: every) change there is now; blocks on PostgreSQL."""
        taken = self.pending if limit is None else self.pending[:limit]
        self.pending = self.pending[len(taken) :]
        room = None if limit is None else limit - len(taken)
        if room is None or room > 0:
            taken = taken + self.feed.poll(room or 10_000)
        return taken


def subscribe(service: StrataService, statement: Subscribe) -> Subscription:
    """Open a subscription (following the stream from now if nobody did); raises what the
    HTTP feed answers 4xx for (no such stream, no feed for it, a position not kept)."""
    feed, first = open_feed(
        service.engine,
        service.plans,
        statement.name.name,
        since=statement.since,
        snapshot=statement.since is None,
    )
    return Subscription(feed, first)


def row_of(change: Change) -> list[str | None]:
    """A change as a row of COLUMNS, in text format."""
    return [str(change.position), *change.fields]


def copy_line(change: Change) -> bytes:
    """A change as a line of COPY's text format: tab-separated, \\N for NULL."""
    return "\t".join(_copy_text(v) for v in row_of(change)).encode() + b"\n"


def _copy_text(value: str | None) -> str:
    if value is None:
        return "\\N"
    return (
        value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
    )
