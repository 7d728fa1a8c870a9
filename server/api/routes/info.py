"""GET /info."""

from __future__ import annotations

from fastapi import APIRouter

from server.api.deps import InfoDep

router = APIRouter(tags=["server"])


@router.get("/info", summary="Where Strata's PostgreSQL and Spark are (same as `strata info`)")
async def info(details: InfoDep) -> dict[str, object]:
    return details
