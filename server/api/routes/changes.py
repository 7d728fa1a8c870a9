"""The change feed over HTTP: GET /streams/{name}/changes as Server-Sent Events."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Header, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse

from server.api.deps import ServiceDep
from server.errors import PositionGone
from server.feed import Change, Feed, open_feed
from server.feed.hub import FeedHub
from server.service import StrataService

router = APIRouter(tags=["streams"])

# How often the feed hub reads the followed streams' latest positions (one query for every
# subscriber of this process), and after how long without changes a progress event tells
# the client it is caught up.
POLL_SECONDS = 0.1
PROGRESS_SECONDS = 1.0


def _event(change: Change) -> str:
    kind = f"event: {change.kind}\n" if change.kind else ""
    return f"id: {change.position}\n{kind}data: {change.data}\n\n"


@router.get(
    "/streams/{name}/changes",
    summary="Follow a stream's changes (Server-Sent Events)",
    description="Every change of the stream's view as it commits, in commit order, once each: "
    "`id:` is the change's position, `data:` a JSON object (position, op, key, old, new, "
    "late, lateness_seconds, revision, cause, runs, committed_at). `since` or the "
    "Last-Event-ID header resume after a position; `snapshot=true` starts with the current "
    'rows as inserts. `event: progress` with `{"position": N}` comes after a second '
    "without changes. A position no longer kept answers 410 with oldest_position. A "
    "stream's feed starts with its first subscriber.",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}}},
)
async def follow_changes(
    name: str,
    request: Request,
    service: ServiceDep,
    since: int | None = Query(None, ge=0, description="Resume after this position."),
    snapshot: bool = Query(False, description="Start with the current rows as inserts."),
    last_event_id: str | None = Header(None),
) -> StreamingResponse:
    if last_event_id is not None and last_event_id.strip().isdigit():
        since = int(last_event_id)  # an EventSource reconnecting says where it was
    feed, first = await run_in_threadpool(
        open_feed, service.engine, service.plans, name, since=since, snapshot=snapshot
    )
    return StreamingResponse(
        _events(feed, first, request, _hub(request, service)),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def _hub(request: Request, service: StrataService) -> FeedHub:
    """The process's one watcher of feed positions (server/feed/hub.py), made on first use."""
    hub: FeedHub | None = getattr(request.app.state, "feed_hub", None)
    if hub is None:
        hub = request.app.state.feed_hub = FeedHub(service.engine, POLL_SECONDS)
    return hub


async def _events(
    feed: Feed, first: list[Change], request: Request, hub: FeedHub
) -> AsyncIterator[str]:
    for change in first:
        yield _event(change)
    if first:
        yield _event(feed.progress())  # the snapshot's position, to resume from
    quiet_since = polled = time.monotonic()
    with hub.subscribed(feed.name):
        while not await request.is_disconnected():
            # Read changes when the hub saw the stream move past us, and once a second
            # regardless (which also announces an ALTER swapped in at once).
            latest = hub.latest(feed.name)
            if latest is None or latest > feed.position or time.monotonic() - polled >= 1.0:
                polled = time.monotonic()
                try:
                    changes = await run_in_threadpool(hub.changes, feed)
                except PositionGone as gone:  # retention overtook a slow subscriber: say so
                    data = json.dumps(
                        {"error": str(gone), "status": 410, "oldest_position": gone.oldest}
                    )
                    yield f"event: error\ndata: {data}\n\n"
                    return
                if changes:  # one write for the batch, not one per change
                    yield "".join(_event(change) for change in changes)
                    quiet_since = time.monotonic()
                    continue
            if time.monotonic() - quiet_since >= PROGRESS_SECONDS:
                yield _event(feed.progress())
                quiet_since = time.monotonic()
            await asyncio.sleep(POLL_SECONDS)
