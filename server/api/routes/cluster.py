"""A cluster of nodes: GET /cluster (this node, the DDL owner, each peer), and the
endpoints peers use among themselves: the commit log (/cluster/log), a run's rows
(/cluster/runs/{run_id}), a copy of a run (POST /cluster/runs/{stream}) and the DDL order
(/cluster/ddl). On a single node (no STRATA_NODE nor STRATA_PEERS) they answer 404."""

from __future__ import annotations

import pyarrow as pa
from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from server.api.deps import ServiceDep
from server.errors import RunFormatError, UnknownStream
from server.ingest.admission import check_run_id
from server.replication.node import Node
from server.replication.peers import ARROW_STREAM, table_bytes, table_of
from server.service import StrataService

router = APIRouter(tags=["cluster"])


def _node(service: StrataService) -> Node:
    if service.cluster is None:
        raise UnknownStream(
            "this node is not part of a cluster (set STRATA_NODE and STRATA_PEERS to make one)"
        )
    return service.cluster


@router.get("/cluster", summary="This node, the DDL owner and each peer (reachable, behind)")
async def cluster(service: ServiceDep) -> dict[str, object]:
    return await run_in_threadpool(_node(service).status)


@router.get("/cluster/log", summary="(between nodes) The runs this node committed, in order")
async def commit_log(
    service: ServiceDep,
    after: int = 0,
    limit: int = 500,
    node: str | None = None,
    incarnation: str | None = None,
) -> dict[str, object]:
    return await run_in_threadpool(
        _node(service).log_answer, after, min(limit, 5000), node, incarnation
    )


@router.get("/cluster/runs/{run_id}", summary="(between nodes) A run's rows (Arrow IPC)")
async def run_rows(run_id: str, service: ServiceDep) -> Response:
    record, table = await run_in_threadpool(_node(service).rows_of, check_run_id(run_id))
    return Response(
        await run_in_threadpool(table_bytes, table),
        media_type=ARROW_STREAM,
        headers={"X-Strata-Stream": record.stream},
    )


@router.post("/cluster/runs/{stream}", summary="(between nodes) A copy of a run (Arrow IPC)")
async def copy_of_run(
    stream: str,
    request: Request,
    service: ServiceDep,
    run_id: str,
    origin: int | None = None,
    node: str = "a peer",
) -> JSONResponse:
    cluster = _node(service)
    check_run_id(run_id)
    body = await request.body()
    try:
        table = await run_in_threadpool(table_of, body)
    except (pa.ArrowInvalid, OSError) as error:
        raise RunFormatError(f"a copy of a run is an Arrow IPC stream: {error}") from None
    record = await run_in_threadpool(cluster.accept_replica, stream, run_id, origin, table, node)
    return JSONResponse({"run_id": record.run_id, "status": record.status}, status_code=202)


class Statement(BaseModel):
    kind: str
    sql: str


@router.post("/cluster/ddl", summary="(between nodes) DDL forwarded to the owner")
async def forwarded_ddl(statement: Statement, service: ServiceDep) -> dict[str, object]:
    return await run_in_threadpool(_node(service).owner_apply, statement.kind, statement.sql)


@router.get("/cluster/ddl", summary="(between nodes) The owner's DDL log after a position")
async def ddl_log(service: ServiceDep, after: int = 0) -> dict[str, object]:
    node = _node(service)
    entries = await run_in_threadpool(node.ddl_after, after)
    return {"owner": node.name, "entries": [e.to_dict() for e in entries]}
