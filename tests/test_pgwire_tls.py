"""The SQL port and TLS: it speaks plain TCP to its clients, and TLS to PostgreSQL when
``sslmode`` of Strata's database URL asks for it, as libpq would.

The embedded PostgreSQL is built without TLS, so the TLS side is checked against a stand-in
that speaks just enough of PostgreSQL's protocol over TLS (Python's ssl module) to answer
each query with whether it came encrypted. Its certificates are made here, with the
cryptography package (no openssl binary needed): a certificate authority of the test's own
and a server certificate it signs for 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import ipaddress
import ssl
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from server.pgwire import messages as m
from server.pgwire.server import SqlPort
from server.settings import Settings


@dataclass(frozen=True)
class Authority:
    """A self-signed certificate authority: its certificate (also written to ``path``, the
    ``sslrootcert`` a client trusts) and its key."""

    certificate: x509.Certificate
    key: ec.EllipticCurvePrivateKey
    path: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key_usage(*, signs_certificates: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not signs_certificates,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=signs_certificates,
        crl_sign=signs_certificates,
        encipher_only=False,
        decipher_only=False,
    )


def _builder(
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey
) -> x509.CertificateBuilder:
    now = datetime.now(UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(hours=1))
        .not_valid_after(now + timedelta(days=2))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
    )


def make_authority(directory: Path, common_name: str) -> Authority:
    key = ec.generate_private_key(ec.SECP256R1())
    certificate = (
        _builder(_name(common_name), _name(common_name), key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(signs_certificates=True), critical=True)
        .sign(key, hashes.SHA256())
    )
    path = directory / f"{common_name}.crt"
    path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return Authority(certificate, key, path)


def issue(
    authority: Authority, directory: Path, name: str, san: x509.GeneralName
) -> tuple[Path, Path]:
    """A server certificate for ``san`` signed by ``authority``: (certificate, key) files."""
    key = ec.generate_private_key(ec.SECP256R1())
    authority_key = authority.key.public_key()
    certificate = (
        _builder(_name(name), authority.certificate.subject, key)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(authority_key), critical=False
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(signs_certificates=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName([san]), critical=False)
        .sign(authority.key, hashes.SHA256())
    )
    certificate_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    certificate_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return certificate_path, key_path


LOOPBACK = x509.IPAddress(ipaddress.ip_address("127.0.0.1"))
UNVERIFIED = "could not connect to PostgreSQL: .*certificate verify failed"


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
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Authority]:
    """A directory for certificates, and the authority the stand-in's certificates come from."""
    directory = tmp_path_factory.mktemp("tls")
    return directory, make_authority(directory, "strata-test-ca")


@pytest.fixture(scope="module")
def stand_in(pki: tuple[Path, Authority]) -> Iterator[TlsStandIn]:
    """The stand-in with a certificate for 127.0.0.1, the address the port connects to."""
    directory, authority = pki
    server = TlsStandIn(*issue(authority, directory, "server", LOOPBACK))
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
    stand_in: TlsStandIn, pki: tuple[Path, Authority]
) -> None:
    assert _through_port(stand_in.url()) == "on"  # libpq's default, prefer
    assert _through_port(stand_in.url("?sslmode=require")) == "on"
    assert _through_port(stand_in.url("?sslmode=disable")) == "off"
    root = pki[1].path
    assert _through_port(stand_in.url(f"?sslmode=verify-ca&sslrootcert={root}")) == "on"
    assert _through_port(stand_in.url(f"?sslmode=verify-full&sslrootcert={root}")) == "on"


def test_a_certificate_that_does_not_verify_ends_the_connection(
    stand_in: TlsStandIn, tmp_path: Path
) -> None:
    other = make_authority(tmp_path, "someone-else")  # did not sign the stand-in's certificate
    # require with a root certificate verifies too, as libpq's does.
    for mode in ("verify-ca", "verify-full", "require"):
        with pytest.raises(psycopg.OperationalError, match=UNVERIFIED) as raised:
            _through_port(stand_in.url(f"?sslmode={mode}&sslrootcert={other.path}"))
        assert "unable to get local issuer certificate" in str(raised.value), mode


def test_verify_full_also_checks_the_host_name(pki: tuple[Path, Authority], tmp_path: Path) -> None:
    """A certificate the authority signed, for another host: verify-ca takes it (it checks
    the signature only), verify-full refuses it (127.0.0.1 is not the name it is for)."""
    authority = pki[1]
    elsewhere = issue(authority, tmp_path, "elsewhere", x509.DNSName("db.example.invalid"))
    server = TlsStandIn(*elsewhere)
    try:
        root = authority.path
        assert _through_port(server.url(f"?sslmode=verify-ca&sslrootcert={root}")) == "on"
        with pytest.raises(psycopg.OperationalError, match=UNVERIFIED) as raised:
            _through_port(server.url(f"?sslmode=verify-full&sslrootcert={root}"))
        assert "IP address mismatch" in str(raised.value)
    finally:
        server.close()


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
