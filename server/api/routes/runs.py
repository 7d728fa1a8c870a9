"""Run intake (POST /streams/{name}/runs) and run status (GET /runs/{run_id})."""

from __future__ import annotations

import asyncio
import time

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from server.api.deps import ServiceDep, SettingsDep
from server.errors import PayloadTooLarge, UnknownRun
from server.ingest.admission import admit, check_run_id
from server.ingest.parse import run_format

router = APIRouter(tags=["runs"])


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
    await admit(service, settings, run_id)
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


@router.get(
    "/runs/{run_id}",
    summary="Status of a run",
    description="With wait=true, answers once the run is committed or rejected on this node "
    "(in a cluster: a run posted to another node, once it has reached this one), or after "
    "timeout seconds (default STRATA_RUN_WAIT_TIMEOUT) with its status then (404 if this "
    "node has not heard of it). A single node answers 404 at once for a run it has not "
    "heard of: no other node can bring it.",
)
async def get_run(
    run_id: str,
    service: ServiceDep,
    settings: SettingsDep,
    wait: bool = False,
    timeout: float | None = None,
) -> dict[str, object]:
    check_run_id(run_id)
    limit = (
        settings.run_wait_timeout if timeout is None else min(timeout, settings.run_wait_timeout)
    )
    deadline = time.monotonic() + limit
    record = await run_in_threadpool(service.run, run_id)
    # A run unknown to a single node can only come from a later POST: waiting for it would
    # hold the request for the whole timeout (a mistyped run id hanging a client).
    while (
        wait
        and (record is not None or service.cluster is not None)
        and (record is None or record.status == "pending")
    ):
        left = deadline - time.monotonic()
        if left <= 0 or service.pipeline.stopping:
            break
        if record is not None:
            record = await run_in_threadpool(service.wait, record, left)
            continue
        await asyncio.sleep(min(0.05, left))
        record = await run_in_threadpool(service.run, run_id)
    if record is None:
        raise UnknownRun(f"run {run_id!r} does not exist")
    shown = record.to_dict()
    if service.cluster is not None:
        shown |= await run_in_threadpool(service.cluster.run_facts, run_id)
    return shown
