"""Framing of the PostgreSQL protocol (version 3) and the messages the SQL port reads or
writes itself (PostgreSQL documentation, "Frontend/Backend Protocol": "Message Flow" and
"Message Formats").

Every message but the first of a connection is a type byte, then a length that counts
itself (4 bytes, big-endian) and the body. The first (startup, SSL, GSSAPI or cancel
request) has no type byte. Relayed messages are forwarded as the bytes that came in; only
the messages the port answers itself are decoded and built here.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Sequence
from dataclasses import dataclass

PROTOCOL_3 = 3 << 16
SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
CANCEL_REQUEST = 80877102

# PostgreSQL's own limits: MAX_STARTUP_PACKET_LENGTH, and 1 GB for any other message.
MAX_STARTUP_LENGTH = 10_000
MAX_MESSAGE_LENGTH = 1 << 30
_READ_SIZE = 1 << 16

_INT16 = struct.Struct("!h")
_INT32 = struct.Struct("!i")
_HEADER = struct.Struct("!ci")


class ProtocolViolation(Exception):  # noqa: N818 - PostgreSQL's name for it (SQLSTATE 08P01)
    """The peer sent bytes that are not a well-formed message: the connection ends."""


@dataclass(frozen=True, slots=True)
class Message:
    """One message as it came in: ``raw`` is the whole of it, header included."""

    kind: bytes
    raw: bytes

    @property
    def body(self) -> memoryview:
        return memoryview(self.raw)[5:]


class MessageReader:
    """Reads whole messages from a stream, buffering what has arrived beyond them."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader
        self._buffer = bytearray()

    async def _fill(self, size: int) -> bool:
        """Read until ``size`` bytes are buffered; False at the end of the stream."""
        while len(self._buffer) < size:
            chunk = await self._reader.read(_READ_SIZE)
            if not chunk:
                return False
            self._buffer += chunk
        return True

    async def startup(self) -> bytes | None:
        """The first message of a connection, length included; None if the peer left."""
        if not await self._fill(4):
            if self._buffer:
                raise ProtocolViolation("incomplete startup packet")
            return None
        (length,) = _INT32.unpack_from(self._buffer)
        if not 8 <= length <= MAX_STARTUP_LENGTH:
            raise ProtocolViolation(f"invalid length of startup packet ({length})")
        if not await self._fill(length):
            raise ProtocolViolation("incomplete startup packet")
        packet = bytes(self._buffer[:length])
        del self._buffer[:length]
        return packet

    async def message(self) -> Message | None:
        """The next message; None if the stream ends between messages."""
        if not await self._fill(5):
            if self._buffer:
                raise ProtocolViolation("incomplete message: the connection ended inside it")
            return None
        kind, length = _HEADER.unpack_from(self._buffer)
        if not 4 <= length <= MAX_MESSAGE_LENGTH:
            raise ProtocolViolation(f"invalid message length {length} (type {kind!r})")
        if not await self._fill(length + 1):
            raise ProtocolViolation("incomplete message: the connection ended inside it")
        raw = bytes(self._buffer[: length + 1])
        del self._buffer[: length + 1]
        return Message(kind, raw)

    async def chunk(self) -> bytes:
        """What is buffered, else the next bytes that arrive (b"" at the end): for relaying
        a stream in the chunks it comes in, after reading some of it by messages."""
        if self._buffer:
            chunk = bytes(self._buffer)
            self._buffer.clear()
            return chunk
        return await self._reader.read(_READ_SIZE)

    def has_message(self) -> bool:
        """Is a whole message already buffered (so reading it will not wait)?"""
        if len(self._buffer) < 5:
            return False
        (length,) = _INT32.unpack_from(self._buffer, 1)
        return len(self._buffer) > length


def split_messages(buffer: bytes | bytearray, start: int = 0) -> tuple[list[tuple[int, int]], int]:
    """The whole messages in ``buffer`` from ``start``: (start, end) of each, and where the
    incomplete rest begins. Used to relay PostgreSQL's answers in the chunks they come in."""
    spans = []
    size = len(buffer)
    position = start
    while size - position >= 5:
        (length,) = _INT32.unpack_from(buffer, position + 1)
        if not 4 <= length <= MAX_MESSAGE_LENGTH:
            raise ProtocolViolation(f"invalid message length {length} from PostgreSQL")
        end = position + 1 + length
        if end > size:
            break
        spans.append((position, end))
        position = end
    return spans, position


# ---------------------------------------------------------------------------- decoding


class BodyReader:
    """Reads the fields of a message body in order."""

    def __init__(self, body: bytes | memoryview) -> None:
        self._body = bytes(body)
        self._position = 0

    def int16(self) -> int:
        value: int = self._unpack(_INT16)
        return value

    def int32(self) -> int:
        value: int = self._unpack(_INT32)
        return value

    def _unpack(self, layout: struct.Struct) -> int:
        if self._position + layout.size > len(self._body):
            raise ProtocolViolation("message body is shorter than its fields")
        (value,) = layout.unpack_from(self._body, self._position)
        self._position += layout.size
        return int(value)

    def cstring(self, encoding: str = "utf-8") -> str:
        end = self._body.find(b"\0", self._position)
        if end < 0:
            raise ProtocolViolation("unterminated string in message body")
        text = self._body[self._position : end].decode(encoding, "surrogateescape")
        self._position = end + 1
        return text

    def take(self, size: int) -> bytes:
        if size < 0 or self._position + size > len(self._body):
            raise ProtocolViolation("message body is shorter than its fields")
        chunk = self._body[self._position : self._position + size]
        self._position += size
        return chunk

    def byte(self) -> bytes:
        return self.take(1)


def startup_code(packet: bytes) -> int:
    (code,) = _INT32.unpack_from(packet, 4)
    return int(code)


def startup_parameters(packet: bytes) -> dict[str, str]:
    """The name/value pairs of a StartupMessage (user, database, options, ...)."""
    fields = packet[8:].split(b"\0")
    if len(fields) < 2 or fields[-1] != b"" or fields[-2] != b"":
        raise ProtocolViolation("startup packet is not a list of name/value strings")
    names_values = fields[:-2]
    if len(names_values) % 2:
        raise ProtocolViolation("startup packet has a name without a value")
    decoded = [f.decode("utf-8", "surrogateescape") for f in names_values]
    return dict(zip(decoded[::2], decoded[1::2], strict=True))


@dataclass(frozen=True)
class Parse:
    statement: str
    query: str
    parameter_types: tuple[int, ...]


@dataclass(frozen=True)
class Bind:
    portal: str
    statement: str
    parameter_formats: tuple[int, ...]
    parameters: tuple[bytes | None, ...]
    result_formats: tuple[int, ...]

    def parameter_format(self, index: int) -> int:
        """0 (text) or 1 (binary), as the format codes say for parameter ``index``."""
        if not self.parameter_formats:
            return 0
        if len(self.parameter_formats) == 1:
            return self.parameter_formats[0]
        return self.parameter_formats[index]


def decode_query(body: memoryview, encoding: str) -> str:
    return BodyReader(body).cstring(encoding)


def decode_parse(body: memoryview, encoding: str) -> Parse:
    reader = BodyReader(body)
    name = reader.cstring(encoding)
    query = reader.cstring(encoding)
    count = reader.int16()
    return Parse(name, query, tuple(reader.int32() for _ in range(count)))


def decode_bind(body: memoryview, encoding: str) -> Bind:
    reader = BodyReader(body)
    portal = reader.cstring(encoding)
    statement = reader.cstring(encoding)
    formats = tuple(reader.int16() for _ in range(reader.int16()))
    parameters: list[bytes | None] = []
    for _ in range(reader.int16()):
        size = reader.int32()
        parameters.append(None if size == -1 else reader.take(size))
    results = tuple(reader.int16() for _ in range(reader.int16()))
    if len(formats) not in (0, 1, len(parameters)):
        raise ProtocolViolation(
            f"bind message has {len(formats)} parameter formats but {len(parameters)} parameters"
        )
    return Bind(portal, statement, formats, tuple(parameters), results)


def decode_target(body: memoryview, encoding: str) -> tuple[str, str]:
    """Describe and Close: ('S' or 'P', name)."""
    reader = BodyReader(body)
    kind = reader.byte().decode("ascii", "replace")
    if kind not in ("S", "P"):
        raise ProtocolViolation(f"invalid describe or close target {kind!r}")
    return kind, reader.cstring(encoding)


def decode_execute(body: memoryview, encoding: str) -> tuple[str, int]:
    reader = BodyReader(body)
    return reader.cstring(encoding), reader.int32()


def decode_fields(body: memoryview) -> dict[str, str]:
    """ErrorResponse and NoticeResponse: field code -> value."""
    reader = BodyReader(body)
    fields: dict[str, str] = {}
    while True:
        code = reader.byte()
        if code == b"\0":
            return fields
        fields[code.decode("ascii", "replace")] = reader.cstring()


# ---------------------------------------------------------------------------- encoding


def _message(kind: bytes, body: bytes = b"") -> bytes:
    return kind + _INT32.pack(len(body) + 4) + body


def _cstring(text: str, encoding: str = "utf-8") -> bytes:
    return text.encode(encoding, "surrogateescape").replace(b"\0", b"") + b"\0"


def ready_for_query(status: str) -> bytes:
    return _message(b"Z", status.encode("ascii"))


def error_response(fields: dict[str, str], encoding: str = "utf-8") -> bytes:
    body = b"".join(code.encode("ascii") + _cstring(v, encoding) for code, v in fields.items())
    return _message(b"E", body + b"\0")


def notice_response(fields: dict[str, str], encoding: str = "utf-8") -> bytes:
    body = b"".join(code.encode("ascii") + _cstring(v, encoding) for code, v in fields.items())
    return _message(b"N", body + b"\0")


def row_description(columns: Sequence[tuple[str, int]], encoding: str = "utf-8") -> bytes:
    """Columns as (name, type oid), all in text format."""
    body = _INT16.pack(len(columns))
    for name, oid in columns:
        # table oid, column number, type oid, type size (-1: variable), modifier, format
        body += _cstring(name, encoding) + struct.pack("!ihihih", 0, 0, oid, -1, -1, 0)
    return _message(b"T", body)


def data_row(values: Sequence[str | None], encoding: str = "utf-8") -> bytes:
    body = _INT16.pack(len(values))
    for value in values:
        if value is None:
            body += _INT32.pack(-1)
        else:
            data = value.encode(encoding, "surrogateescape")
            body += _INT32.pack(len(data)) + data
    return _message(b"D", body)


def command_complete(tag: str) -> bytes:
    return _message(b"C", _cstring(tag))


def parameter_description(oids: Sequence[int]) -> bytes:
    return _message(b"t", _INT16.pack(len(oids)) + b"".join(_INT32.pack(o) for o in oids))


def copy_in_response(columns: int) -> bytes:
    """COPY FROM STDIN in text format (CSV is text too, as far as the protocol goes)."""
    return _message(b"G", b"\0" + _INT16.pack(columns) + _INT16.pack(0) * columns)


def copy_out_response(columns: int) -> bytes:
    """COPY TO STDOUT in text format."""
    return _message(b"H", b"\0" + _INT16.pack(columns) + _INT16.pack(0) * columns)


def copy_data(data: bytes) -> bytes:
    return _message(b"d", data)


def query(text: str, encoding: str = "utf-8") -> bytes:
    return _message(b"Q", _cstring(text, encoding))


EMPTY_QUERY_RESPONSE = _message(b"I")
PARSE_COMPLETE = _message(b"1")
BIND_COMPLETE = _message(b"2")
CLOSE_COMPLETE = _message(b"3")
NO_DATA = _message(b"n")
PORTAL_SUSPENDED = _message(b"s")
FLUSH = _message(b"H")
