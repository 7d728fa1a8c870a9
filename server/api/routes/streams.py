"""Stream DDL: POST/GET/DELETE /streams."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field

from server.api.deps import ServiceDep
from server.api.describe import describe

router = APIRouter(tags=["streams"])


class CreateStream(BaseModel):
    sql: str = Field(
        description="One CREATE STREAM statement",
        examples=[
            "CREATE STREAM impsns (campaign text, user_id bigint, price numeric(12,4), "
            "t timestamptz) WITH (event_time = 't')"
        ],
    )


@router.post("/streams", status_code=201, summary="Create a raw or derived stream")
async def create_stream(body: CreateStream, service: ServiceDep) -> dict[str, object]:
    record = await run_in_threadpool(service.create_stream, body.sql)
    return describe(record, await run_in_threadpool(service.streams))


@router.get("/streams", summary="List streams")
async def list_streams(service: ServiceDep) -> list[dict[str, object]]:
    records = await run_in_threadpool(service.streams)
    return [describe(r, records) for r in records.values()]


@router.get("/streams/{name}", summary="Describe a stream and its rewrite")
async def get_stream(name: str, service: ServiceDep) -> dict[str, object]:
    record = await run_in_threadpool(service.stream, name)
    described = describe(record, await run_in_threadpool(service.streams))
    return described | {"progress": await run_in_threadpool(service.progress, record)}


@router.delete("/streams/{name}", summary="Drop a stream (409 while others depend on it)")
async def drop_stream(name: str, service: ServiceDep) -> dict[str, object]:
    await run_in_threadpool(service.drop_stream, name)
    return {"name": name, "dropped": True}
