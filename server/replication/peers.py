"""Talking to one peer node over its HTTP API (the /cluster endpoints), with the same
bearer token every node of a cluster shares (STRATA_API_TOKEN)."""

from __future__ import annotations

import io
import time
from dataclasses import dataclass, field

import httpx
import pyarrow as pa
import pyarrow.ipc as ipc

ARROW_STREAM = "application/vnd.apache.arrow.stream"
# A DDL statement may take the owner a while (a CREATE plans the back-fill of history).
DDL_TIMEOUT = 120.0


class PeerUnreachable(Exception):  # noqa: N818 - it names the condition, like TimeoutError
    """The peer did not answer (refused, timed out, or a 5xx)."""


class PeerRefused(Exception):  # noqa: N818
    """The peer answered with a 4xx: ``status`` and its error message."""

    def __init__(self, status: int, error: str) -> None:
        super().__init__(error)
        self.status = status
        self.error = error


def table_bytes(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    with ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def table_of(data: bytes) -> pa.Table:
    return ipc.open_stream(data).read_all()


@dataclass
class Peer:
    """One other node, as this node reaches it (``url``), and what it last said of itself."""

    url: str
    token: str | None
    timeout: float
    name: str | None = None  # learned from its answers
    incarnation: str | None = None
    reachable: bool = False
    last_seen: float | None = None  # time.time() of its last answer
    unreachable_since: float | None = None
    last_error: str | None = None
    facts: dict[str, object] = field(default_factory=dict)  # its last /cluster/log header
    behind_since: float | None = None  # since when this node has lacked some of its runs
    _client: httpx.Client | None = None

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/")
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self._client = httpx.Client(base_url=self.url, headers=headers, timeout=self.timeout)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def request(self, method: str, path: str, **kwargs: object) -> httpx.Response:
        """Send a request; PeerUnreachable unless it answers below 500, PeerRefused for
        a 4xx."""
        assert self._client is not None
        try:
            response = self._client.request(method, path, **kwargs)  # type: ignore[arg-type]
        except httpx.HTTPError as error:
            self._lost(f"{type(error).__name__}: {error}")
            raise PeerUnreachable(f"{self.url}: {error}") from error
        if response.status_code >= 500:
            self._lost(f"HTTP {response.status_code}")
            raise PeerUnreachable(f"{self.url}: HTTP {response.status_code} {response.text[:200]}")
        self.reachable, self.last_seen, self.unreachable_since = True, time.time(), None
        self.last_error = None
        if response.status_code >= 400:
            try:
                said = str(response.json().get("error"))
            except ValueError:
                said = response.text[:500]
            raise PeerRefused(response.status_code, said)
        return response

    def _lost(self, why: str) -> None:
        if self.reachable or self.unreachable_since is None:
            self.unreachable_since = time.time()
        self.reachable = False
        self.last_error = why

    def log(self, after: int, limit: int, me: str, incarnation: str) -> dict[str, object]:
        """The peer's commit log after position ``after``: its name, incarnation, last
        position, how many runs it holds after ``after``, up to ``limit`` runs, and up to
        where it has this node's (``me``, of ``incarnation``) log."""
        params = {"after": after, "limit": limit, "node": me, "incarnation": incarnation}
        answer: dict[str, object] = self.request("GET", "/cluster/log", params=params).json()
        self.name = str(answer["node"])
        self.incarnation = str(answer["incarnation"])
        self.facts = {k: v for k, v in answer.items() if k != "runs"}
        behind = bool(answer.get("behind_you"))
        if not behind:
            self.behind_since = None
        elif self.behind_since is None:
            self.behind_since = time.time()
        return answer

    def hello(self, me: str, incarnation: str) -> dict[str, object]:
        return self.log(0, 0, me, incarnation)

    def rows(self, run_id: str) -> pa.Table:
        return table_of(self.request("GET", f"/cluster/runs/{run_id}").content)

    def offer(self, stream: str, run_id: str, origin: int | None, table: pa.Table, me: str) -> None:
        """Give the peer a copy of a run; returns once it holds it durably."""
        params: dict[str, object] = {"run_id": run_id, "node": me}
        if origin is not None:
            params["origin"] = origin
        self.request(
            "POST",
            f"/cluster/runs/{stream}",
            params=params,
            content=table_bytes(table),
            headers={"content-type": ARROW_STREAM},
        )

    def ddl(self, kind: str, text: str) -> dict[str, object]:
        answer: dict[str, object] = self.request(
            "POST", "/cluster/ddl", json={"kind": kind, "sql": text}, timeout=DDL_TIMEOUT
        ).json()
        return answer

    def ddl_after(self, pos: int) -> dict[str, object]:
        answer: dict[str, object] = self.request(
            "GET", "/cluster/ddl", params={"after": pos}
        ).json()
        return answer
