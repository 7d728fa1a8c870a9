"""The service's errors: what a request, a run or a start-up can meet beyond the rewriter's
SQL errors (rewriter/errors.py). server/api/errors.py maps the StrataError ones onto HTTP
codes; the start-up ones (RuntimeError, ValueError) end `strata up` with their message."""

from __future__ import annotations

from rewriter.errors import StrataError

# ---- streams and runs (HTTP) -------------------------------------------------------------


class UnknownStream(StrataError):
    """A statement or request names a stream that does not exist."""


class StreamExists(StrataError):
    """CREATE STREAM names a stream (or another relation) that already exists."""


class StreamInUse(StrataError):
    """DROP of a stream that other streams are derived from."""


class UnknownRun(StrataError):
    """GET /runs/{run_id} of a run id no run has."""


class NotARawStream(StrataError):
    """Runs are posted to raw streams only."""


class RunConflict(StrataError):
    """A run id already names a run of another stream."""


class PayloadTooLarge(StrataError):
    """A run body above the configured maximum size."""


class InvalidRunId(StrataError):
    """A run id that is too long or holds control characters."""


class SpoolFull(StrataError):
    """The spool holds as many bytes of uncommitted runs as allowed: retry later."""

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class UnsupportedContentType(StrataError):
    """The Content-Type of a run is not a supported format (the API answers 415)."""


class Unauthorized(StrataError):
    """No bearer token, or one that matches no configured token (401)."""


class Forbidden(StrataError):
    """A valid token whose scope does not cover the request (403)."""


class RunFormatError(StrataError):
    """A run's body is malformed. Names the physical line (from 1), the column and the value."""

    def __init__(
        self,
        message: str,
        *,
        line: int | None = None,
        column: str | None = None,
        value: str | None = None,
    ) -> None:
        self.line = line
        self.column = column
        self.value = value
        self.problem = message
        where = []
        if line is not None:
            where.append(f"line {line}")
        if column is not None:
            where.append(f"column {_shorten(column, 80)!r}")
        prefix = ", ".join(where)
        text = f"{prefix}: {message}" if prefix else message
        if value is not None:
            text += f" (value: {_shorten(value, 80)!r})"
        super().__init__(text)

    def to_dict(self) -> dict[str, object]:
        """The error as an HTTP body. A value or a column name taken from the body is cut
        to MAX_SHOWN characters (a malformed line of megabytes is not echoed back), and a
        lone surrogate in it (a JSON escape such as "\\ud800") is shown escaped, since
        UTF-8 cannot carry it."""
        return {
            "error": str(self),
            "line": self.line,
            "column": None if self.column is None else _echo(self.column),
            "value": None if self.value is None else _echo(self.value),
        }


# ---- the change feed (server/feed/) -------------------------------------------------------


class NoFeed(StrataError):
    """GET /streams/{name}/changes of a stream whose view the change feed cannot follow."""


class PositionGone(StrataError):
    """A feed position no longer retained (or never given): re-sync from a snapshot."""

    def __init__(self, message: str, *, oldest: int, latest: int) -> None:
        super().__init__(message)
        self.oldest = oldest
        self.latest = latest


class SubscriptionCanceled(StrataError):
    """A COPY (SUBSCRIBE ...) TO STDOUT ended by the client's cancel request."""


# ---- sinks (server/sinks/) ------------------------------------------------------------------


class SinkExists(StrataError):
    """CREATE SINK names a sink that already exists."""


class UnknownSink(StrataError):
    """DROP SINK names a sink that does not exist."""


# ---- a cluster of nodes (server/replication/) --------------------------------------------


class Unavailable(StrataError):
    """Something this request needs is out of reach for now (the DDL owner, the peers a run
    must be copied to): retry, after ``retry_after`` seconds, here or at another node."""

    def __init__(self, message: str, *, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ReplicaTooEarly(StrataError):
    """A peer's copy of a run of a stream this node does not have yet (its CREATE has not
    reached it): the peer offers it again later."""


class ReplicaObsolete(StrataError):
    """A peer's copy of a run of a stream since dropped here: it is not kept."""


class NotTheOwner(StrataError):
    """DDL forwarded to a node that does not order the cluster's DDL (a misconfiguration:
    STRATA_DDL_OWNER differs between nodes)."""


# ---- the SQL port (server/pgwire/errors.py maps these and the ones above onto SQLSTATEs) ---


class InTransactionBlock(StrataError):
    """A Strata statement inside BEGIN ... COMMIT: each commits on its own, so none may
    pretend to be part of a transaction that could still roll back."""


class TransactionAborted(StrataError):
    """A statement in a transaction that already failed (until ROLLBACK)."""


class CopyFailed(StrataError):
    """The client abandoned a COPY (CopyFail), or the COPY data was cut short."""


class InvalidValue(StrataError):
    """A value of an INSERT into a stream that its column does not take: names the row of
    VALUES (from 1) and the column."""

    def __init__(self, message: str, *, row: int | None, column: str | None) -> None:
        super().__init__(message)
        self.row = row
        self.column = column


class RunRejected(StrataError):
    """A run that was parsed and accepted, then refused whole (e.g. by PostgreSQL)."""


class RunNotCommitted(StrataError):
    """A run was accepted but not committed within the wait (it still may commit)."""


# Longest value or column name an HTTP error body repeats from a run.
MAX_SHOWN = 1000


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _echo(text: str) -> str:
    return _shorten(text, MAX_SHOWN).encode("utf-8", "backslashreplace").decode("utf-8")


# ---- start-up -------------------------------------------------------------------------


class SecretSettingError(ValueError):
    """A secret setting is inconsistent (set twice, empty file): names it, never its value."""


class ReaderRoleError(RuntimeError):
    """The dashboard role's password could not be applied."""


class EmbeddedPostgresError(RuntimeError):
    """The embedded PostgreSQL could not be initialised, started or stopped."""


class SqlPortError(RuntimeError):
    """The SQL port cannot listen where it is asked to (taken, or unsafe)."""


class ClusterError(RuntimeError):
    """The cluster did not come up (the message quotes the daemon's log)."""


class JavaNotFoundError(RuntimeError):
    """No Java runtime of a version Spark supports could be found."""
