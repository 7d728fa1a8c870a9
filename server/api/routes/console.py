"""The web console at /console: the streams, a stream's live chart fed by its change feed,
its window status, and a read-only SQL box (server/console/)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs

import sqlalchemy as sa
from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

from server.api.deps import ServiceDep
from server.api.security import TOKEN_COOKIE
from server.catalog import StreamRecord
from server.console import pages
from server.console.query import QueryRefused, QueryResult, run_read_only
from server.feed import refusal
from server.feed.record import FollowedPlan, ViewShape
from server.security import Tokens, secret
from server.service import StrataService
from server.settings import Settings

router = APIRouter(tags=["console"], include_in_schema=False)
# Without the token check: the sign-in form, and the console's static files (uPlot, its
# stylesheet and script), which hold nothing of the user's.
public = APIRouter(tags=["console"], include_in_schema=False)
STATIC_DIR = Path(__file__).resolve().parent.parent.parent / "console" / "static"
WINDOWS_SHOWN = 50

SUMMARY = sa.text(
    "SELECT stream, count(*), coalesce(sum(rows), 0), coalesce(sum(late_rows), 0), "
    "coalesce(sum(revisions), 0), max(last_changed_at) FROM public.strata_window_status "
    "GROUP BY stream"
)
WINDOWS = sa.text(
    "SELECT window_start, window_end, rows, late_rows, revisions, last_changed_at, complete "
    "FROM public.strata_window_status WHERE stream = :stream "
    "ORDER BY window_start DESC LIMIT :shown"
)


def mount_static(app: object) -> None:
    """Serve server/console/static at /console/static."""
    app.mount(  # type: ignore[attr-defined]
        pages.STATIC, StaticFiles(directory=STATIC_DIR), name="console-static"
    )


def _summaries(
    service: StrataService, records: dict[str, StreamRecord] | None = None
) -> list[pages.StreamSummary]:
    records = service.streams() if records is None else records
    with service.engine.connect() as connection:
        stats = {row[0]: row[1:] for row in connection.execute(SUMMARY)}
    return [
        pages.StreamSummary(r.name, r.kind, r.sql, *stats.get(r.name, (0, 0, 0, 0, None)))
        for r in sorted(records.values(), key=lambda r: r.name)
    ]


def _stream_page(service: StrataService, name: str) -> str | None:
    records = service.streams()
    summary = next((s for s in _summaries(service, records) if s.name == name), None)
    if summary is None:
        return None
    plan = records[name].plan
    why = refusal(plan)
    chart = None
    if why is None and isinstance(plan, FollowedPlan):
        shape = ViewShape.of(plan)
        values = tuple(o.name for o in plan.outputs if o.name not in shape.keys)
        if shape.window is None:
            why = "the view has no window column to plot along"
        elif not values:
            why = "the view has no value column besides its window and group columns"
        else:
            chart = pages.ChartShape(shape.window, shape.keys, values)
    with service.engine.connect() as connection:
        windows = [
            pages.WindowLine(*row)
            for row in connection.execute(WINDOWS, {"stream": name, "shown": WINDOWS_SHOWN})
        ]
    return pages.stream(summary, chart, why, windows)


@router.get("/console", response_class=HTMLResponse)
async def console_index(service: ServiceDep) -> HTMLResponse:
    return HTMLResponse(pages.index(await run_in_threadpool(_summaries, service)))


@router.get("/console/streams/{name}", response_class=HTMLResponse)
async def console_stream(name: str, service: ServiceDep) -> HTMLResponse:
    page = await run_in_threadpool(_stream_page, service, name)
    if page is None:
        return HTMLResponse(pages.not_found(f"stream {name!r} does not exist"), status_code=404)
    return HTMLResponse(page)


@router.get("/console/sql", response_class=HTMLResponse)
async def console_sql_form() -> HTMLResponse:
    return HTMLResponse(pages.query_page("", None, None))


@router.post("/console/sql", response_class=HTMLResponse)
async def console_sql(request: Request) -> HTMLResponse:
    form = parse_qs((await request.body()).decode(errors="replace"))
    query = form.get("query", [""])[0]
    settings: Settings = request.app.state.settings
    password = secret(settings, "reader_password")
    result: QueryResult | None = None
    error: str | None = None
    try:
        database_url = str(request.app.state.info["database_url"])
        result = await run_in_threadpool(run_read_only, database_url, password, query)
    except QueryRefused as refused:
        error = str(refused)
    return HTMLResponse(pages.query_page(query, result, error), status_code=200)


@public.get("/console/login", response_class=HTMLResponse)
async def console_login_form() -> HTMLResponse:
    return HTMLResponse(pages.login(None))


@public.post("/console/login", response_model=None)
async def console_login(request: Request) -> HTMLResponse | RedirectResponse:
    """Check a token and keep it in a cookie (HttpOnly, SameSite=Strict): a browser's
    EventSource cannot send an Authorization header."""
    form = parse_qs((await request.body()).decode(errors="replace"))
    token = form.get("token", [""])[0]
    tokens: Tokens = request.app.state.tokens
    if tokens.enabled and tokens.scopes_of(token) is None:
        return HTMLResponse(pages.login("that token is not valid"), status_code=401)
    response = RedirectResponse("/console", status_code=303)
    response.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="strict")
    return response
