"""GET /health: the one endpoint that never needs a token (load balancers, `strata up`)."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter(tags=["server"])


@router.get("/health", summary="Liveness (no token needed)")
async def health() -> dict[str, str]:
    return {"status": "ok"}
