"""Secrets: API tokens and their scopes, the dashboard role's password, password
verifiers, files that hold secrets, redacted URLs.

Nothing here logs a secret or puts one in an exception message: errors name the setting,
never its value.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
import secrets
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
import sqlalchemy as sa
from psycopg import sql

from server.errors import ReaderRoleError, SecretSettingError
from server.settings import Settings

log = logging.getLogger(__name__)

# The PostgreSQL role dashboards log in as (created by migration 0006).
READER_ROLE = "strata_reader"


class Scope(StrEnum):
    """What a token may do. STRATA_API_TOKEN holds every scope."""

    READ = "read"  # describe streams, run status
    INGEST = "ingest"  # post runs, run status
    DDL = "ddl"  # create and drop streams
    ADMIN = "admin"  # /info (it carries the owner's database URL) and future endpoints


# Setting name -> scopes its token grants.
TOKEN_SETTINGS: dict[str, frozenset[Scope]] = {
    "api_token": frozenset(Scope),
    "ddl_token": frozenset({Scope.DDL}),
    "ingest_token": frozenset({Scope.INGEST}),
    "read_token": frozenset({Scope.READ}),
}


def secret(settings: Settings, name: str) -> str | None:
    """The value of secret setting `name`, from STRATA_<NAME> or the file STRATA_<NAME>_FILE.

    An empty variable counts as unset; an empty file is an error (a secret went missing).
    """
    value = getattr(settings, name)
    path: Path | None = getattr(settings, f"{name}_file")
    variable = f"STRATA_{name.upper()}"
    text = value.get_secret_value() if value is not None else ""
    if path is None:
        return text or None
    if text:
        raise SecretSettingError(f"set {variable} or {variable}_FILE, not both")
    try:
        text = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise SecretSettingError(
            f"{variable}_FILE: cannot read {path}: {exc.strerror or type(exc).__name__}"
        ) from None
    if not text:
        raise SecretSettingError(f"{variable}_FILE: {path} is empty")
    return text


def _digest(token: str) -> bytes:
    # Comparing fixed-length digests keeps even the token's length out of the timing.
    return hashlib.sha256(token.encode()).digest()


@dataclass(frozen=True)
class Tokens:
    """The configured API tokens (as digests) and the scopes each grants."""

    entries: tuple[tuple[bytes, frozenset[Scope]], ...] = ()

    @classmethod
    def from_settings(cls, settings: Settings) -> Tokens:
        entries = []
        for name, scopes in TOKEN_SETTINGS.items():
            token = secret(settings, name)
            if token is not None:
                entries.append((_digest(token), scopes))
        return cls(tuple(entries))

    @property
    def enabled(self) -> bool:
        """Is any token configured? If not, the API is open (as on a laptop)."""
        return bool(self.entries)

    def scopes_of(self, presented: str) -> frozenset[Scope] | None:
        """Scopes of the presented token, None if it is no configured token.

        Constant time: every configured token is compared, with hmac.compare_digest, and
        the loop never stops early.
        """
        given = _digest(presented)
        granted: frozenset[Scope] = frozenset()
        matched = False
        for digest, scopes in self.entries:
            if hmac.compare_digest(given, digest):
                matched = True
                granted |= scopes
        return granted if matched else None


def configure_reader(engine: sa.Engine, password: str | None) -> None:
    """Apply STRATA_READER_PASSWORD to the role strata_reader (cluster-wide).

    Set: the role may log in with that password. Unset: its login is disabled. The
    password travels as a SCRAM-SHA-256 verifier computed here (as psql's \\password does),
    so neither the statement nor PostgreSQL's log ever holds it in clear.
    """
    raw = engine.raw_connection()
    try:
        connection = raw.driver_connection
        assert isinstance(connection, psycopg.Connection)
        role = sql.Identifier(READER_ROLE)
        if password is not None:
            verifier = connection.pgconn.encrypt_password(
                password.encode(), READER_ROLE.encode(), b"scram-sha-256"
            )
            statement = sql.SQL("ALTER ROLE {} WITH LOGIN PASSWORD {}").format(
                role, sql.Literal(verifier.decode())
            )
        else:
            row = connection.execute(
                "SELECT rolcanlogin FROM pg_roles WHERE rolname = %s", (READER_ROLE,)
            ).fetchone()
            connection.commit()
            if row is None or not row[0]:
                return
            statement = sql.SQL("ALTER ROLE {} WITH NOLOGIN PASSWORD NULL").format(role)
        try:
            connection.execute(statement)
            connection.commit()
        except psycopg.Error as exc:
            connection.rollback()
            reason = exc.diag.message_primary or type(exc).__name__
            if password is not None:
                raise ReaderRoleError(
                    f"STRATA_READER_PASSWORD is set, but the role {READER_ROLE} could not be "
                    f"given it: {reason}"
                ) from None
            log.warning(
                "STRATA_READER_PASSWORD is unset, but the role %s can log in and its login "
                "could not be disabled: %s",
                READER_ROLE,
                reason,
            )
            return
        if password is not None:
            log.info("role %s may log in with STRATA_READER_PASSWORD", READER_ROLE)
        else:
            log.info("role %s may no longer log in (STRATA_READER_PASSWORD unset)", READER_ROLE)
    finally:
        raw.close()


def scram_sha_256_verifier(password: str, *, iterations: int = 4096) -> str:
    """What PostgreSQL stores for `password` (RFC 5802/7677, as libpq's
    PQencryptPasswordConn computes it), for an ALTER ROLE that never carries the password.
    The password must be ASCII without control characters, which SASLprep leaves as is."""
    if not (password.isascii() and password.isprintable()):
        raise ValueError("only printable ASCII passwords are supported")
    salt = secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.digest(salted, b"Server Key", "sha256")

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


def write_private_file(path: Path, text: str, *, owner: int | None = None) -> None:
    """Write `text` to `path` readable and writable by its owner only (`owner`, a uid, if
    given; we must be root then) - from the first byte on, and atomically: a crash leaves
    the old file or the new one."""
    scratch = path.with_name(f".{path.name}.tmp")
    scratch.unlink(missing_ok=True)
    fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        if owner is not None:
            os.fchown(fd, owner, -1)
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    scratch.replace(path)


def redacted_url(url: str) -> str:
    """`url` with its password (if any) replaced by ***, for logs and console output."""
    parts = urlsplit(url)
    if parts.password is not None:
        user = parts.username or ""
        host = parts.netloc.rsplit("@", 1)[1]
        parts = parts._replace(netloc=f"{user}:***@{host}")
    query = parse_qsl(parts.query, keep_blank_values=True)
    if any(key == "password" for key, _ in query):  # libpq also takes ?password=...
        query = [(k, "***" if k == "password" else v) for k, v in query]
        parts = parts._replace(query=urlencode(query, safe="*"))
    return urlunsplit(parts)
