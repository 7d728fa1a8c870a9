"""The one place Strata errors become PostgreSQL ErrorResponses: a SQLSTATE per error class
(as server/api/errors.py gives an HTTP status), the same message text as over HTTP, and a
position in the query string where one is known, so that psql draws its caret."""

from __future__ import annotations

import logging

import sqlalchemy as sa

from rewriter.errors import InvalidSQL, StrataError, UnknownSource, UnsupportedSQL
from server.errors import (
    CopyFailed,
    Forbidden,
    InTransactionBlock,
    InvalidRunId,
    InvalidValue,
    NoFeed,
    NotARawStream,
    NotTheOwner,
    PayloadTooLarge,
    PositionGone,
    ReplicaObsolete,
    ReplicaTooEarly,
    RunConflict,
    RunFormatError,
    RunNotCommitted,
    RunRejected,
    SinkExists,
    SpoolFull,
    StreamExists,
    StreamInUse,
    SubscriptionCanceled,
    TransactionAborted,
    Unauthorized,
    Unavailable,
    UnknownRun,
    UnknownSink,
    UnknownStream,
    UnsupportedContentType,
)

log = logging.getLogger("strata.pgwire")

# PostgreSQL's error codes (Appendix A of its documentation), by Strata error class; the
# most specific class of an error wins.
SQLSTATE: dict[type[StrataError], str] = {
    InvalidSQL: "42601",  # syntax_error
    UnknownSource: "42P01",  # undefined_table
    UnsupportedSQL: "0A000",  # feature_not_supported
    UnknownStream: "42P01",  # undefined_table
    StreamExists: "42P07",  # duplicate_table
    StreamInUse: "2BP01",  # dependent_objects_still_exist
    NotARawStream: "42809",  # wrong_object_type
    RunFormatError: "22P04",  # bad_copy_file_format
    InvalidValue: "22P02",  # invalid_text_representation
    RunConflict: "23505",  # unique_violation (of the run id)
    RunRejected: "22000",  # data_exception
    RunNotCommitted: "57014",  # query_canceled
    PayloadTooLarge: "54000",  # program_limit_exceeded
    InvalidRunId: "22023",  # invalid_parameter_value
    SpoolFull: "53000",  # insufficient_resources
    UnsupportedContentType: "0A000",
    Unauthorized: "28000",  # invalid_authorization_specification
    Forbidden: "42501",  # insufficient_privilege
    UnknownRun: "42704",  # undefined_object
    InTransactionBlock: "25001",  # active_sql_transaction
    TransactionAborted: "25P02",  # in_failed_sql_transaction
    CopyFailed: "57014",  # query_canceled, as PostgreSQL answers a CopyFail
    Unavailable: "57P03",  # cannot_connect_now: retry, here or at another node
    # Between nodes of a cluster (HTTP only), mapped all the same.
    ReplicaTooEarly: "55000",  # object_not_in_prerequisite_state
    ReplicaObsolete: "55000",
    NotTheOwner: "55000",
    NoFeed: "0A000",  # feature_not_supported
    PositionGone: "55000",
    SubscriptionCanceled: "57014",  # query_canceled, as PostgreSQL's own COPY TO
    SinkExists: "42710",  # duplicate_object
    UnknownSink: "42704",  # undefined_object
}
UNREACHABLE = "57P03"  # cannot_connect_now
INTERNAL = "XX000"
PROTOCOL_VIOLATION = "08P01"


def sqlstate_of(error: StrataError) -> str:
    for kind in type(error).__mro__:
        if kind in SQLSTATE:
            return SQLSTATE[kind]
    return INTERNAL


def fields_of(
    error: BaseException,
    *,
    query: str = "",
    at: int | None = None,
    statement_at: int | None = None,
    sqlstate: str | None = None,
) -> dict[str, str]:
    """The fields of the ErrorResponse for ``error``.

    ``at``: the offset of the problem in ``query``. ``statement_at``: the offset in
    ``query`` of the statement a StrataError's (line, column) counts from.
    """
    if isinstance(error, StrataError):
        fields = _fields(sqlstate or sqlstate_of(error), str(error))
        if at is None and error.position is not None and statement_at is not None:
            at = _offset(query, statement_at, error.position)
        if isinstance(error, RunFormatError) and error.column is not None:
            fields["c"] = error.column
        if isinstance(error, SpoolFull):
            fields["H"] = f"Retry in {error.retry_after} seconds."
    elif isinstance(error, sa.exc.OperationalError):
        fields = _fields(UNREACHABLE, "PostgreSQL is unreachable right now; retry the statement")
    else:
        log.error("SQL port: internal error", exc_info=error)
        fields = _fields(INTERNAL, f"internal error in Strata: {type(error).__name__}")
    if at is not None and 0 <= at <= len(query):
        fields["P"] = str(at + 1)  # PostgreSQL counts characters from 1
    return fields


def _fields(sqlstate: str, message: str, severity: str = "ERROR") -> dict[str, str]:
    return {"S": severity, "V": severity, "C": sqlstate, "M": message}


def protocol_violation(message: str) -> dict[str, str]:
    return _fields(PROTOCOL_VIOLATION, message, "FATAL")


def notice(message: str) -> dict[str, str]:
    return _fields("00000", message, "NOTICE")


def _offset(query: str, statement_at: int, position: tuple[int, int]) -> int:
    """The offset in ``query`` of (line, column) counted from 1 within the statement that
    starts at ``statement_at``."""
    line, column = position
    offset = statement_at
    for _ in range(line - 1):
        newline = query.find("\n", offset)
        if newline < 0:
            break
        offset = newline + 1
    return offset + column - 1
