"""A small client for a cluster of Strata nodes that fails over: a run goes to one node,
and on a connection error, a timeout or a 5xx it is posted again, with the same run id,
to the next node (a run id is committed at most once on every node, so a retry never
makes a run twice). A 4xx is the run's own problem and is raised at once.

    client = FailoverClient(["http://a:8080", "http://b:8080", "http://c:8080"])
    client.post_run("impsns", body, run_id="2026-11-26/part-0001", wait=True)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import httpx

NDJSON = "application/x-ndjson"


class RunRefused(Exception):  # noqa: N818 - what the node said, as a client sees it
    """A node refused the run itself (a 4xx): retrying elsewhere would not help."""

    def __init__(self, status: int, body: object) -> None:
        super().__init__(f"HTTP {status}: {body}")
        self.status = status
        self.body = body


class NoNodeAnswered(Exception):  # noqa: N818
    """Every node was tried, for as long as the deadline allowed; none acknowledged."""


@dataclass(frozen=True)
class Attempt:
    """One try of a run at one node, for whoever logs them (``on_attempt``)."""

    node: str
    run_id: str
    started: float  # time.time()
    seconds: float
    status: int | None  # None: no answer (connection error, timeout)
    error: str | None


class FailoverClient:
    """Posts runs to the first node that acknowledges them, starting with the one that
    answered last (``prefer``), trying each node in turn for up to ``deadline`` seconds."""

    def __init__(
        self,
        nodes: Sequence[str],
        *,
        token: str | None = None,
        timeout: float = 10.0,
        deadline: float = 120.0,
        on_attempt: Callable[[Attempt], None] | None = None,
    ) -> None:
        if not nodes:
            raise ValueError("FailoverClient needs at least one node URL")
        self.nodes = [n.rstrip("/") for n in nodes]
        self.deadline = deadline
        self.prefer = 0
        self.on_attempt = on_attempt
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(headers=headers, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> FailoverClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def post_run(
        self,
        stream: str,
        body: bytes | str,
        *,
        run_id: str,
        content_type: str = NDJSON,
        wait: bool = False,
        start: int | None = None,
    ) -> dict[str, object]:
        """Post one run until a node acknowledges it (202, or 200 with ``wait``); returns
        that node's answer plus ``"node"``, the URL that gave it."""
        end = time.monotonic() + self.deadline
        index = self.prefer if start is None else start % len(self.nodes)
        pause = 0.05
        while True:
            for _ in range(len(self.nodes)):
                node = self.nodes[index]
                answer = self._try(node, stream, body, run_id, content_type, wait)
                if answer is not None:
                    self.prefer = index
                    return answer | {"node": node}
                index = (index + 1) % len(self.nodes)
                if time.monotonic() > end:
                    raise NoNodeAnswered(
                        f"run {run_id!r}: no node of {self.nodes} acknowledged it within "
                        f"{self.deadline:g} s; post it again with the same run id"
                    )
            time.sleep(pause)  # every node failed once: back off a little
            pause = min(pause * 2, 1.0)

    def _try(
        self,
        node: str,
        stream: str,
        body: bytes | str,
        run_id: str,
        content_type: str,
        wait: bool,
    ) -> dict[str, object] | None:
        started, clock = time.time(), time.monotonic()
        status: int | None = None
        error: str | None = None
        try:
            response = self._http.post(
                f"{node}/streams/{stream}/runs",
                params={"run_id": run_id, "wait": "true" if wait else "false"},
                content=body,
                headers={"content-type": content_type},
            )
            status = response.status_code
            if status in (200, 202):
                answer: dict[str, object] = response.json()
                return answer
            if status < 500 and status not in (404, 429):
                raise RunRefused(status, _said(response))
            # 5xx: the node cannot take it now; 404: the stream has not reached it yet;
            # 429 (spool full): the next node may.
            error = str(_said(response))
        except httpx.HTTPError as failed:
            error = f"{type(failed).__name__}: {failed}"
        finally:
            if self.on_attempt is not None:
                self.on_attempt(
                    Attempt(node, run_id, started, time.monotonic() - clock, status, error)
                )
        return None


def _said(response: httpx.Response) -> object:
    try:
        return response.json()
    except ValueError:
        return response.text[:500]
