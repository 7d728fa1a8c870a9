"""GET /info."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from server.api.deps import InfoDep, ServiceDep
from server.sharing.membership import status

router = APIRouter(tags=["server"])


@router.get("/info", summary="Where Strata's PostgreSQL and Spark are (same as `strata info`)")
async def info(details: InfoDep, service: ServiceDep) -> dict[str, object]:
    # The executors change while Strata runs: workers join and leave a Spark cluster.
    executors = await run_in_threadpool(service.pipeline.backend.executors)
    found = details | {"spark_executors": executors}
    if service.shared is not None:  # the servers sharing the database, and who runs what
        found |= await run_in_threadpool(status, service.engine)
    return found
