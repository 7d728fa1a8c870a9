"""The FastAPI application: routes per resource, errors mapped in one place."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request, Security
from starlette.responses import Response

from server.api import errors
from server.api.routes import changes, cluster, console, health, info, metrics, runs, streams
from server.api.security import authorize
from server.metrics import Metrics
from server.security import Tokens
from server.service import StrataService
from server.settings import Settings


def create_app(service: StrataService, settings: Settings, details: dict[str, object]) -> FastAPI:
    app = FastAPI(
        title="Strata",
        summary="SQL-first continuous analytics: late data is never dropped.",
        version="0.1.0",
    )
    app.state.service = service
    app.state.settings = settings
    app.state.info = details
    # Read (token files included) once, at start: a bad secret setting stops the server.
    app.state.tokens = Tokens.from_settings(settings)
    errors.install(app)
    _count_errors(app, service.metrics)
    app.include_router(health.router)
    app.include_router(console.public)  # the console's sign-in form
    console.mount_static(app)  # uPlot and the console's script: nothing of the user's
    # Every other router, present and future, goes through the token check.
    for module in (streams, changes, runs, info, metrics, cluster, console):
        app.include_router(module.router, dependencies=[Security(authorize)])
    return app


def _count_errors(app: FastAPI, counters: Metrics) -> None:
    """Count every error response the exception handlers make, by status and error class
    (strata_http_errors_total of GET /metrics)."""

    def counted(handler: Callable[..., Any]) -> Callable[..., Any]:
        async def count(request: Request, error: Exception) -> Response:
            response = handler(request, error)
            if inspect.isawaitable(response):
                response = await response
            if response.status_code >= 400:
                counters.http_error(response.status_code, type(error).__name__)
            return response  # type: ignore[no-any-return]

        return count

    for kind, handler in list(app.exception_handlers.items()):
        app.exception_handlers[kind] = counted(handler)
