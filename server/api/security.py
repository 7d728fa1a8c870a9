"""Bearer tokens on every endpoint but /health: which scope each endpoint needs.

The check is one dependency added to every router but /health's (see app.py), so a new
endpoint is protected without anyone remembering to. An endpoint missing from SCOPES needs
the read scope if it is a GET, else the admin scope (STRATA_API_TOKEN only).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Request, Security
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from server.errors import Forbidden, Unauthorized
from server.security import Scope, Tokens

# (method, path template) -> the scopes any one of which grants access.
SCOPES: dict[tuple[str, str], frozenset[Scope]] = {
    ("POST", "/streams"): frozenset({Scope.DDL}),
    ("DELETE", "/streams/{name}"): frozenset({Scope.DDL}),
    ("GET", "/streams"): frozenset({Scope.READ, Scope.DDL}),
    ("GET", "/streams/{name}"): frozenset({Scope.READ, Scope.DDL}),
    ("POST", "/streams/{name}/runs"): frozenset({Scope.INGEST}),
    ("GET", "/runs/{run_id}"): frozenset({Scope.READ, Scope.INGEST}),
    ("GET", "/metrics"): frozenset({Scope.READ}),
    # /info carries the database URL Strata itself uses, with its password if it has one.
    ("GET", "/info"): frozenset({Scope.ADMIN}),
    ("GET", "/cluster"): frozenset({Scope.READ}),
    # Between nodes (every node has the same STRATA_API_TOKEN): runs' rows and the DDL log.
    ("GET", "/cluster/log"): frozenset({Scope.ADMIN}),
    ("GET", "/cluster/runs/{run_id}"): frozenset({Scope.ADMIN}),
    ("GET", "/cluster/ddl"): frozenset({Scope.ADMIN}),
}

bearer = HTTPBearer(
    auto_error=False,
    scheme_name="token",
    description="`Authorization: Bearer <token>` with STRATA_API_TOKEN (every scope) or a "
    "scoped token: STRATA_READ_TOKEN, STRATA_INGEST_TOKEN, STRATA_DDL_TOKEN. Required on "
    "every endpoint but /health once any token is configured.",
)


def required_scopes(method: str, path: str) -> frozenset[Scope]:
    method = "GET" if method == "HEAD" else method
    default = Scope.READ if method == "GET" else Scope.ADMIN
    return SCOPES.get((method, path), frozenset({default}))


def check(request: Request, credentials: HTTPAuthorizationCredentials | None) -> None:
    """Raise Unauthorized or Forbidden unless the request may use its endpoint."""
    tokens: Tokens = request.app.state.tokens
    if not tokens.enabled:
        return
    if credentials is None:
        raise Unauthorized("authentication required: send 'Authorization: Bearer <token>'")
    granted = tokens.scopes_of(credentials.credentials)
    if granted is None:
        raise Unauthorized("invalid token")
    route = request.scope.get("route")
    path = route.path if isinstance(route, APIRoute) else request.url.path
    needed = required_scopes(request.method, path)
    if not granted & needed:
        scopes = " or ".join(sorted(needed))
        raise Forbidden(f"this token may not {request.method} {path}: it needs the {scopes} scope")


# The console's sign-in (/console/login) keeps the token in this cookie: a browser's
# EventSource cannot send an Authorization header. SameSite=Strict keeps other sites'
# requests from carrying it.
TOKEN_COOKIE = "strata_token"


async def authorize(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)],
) -> None:
    if credentials is None and TOKEN_COOKIE in request.cookies:
        credentials = HTTPAuthorizationCredentials(
            scheme="Bearer", credentials=request.cookies[TOKEN_COOKIE]
        )
    check(request, credentials)


async def check_request(request: Request) -> None:
    """`check` for a request whose dependencies never ran (e.g. its JSON body was invalid)."""
    check(request, await bearer(request))
