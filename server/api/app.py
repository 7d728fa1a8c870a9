"""The FastAPI application: routes per resource, errors mapped in one place."""

from __future__ import annotations

from fastapi import FastAPI, Security

from server.api import errors
from server.api.routes import health, info, runs, streams
from server.api.security import authorize
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
    app.include_router(health.router)
    # Every other router, present and future, goes through the token check.
    for module in (streams, runs, info):
        app.include_router(module.router, dependencies=[Security(authorize)])
    return app
