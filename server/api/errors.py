"""The one place Strata errors become HTTP responses."""

from __future__ import annotations

import logging

import sqlalchemy as sa
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from rewriter.errors import InvalidSQL, StrataError, UnsupportedSQL
from server.api.security import check_request
from server.errors import (
    Forbidden,
    InvalidRunId,
    NoFeed,
    NotARawStream,
    NotTheOwner,
    PayloadTooLarge,
    PositionGone,
    ReplicaObsolete,
    ReplicaTooEarly,
    RunConflict,
    RunFormatError,
    SinkExists,
    SpoolFull,
    StreamExists,
    StreamInUse,
    Unauthorized,
    Unavailable,
    UnknownRun,
    UnknownSink,
    UnknownStream,
    UnsupportedContentType,
)

STATUS: dict[type[StrataError], int] = {
    Unauthorized: 401,
    Forbidden: 403,
    InvalidSQL: 400,
    UnsupportedSQL: 400,
    RunFormatError: 400,
    NotARawStream: 400,
    UnknownStream: 404,
    UnknownRun: 404,
    StreamExists: 409,
    StreamInUse: 409,
    RunConflict: 409,
    PayloadTooLarge: 413,
    InvalidRunId: 400,
    SpoolFull: 429,
    UnsupportedContentType: 415,
    Unavailable: 503,
    ReplicaTooEarly: 409,
    ReplicaObsolete: 410,
    NotTheOwner: 421,
    NoFeed: 400,
    PositionGone: 410,
    SinkExists: 409,
    UnknownSink: 404,
}

log = logging.getLogger("strata.api")


def status_of(error: StrataError) -> int:
    for kind in type(error).__mro__:
        if kind in STATUS:
            return STATUS[kind]
    return 500


def install(app: FastAPI) -> None:
    @app.exception_handler(StrataError)
    async def strata_error(_request: Request, error: StrataError) -> JSONResponse:
        body: dict[str, object] = (
            error.to_dict() if isinstance(error, RunFormatError) else {"error": str(error)}
        )
        if error.position is not None:
            body["line"], body["column"] = error.position
        headers = {"WWW-Authenticate": "Bearer"} if isinstance(error, Unauthorized) else None
        if isinstance(error, (SpoolFull, Unavailable)):
            headers = {"Retry-After": str(error.retry_after)}
        if isinstance(error, PositionGone):  # where to resume or re-sync from
            body |= {"oldest_position": error.oldest, "latest_position": error.latest}
        return JSONResponse(body, status_code=status_of(error), headers=headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, error: RequestValidationError) -> JSONResponse:
        # A body FastAPI could not even parse fails before any dependency runs: without a
        # valid token the answer is still 401/403, not a description of the problem.
        try:
            await check_request(request)
        except StrataError as refused:
            return await strata_error(request, refused)
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in error.errors()
        )
        return JSONResponse({"error": f"invalid request: {problems}"}, status_code=400)

    @app.exception_handler(sa.exc.OperationalError)
    async def database_unreachable(request: Request, error: Exception) -> JSONResponse:
        # PostgreSQL is restarting (server/engines/embedded_pg.py's Supervisor) or out of reach. A
        # run posted now is not acknowledged; posting it again with its run id is safe. The
        # server's log says which error it was (a deadlock or a lock timeout is one too).
        log.warning(
            "%s %s answered 503: %s", request.method, request.url.path, str(error).splitlines()[0]
        )
        return JSONResponse(
            {"error": "PostgreSQL is unreachable right now; retry the request"},
            status_code=503,
            headers={"Retry-After": "1"},
        )
