"""GET /metrics: Prometheus's text format (see server/metrics.py for what it shows)."""

from __future__ import annotations

from fastapi import APIRouter, Response

from server.api.deps import ServiceDep
from server.metrics import CONTENT_TYPE

router = APIRouter(tags=["server"])


@router.get(
    "/metrics",
    summary="Counters and gauges in Prometheus's text format (read scope)",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE: {}}, "description": "Prometheus text format"}},
)
def metrics(service: ServiceDep) -> Response:
    # A plain function: FastAPI runs it in its thread pool, as the scrape reads PostgreSQL.
    return Response(service.metrics.exposition(), media_type=CONTENT_TYPE)
