"""Dependencies of the route handlers, as named aliases."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from server.service import StrataService
from server.settings import Settings


def _service(request: Request) -> StrataService:
    return request.app.state.service  # type: ignore[no-any-return]


def _settings(request: Request) -> Settings:
    return request.app.state.settings  # type: ignore[no-any-return]


def _info(request: Request) -> dict[str, object]:
    return request.app.state.info  # type: ignore[no-any-return]


ServiceDep = Annotated[StrataService, Depends(_service)]
SettingsDep = Annotated[Settings, Depends(_settings)]
InfoDep = Annotated[dict[str, object], Depends(_info)]
