"""The webhook sink: batches of changes POSTed as JSON to a URL.

A batch is ``{"sink", "stream", "position", "snapshot", "changes": [...]}``: the changes
(each as the change feed gives it) after the last position delivered, up to
``position``. The sink's position moves past a batch only once the receiver answered it
with a 2xx; until then the batch is sent again (possibly with more changes after it),
after a backoff. So a receiver may see a change twice (its 2xx lost, Strata killed before
it noted the answer) but never misses one; a receiver that stores the last position it
applied in the same transaction as the changes, and skips changes at or below it, applies
each change exactly once. A ``snapshot`` batch (the first one) holds the whole view at
``position``: the receiver replaces what it holds with it.
"""

from __future__ import annotations

import json

import httpx
import sqlalchemy as sa

from server.catalog import PlanCache
from server.sinks.source import read_batch
from server.sinks.store import Sink

# How much of a refusing receiver's answer a sink's error repeats.
SHOWN_ANSWER = 200


class DeliveryRefused(Exception):
    """The receiver answered a batch with something other than a 2xx."""


class WebhookTarget:
    """One webhook sink's HTTP client."""

    def __init__(self, sink: Sink, timeout: float) -> None:
        self.sink = sink
        self._client = httpx.Client(timeout=timeout, follow_redirects=False)

    def close(self) -> None:
        self._client.close()

    def deliver(
        self, engine: sa.Engine, plans: PlanCache, limit: int, after: int | None
    ) -> tuple[int, int]:
        """POST the batch after position ``after`` (None: the snapshot), if there is one;
        (the position delivered up to, changes) once the receiver took it."""
        sink = self.sink
        batch = read_batch(engine, plans, sink.stream, after, limit)
        if batch.empty:
            return (after if after is not None else batch.position), 0
        head = json.dumps(
            {
                "sink": sink.name,
                "stream": sink.stream,
                "position": batch.position,
                "snapshot": batch.snapshot,
            }
        )
        # The changes as the feed wrote them: numbers keep every digit.
        body = f'{head[:-1]}, "changes": [{", ".join(c.data for c in batch.changes)}]}}'
        answer = self._client.post(
            sink.url,
            content=body.encode(),
            headers={
                "content-type": "application/json",
                "x-strata-sink": sink.name,
                "x-strata-position": str(batch.position),
            },
        )
        if not answer.is_success:
            raise DeliveryRefused(
                f"the receiver answered {answer.status_code} {answer.reason_phrase}: "
                f"{answer.text[:SHOWN_ANSWER]}"
            )
        return batch.position, len(batch.changes)
