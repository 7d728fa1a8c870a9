"""Stream DDL: POST/GET/DELETE /streams."""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field

from server.api.deps import ServiceDep
from server.api.describe import describe
from server.sinks.ddl import run_sink_statement, sinks
from server.sinks.statement import is_sink_statement

router = APIRouter(tags=["streams"])


class CreateStream(BaseModel):
    sql: str = Field(
        description="One CREATE STREAM statement, ALTER STREAM name AS SELECT ... to "
        "change a derived stream's query, or CREATE SINK / DROP SINK",
        examples=[
            "CREATE STREAM impsns (campaign text, user_id bigint, price numeric(12,4), "
            "t timestamptz) WITH (event_time = 't')"
        ],
    )


@router.post(
    "/streams",
    status_code=201,
    summary="Create a raw or derived stream, or change one (ALTER STREAM), or a sink",
    description="CREATE STREAM answers 201. ALTER STREAM answers 200 when the new definition "
    'is swapped in already (path "reuse"), 202 while it back-fills (path "backfill": '
    "the view serves the old definition until the swap; see progress.alter of GET "
    "/streams/{name}). CREATE SINK name FROM stream WITH (connector = ...) answers 201 "
    "with the sink (see sinks of GET /streams/{name}); DROP SINK name answers 200.",
)
async def create_stream(
    body: CreateStream, service: ServiceDep, response: Response
) -> dict[str, object]:
    if is_sink_statement(body.sql):
        done = await run_in_threadpool(run_sink_statement, service, body.sql)
        if done.sink is None:  # DROP SINK
            response.status_code = 200
            return {"dropped": done.changed}
        response.status_code = 201 if done.changed else 200  # 200: IF NOT EXISTS, it was
        return done.sink.describe()
    if _is_alter(body.sql):
        altered = await run_in_threadpool(service.alter_stream, body.sql)
        response.status_code = 200 if altered["state"] == "done" else 202
        record = await run_in_threadpool(service.stream, str(altered["stream"]))
        return describe(record, await run_in_threadpool(service.streams)) | {"alter": altered}
    record = await run_in_threadpool(service.create_stream, body.sql)
    return describe(record, await run_in_threadpool(service.streams))


def _is_alter(text: str) -> bool:
    words = text.split(None, 2)
    return len(words) >= 2 and words[0].upper() == "ALTER" and words[1].upper() == "STREAM"


@router.get("/streams", summary="List streams")
async def list_streams(service: ServiceDep) -> list[dict[str, object]]:
    records = await run_in_threadpool(service.streams)
    return [describe(r, records) for r in records.values()]


@router.get("/streams/{name}", summary="Describe a stream and its rewrite")
async def get_stream(name: str, service: ServiceDep) -> dict[str, object]:
    record = await run_in_threadpool(service.stream, name)
    described = describe(record, await run_in_threadpool(service.streams))
    return described | {
        "progress": await run_in_threadpool(service.progress, record),
        "history": await run_in_threadpool(service.history, name),
        "sinks": [s.describe() for s in await run_in_threadpool(sinks, service.engine, name)],
    }


@router.delete(
    "/streams/{name}", summary="Drop a stream (409 while other streams or sinks depend on it)"
)
async def drop_stream(name: str, service: ServiceDep) -> dict[str, object]:
    await run_in_threadpool(service.drop_stream, name)
    return {"name": name, "dropped": True}
