"""The SQL port and TLS: it speaks plain TCP to its clients, and TLS to PostgreSQL when
``sslmode`` of Strata's database URL asks for it, as libpq would.

The embedded PostgreSQL is built without TLS, so the TLS side is checked against a stand-in
that speaks just enough of PostgreSQL's protocol over TLS (Python's ssl module, a
certificate made by openssl) to answer each query with whether it came encrypted.
"""

from __future__ import annotations

import asyncio
import shutil
import ssl
import struct
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from server.pgwire import messages as m
from server.pgwire.server import SqlPort
from server.settings import Settings

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


class TlsStandIn:
    """A PostgreSQL stand-in on 127.0.0.1: TLS when asked (SSLRequest), any user let in,
    every query answered with one row, 'on' if the connection is encrypted, else 'off'."""

    def __init__(self, certificate: Path, key: Path) -> None:
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(certificate, key)
        self.loop = asyncio.new_event_loop()
        self.server = self.loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", 0)
        )
        self.port = self.server.sockets[0].getsockname()[1]
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def url(self, query: str = "") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/strata{query}"

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        encrypted = False
        try:
            while True:
                (length,) = struct.unpack("!i", await reader.readexactly(4))
                packet = await reader.readexactly(length - 4)
                if struct.unpack("!i", packet[:4])[0] != m.SSL_REQUEST:
                    break
                writer.write(b"S")
                await writer.drain()
                await writer.start_tls(self.context)
                encrypted = True
            writer.write(b"R" + struct.pack("!ii", 8, 0))  # AuthenticationOk
            writer.write(m.ready_for_query("I"))
            while (kind := await reader.readexactly(1)) != b"X":
                (length,) = struct.unpack("!i", await reader.readexactly(4))
                await reader.readexactly(length - 4)
                if kind == b"Q":
                    writer.write(m.row_description([("ssl", 25)]))
                    writer.write(m.data_row(["on" if encrypted else "off"]))
                    writer.write(m.command_complete("SELECT 1"))
                    writer.write(m.ready_for_query("I"))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    directory = tmp_path_factory.mktemp("tls")
    certificate, key = directory / "server.crt", directory / "server.key"
    subprocess.run(
        [
            *("openssl", "req", "-new", "-x509", "-days", "2", "-nodes", "-newkey", "rsa:2048"),
            *("-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"),
            *("-keyout", str(key), "-out", str(certificate)),
        ],
        check=True,
        capture_output=True,
    )
    return certificate, key


@pytest.fixture(scope="module")
def stand_in(certificate: tuple[Path, Path]) -> Iterator[TlsStandIn]:
    server = TlsStandIn(*certificate)
    yield server
    server.close()


def _through_port(database_url: str) -> str:
    """Ask the stand-in, through a port in front of it, whether the port encrypts."""
    port = SqlPort(None, Settings(pg_port=0, database_url=database_url), database_url)  # type: ignore[arg-type]  # relaying only
    port.start()
    try:
        assert "ssl" not in port.psql_url  # clients reach the port in plain text
        with psycopg.connect(port.psql_url, autocommit=True) as connection:
            return str(connection.execute("SELECT whatever").fetchone()[0])  # type: ignore[index]
    finally:
        port.stop()


def test_the_port_uses_tls_as_sslmode_asks(
    stand_in: TlsStandIn, certificate: tuple[Path, Path]
) -> None:
    assert _through_port(stand_in.url()) == "on"  # libpq's default, prefer
    assert _through_port(stand_in.url("?sslmode=require")) == "on"
    assert _through_port(stand_in.url("?sslmode=disable")) == "off"
    root = certificate[0]
    assert _through_port(stand_in.url(f"?sslmode=verify-full&sslrootcert={root}")) == "on"


def test_a_certificate_that_does_not_verify_ends_the_connection(
    stand_in: TlsStandIn, tmp_path: Path
) -> None:
    other = tmp_path / "other.crt"
    subprocess.run(
        [
            *("openssl", "req", "-new", "-x509", "-days", "2", "-nodes", "-newkey", "rsa:2048"),
            *("-subj", "/CN=someone-else", "-keyout", str(tmp_path / "other.key")),
            *("-out", str(other)),
        ],
        check=True,
        capture_output=True,
    )
    with pytest.raises(psycopg.OperationalError, match="could not connect to PostgreSQL"):
        _through_port(stand_in.url(f"?sslmode=verify-ca&sslrootcert={other}"))


def test_sslmode_require_refuses_a_postgresql_without_tls(pg_url: str) -> None:
    # The embedded PostgreSQL answers an SSLRequest with 'N'.
    with pytest.raises(psycopg.OperationalError, match="does not offer TLS"):
        _through_port(pg_url + "?sslmode=require")


def test_clients_asking_the_port_for_tls_are_told_it_has_none(pg_url: str) -> None:
    port = SqlPort(None, Settings(pg_port=0, database_url=pg_url), pg_url)  # type: ignore[arg-type]
    port.start()
    try:
        with pytest.raises(psycopg.OperationalError, match="SSL"):
            psycopg.connect(port.psql_url + "?sslmode=require")
        with psycopg.connect(port.psql_url + "?sslmode=prefer") as connection:
            assert connection.execute("SELECT 1").fetchone() == (1,)
    finally:
        port.stop()
