"""Run intake (POST /streams/{name}/runs) and run status (GET /runs/{run_id})."""

from __future__ import annotations

import asyncio
import time
import unicodedata

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from server.api.deps import ServiceDep, SettingsDep
from server.errors import InvalidRunId, PayloadTooLarge, SpoolFull, UnknownRun
from server.ingest.parse import run_format
from server.service import StrataService
from server.settings import Settings

router = APIRouter(tags=["runs"])

MAX_RUN_ID = 256
# A client told to come back later (429) is asked to wait this long.
RETRY_AFTER_SECONDS = 2
_SPOOL_POLL_SECONDS = 0.2


def check_run_id(run_id: str) -> str:
    """A run id is 1 to MAX_RUN_ID characters, none of them a control character."""
    if len(run_id) > MAX_RUN_ID:
        raise InvalidRunId(
            f"run id of {len(run_id)} characters is too long; at most {MAX_RUN_ID} are allowed"
        )
    bad = next((c for c in run_id if unicodedata.category(c) in ("Cc", "Cs")), None)
    if bad is not None:
        raise InvalidRunId(
            f"run id {run_id[:80]!r} holds U+{ord(bad):04X}, a control character or a lone "
            "surrogate; use printable characters"
        )
    return run_id


async def _admit(service: StrataService, settings: Settings, run_id: str | None) -> None:
    """Hold a new run back while the spool is full (STRATA_MAX_SPOOL_BYTES): refuse it
    (429 with Retry-After) or, with STRATA_SPOOL_FULL=wait, wait a bounded time for room.

    Checked before the body is read, so a full spool costs neither memory nor disk. A run
    id already known passes: its answer is the first result, which takes no room.
    """
    limit = settings.max_spool_bytes
    if limit <= 0:
        return
    waiting = settings.spool_full_wait if settings.spool_full == "wait" else 0.0
    deadline = time.monotonic() + waiting
    while True:
        used = await run_in_threadpool(service.spool.pending_bytes)
        if used < limit:
            return
        if run_id and await run_in_threadpool(service.run, run_id) is not None:
            return
        if time.monotonic() >= deadline:
            waited = f" after waiting {waiting:g} s" if waiting else ""
            raise SpoolFull(
                f"the run spool is full{waited}: {used} bytes of runs await their commit "
                f"(limit {limit}, STRATA_MAX_SPOOL_BYTES); retry later",
                retry_after=RETRY_AFTER_SECONDS,
            )
        await asyncio.sleep(_SPOOL_POLL_SECONDS)


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"run body of {declared} bytes exceeds the limit of {limit} bytes")
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"run body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


@router.post(
    "/streams/{name}/runs",
    summary="Ingest a run (NDJSON or CSV body)",
    status_code=202,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/x-ndjson": {"schema": {"type": "string"}},
                "text/csv": {"schema": {"type": "string"}},
            },
        }
    },
)
async def post_run(
    name: str,
    request: Request,
    service: ServiceDep,
    settings: SettingsDep,
    run_id: str | None = None,
    wait: bool = False,
) -> JSONResponse:
    if run_id is not None:
        check_run_id(run_id)
    content_type = request.headers.get("content-type", "")
    run_format(content_type)  # 415 before the body is read
    await _admit(service, settings, run_id)
    body = await _read_body(request, settings.max_run_bytes)
    record = await run_in_threadpool(service.submit_run, name, body, content_type, run_id)
    if wait:
        record = await run_in_threadpool(service.wait, record, settings.run_wait_timeout)
        if record.status == "committed":
            return JSONResponse(
                {"run_id": record.run_id, "status": "committed", "rows": record.rows},
                status_code=200,
            )
        if record.status == "rejected":
            return JSONResponse(
                {
                    "run_id": record.run_id,
                    "status": "rejected",
                    "rows": record.rows,
                    "error": record.error,
                },
                status_code=422,
            )
    return JSONResponse({"run_id": record.run_id, "status": record.status}, status_code=202)


@router.get("/runs/{run_id}", summary="Status of a run")
async def get_run(run_id: str, service: ServiceDep) -> dict[str, object]:
    record = await run_in_threadpool(service.run, check_run_id(run_id))
    if record is None:
        raise UnknownRun(f"run {run_id!r} does not exist")
    return record.to_dict()
