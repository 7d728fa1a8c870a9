"""The SQL port's listener: an asyncio server on an event loop of its own thread, so that it
runs beside the HTTP API (`strata up`) and beside a test's in-process server alike.

Each connection gets a session (server/pgwire/session.py) and a connection of its own to
Strata's PostgreSQL, opened as libpq would open it from ``database_url``: TCP or a unix
socket, TLS as its ``sslmode`` asks (libpq's default, ``prefer``: TLS when PostgreSQL
offers it). The port itself speaks plain TCP to its clients.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import ssl
import struct
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from psycopg.conninfo import conninfo_to_dict

from server.errors import SqlPortError
from server.pgwire import messages as m
from server.pgwire.commands import Commands
from server.pgwire.session import Port, Session
from server.service import StrataService
from server.settings import Settings

log = logging.getLogger("strata.pgwire")

# Worker threads for Strata's statements: a COPY holds one while its run commits.
_WORKER_THREADS = 64
_STOP_TIMEOUT_S = 10
# Parameters of a libpq URL that say where PostgreSQL is: the port's URL has its own.
_WHERE_PARAMETERS = ("host", "hostaddr", "port", "service", "target_session_attrs")


class SqlPort:
    """Serves the PostgreSQL protocol on ``settings.pg_host``:``settings.pg_port`` in front
    of the PostgreSQL of ``database_url``."""

    def __init__(self, service: StrataService, settings: Settings, database_url: str) -> None:
        self.settings = settings
        self.database_url = database_url
        options = {k: str(v) for k, v in conninfo_to_dict(database_url).items()}
        self._options = options
        self._executor = ThreadPoolExecutor(_WORKER_THREADS, thread_name_prefix="strata-sql")
        self._port = Port(
            service=service,
            settings=settings,
            commands=Commands(service, settings),
            executor=self._executor,
            owner=options.get("user", ""),
            database=options.get("dbname") or options.get("user", ""),
            connect=self._connect_upstream,
            cancel=self._forward_cancel,
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._sessions: set[asyncio.Task[None]] = set()
        self.port: int | None = None

    # ---- start and stop --------------------------------------------------------------

    def start(self) -> None:
        """Listen (raises SqlPortError if the port cannot be had), then serve in a thread."""
        host, wanted = self.settings.pg_host, self.settings.pg_port
        if self.settings.database_url is None and not _is_loopback(host):
            raise SqlPortError(
                f"STRATA_PG_HOST={host}: the embedded PostgreSQL serves this machine only; "
                "serve the SQL port beyond it only in front of an external PostgreSQL "
                "(STRATA_DATABASE_URL) that asks every role for a password"
            )
        loop = _new_event_loop()
        try:
            self._server = loop.run_until_complete(
                asyncio.start_server(self._accept, host, wanted, reuse_address=True)
            )
        except OSError as exc:
            loop.close()
            raise SqlPortError(
                f"the SQL port cannot listen on {host}:{wanted} ({exc.strerror or exc}); "
                "choose another with --pg-port or STRATA_PG_PORT"
            ) from None
        self.port = int(self._server.sockets[0].getsockname()[1])
        self._loop = loop
        self._thread = threading.Thread(
            target=loop.run_forever, name="strata-sql-port", daemon=True
        )
        self._thread.start()
        log.info("SQL port listening on %s:%d", host, self.port)

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(_STOP_TIMEOUT_S)
        except (TimeoutError, RuntimeError):
            log.warning("SQL port: sessions did not end in %d s", _STOP_TIMEOUT_S)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(_STOP_TIMEOUT_S)
        if not thread.is_alive():
            loop.close()
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._loop = self._thread = None

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._sessions):
            task.cancel()
        if self._sessions:
            await asyncio.wait(self._sessions, timeout=_STOP_TIMEOUT_S)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._sessions.add(task)
        try:
            await Session(self._port, reader, writer).run()
        except asyncio.CancelledError:
            pass  # the port is stopping: this connection ends here
        except Exception:  # one connection's failure never stops the port
            log.exception("SQL port: a session failed")
        finally:
            self._sessions.discard(task)

    # ---- where it is -----------------------------------------------------------------

    @property
    def psql_url(self) -> str:
        """``database_url`` pointing at the port: same user, password and database, and
        none of its parameters about where PostgreSQL is or how to reach it over TLS (the
        port speaks plain TCP)."""
        assert self.port is not None
        host = self.settings.pg_host
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        shown = f"[{host}]" if ":" in host else host
        parts = urlsplit(self.database_url)
        if parts.scheme in ("postgresql", "postgres"):
            credentials = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
            kept = [
                (key, value)
                for key, value in parse_qsl(parts.query, keep_blank_values=True)
                if not key.startswith("ssl") and key not in _WHERE_PARAMETERS
            ]
            return urlunsplit(
                parts._replace(netloc=f"{credentials}{shown}:{self.port}", query=urlencode(kept))
            )
        user, database = self._port.owner, self._port.database
        return f"postgresql://{user}@{shown}:{self.port}/{database}"

    # ---- PostgreSQL ------------------------------------------------------------------

    async def _connect_upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        options = self._options
        host = (options.get("host") or options.get("hostaddr") or "/tmp").split(",")[0]
        port = int((options.get("port") or "5432").split(",")[0])
        if host.startswith("/"):
            return await asyncio.open_unix_connection(str(Path(host) / f".s.PGSQL.{port}"))
        reader, writer = await asyncio.open_connection(host, port)
        mode = options.get("sslmode", "prefer")
        if mode in ("disable", "allow"):
            return reader, writer
        writer.write(struct.pack("!ii", 8, m.SSL_REQUEST))
        await writer.drain()
        answer = await reader.readexactly(1)
        if answer == b"S":
            await writer.start_tls(_tls_context(options, mode), server_hostname=host)
            return reader, writer
        if answer != b"N" or mode in ("require", "verify-ca", "verify-full"):
            writer.close()
            raise ConnectionError(
                f"PostgreSQL at {host}:{port} does not offer TLS, which sslmode={mode} of "
                "Strata's database URL asks for"
            )
        return reader, writer

    async def _forward_cancel(self, packet: bytes) -> None:
        """A CancelRequest is PostgreSQL's to honour (the key came from it), unless it is
        for a COPY (SUBSCRIBE ...), which runs here."""
        subscription = self._port.subscriptions.get(packet[8:16])
        if subscription is not None:
            subscription.set()
            return
        try:
            _reader, writer = await self._connect_upstream()
            writer.write(packet)
            await writer.drain()
            writer.close()
        except OSError as exc:
            log.info("SQL port: a cancel request could not be forwarded: %s", exc)


def _new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's event loop when it is installed (uvicorn[standard] brings it): the relay's
    cost per message is mostly the event loop's, and uvloop's is a fraction of asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _tls_context(options: dict[str, Any], mode: str) -> ssl.SSLContext:
    """The TLS context libpq would use for ``sslmode``: ``require`` (and ``prefer``)
    encrypt without checking the certificate (unless a root certificate is given),
    ``verify-ca`` checks it, ``verify-full`` also checks the host name."""
    root = options.get("sslrootcert") or str(Path.home() / ".postgresql" / "root.crt")
    verify = mode in ("verify-ca", "verify-full") or (
        mode == "require" and bool(options.get("sslrootcert")) and Path(root).exists()
    )
    context = ssl.create_default_context()
    if verify:
        context.load_verify_locations(root)
        context.check_hostname = mode == "verify-full"
    else:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if options.get("sslcert") and options.get("sslkey"):
        context.load_cert_chain(options["sslcert"], options["sslkey"])
    return context
