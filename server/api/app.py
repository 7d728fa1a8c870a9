"""The FastAPI application: routes per resource, errors mapped in one place."""

from __future__ import annotations

from fastapi import FastAPI

from server.api import errors
from server.api.routes import info, runs, streams
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
    errors.install(app)
    for module in (streams, runs, info):
        app.include_router(module.router)
    return app
