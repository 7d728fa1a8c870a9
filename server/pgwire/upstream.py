"""A session's own connection to PostgreSQL: what the port forwarded to it, and which of
its answers are still due.

Order is the point. A client may send many messages before reading any answer (pipelining,
the extended protocol's Parse/Bind/Execute/Sync), and the port answers some messages
itself. Its answers must come after PostgreSQL's answers to everything the client sent
before, so every forwarded message is booked with what completes its answer (``Expect``),
and ``turn`` waits until none is due before the port answers. PostgreSQL's messages are
relayed to the client in the chunks they come in (a DataRow costs one byte compare); only
the others are looked at, to settle the books and to learn the transaction status.

After an error in the extended protocol PostgreSQL skips every message up to the next
Sync: the messages forwarded meanwhile are booked as answered (``failed``), and the port
skips its own ones too.
"""

from __future__ import annotations

import asyncio
import codecs
from collections import deque
from dataclasses import dataclass

from server.pgwire import messages as m

# PostgreSQL encoding names -> Python codecs, for the client encodings people use.
_ENCODINGS = {"UTF8": "utf-8", "SQL_ASCII": "utf-8", "LATIN1": "latin-1", "WIN1252": "cp1252"}
# Authentication requests PostgreSQL waits on the client to answer (password, SASL, GSS).
_AUTH_ANSWERED = (2, 3, 5, 7, 8, 9, 10, 11)


class Expect:
    """What a forwarded message is, by the types of PostgreSQL's messages that end its
    answer (``completes``). Plain attributes, read for every message relayed."""

    __slots__ = ("completes", "ends_with_ready", "name")

    def __init__(self, name: str, completes: bytes) -> None:
        self.name = name
        self.completes = completes
        self.ends_with_ready = completes == b"Z"

    def __repr__(self) -> str:
        return f"Expect.{self.name}"

    PARSE: Expect
    BIND: Expect
    CLOSE: Expect
    DESCRIBE: Expect
    EXECUTE: Expect
    SYNC: Expect
    QUERY: Expect
    SCRIPT: Expect
    ABORT: Expect


Expect.PARSE = Expect("PARSE", b"1")
Expect.BIND = Expect("BIND", b"2")
Expect.CLOSE = Expect("CLOSE", b"3")
Expect.DESCRIBE = Expect("DESCRIBE", b"Tn")
Expect.EXECUTE = Expect("EXECUTE", b"CIs")
Expect.SYNC = Expect("SYNC", b"Z")
# A simple query or a function call: everything up to ReadyForQuery.
Expect.QUERY = Expect("QUERY", b"Z")
# One part of a multi-statement query string: its ReadyForQuery is not relayed.
Expect.SCRIPT = Expect("SCRIPT", b"Z")
# The port's statement that aborts a transaction: nothing of its answer is relayed.
Expect.ABORT = Expect("ABORT", b"Z")


@dataclass
class Pending:
    """A forwarded message whose answer is due; ``failed`` once PostgreSQL refused it."""

    expect: Expect
    failed: bool = False


class ClientGone(Exception):  # noqa: N818 - control flow
    """The client closed the connection."""


# Sent to abort PostgreSQL's transaction when the port refuses a Strata statement inside
# it; its error is not relayed (the port sends its own).
ABORT_TRANSACTION = (
    "DO $strata$ BEGIN RAISE EXCEPTION USING ERRCODE = '25001', "
    "MESSAGE = 'a Strata statement was refused inside this transaction block'; END $strata$"
)


class Upstream:
    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        client: asyncio.StreamWriter,
    ) -> None:
        self.messages = m.MessageReader(reader)
        self.writer = writer
        self.client = client
        self.status = "I"  # of the last ReadyForQuery (or of BEGIN/COMMIT, before it)
        self.encoding = "utf-8"  # the client encoding, as PostgreSQL reports it
        self.failed = False  # PostgreSQL skips messages until the client's next Sync
        self.backend_key: bytes | None = None  # PostgreSQL's BackendKeyData (pid, key)
        self._outgoing: list[bytes] = []
        self._expected: deque[Pending] = deque()
        self._idle = asyncio.Event()
        self._idle.set()
        self._copying = asyncio.Event()  # PostgreSQL waits for COPY data

    # ---- start and end ---------------------------------------------------------------

    async def authenticate(self, startup: bytes, client: m.MessageReader) -> bool:
        """Relay the startup packet and the authentication exchange byte for byte; True
        once PostgreSQL is ready for queries."""
        self.writer.write(startup)
        while True:
            message = await self.messages.message()
            if message is None:
                return False
            self.client.write(message.raw)
            kind = message.kind
            if kind == b"R" and m.BodyReader(message.body).int32() in _AUTH_ANSWERED:
                await self.client.drain()
                answer = await client.message()
                if answer is None:
                    return False
                self.writer.write(answer.raw)
            elif kind == b"S":
                self._parameter_status(message.body)
            elif kind == b"K":  # the key a CancelRequest of this session will carry
                self.backend_key = bytes(message.body)
            elif kind == b"E":
                await self.client.drain()
                return False
            elif kind == b"Z":
                self.status = chr(message.raw[5])
                await self.client.drain()
                return True

    def close(self) -> None:
        try:
            self.writer.write(b"X\0\0\0\4")  # Terminate
            self.writer.close()
        except (ConnectionError, RuntimeError):
            pass

    # ---- the client's messages to PostgreSQL -----------------------------------------

    def forward(self, message: bytes, expect: Expect | None) -> Pending | None:
        """Queue ``message`` for PostgreSQL (sent at the next ``flush``), booking its answer
        unless it has none or PostgreSQL will skip it."""
        self._outgoing.append(message)
        if expect is None or (self.failed and not expect.ends_with_ready):
            return None
        pending = Pending(expect)
        self._expected.append(pending)
        self._idle.clear()
        return pending

    def sync(self, message: bytes) -> None:
        """Forward the client's Sync: what follows is PostgreSQL's next batch."""
        self.failed = False
        self.forward(message, Expect.SYNC)

    async def flush(self) -> None:
        if self._outgoing:
            self.writer.write(b"".join(self._outgoing))
            self._outgoing.clear()
            await self.writer.drain()

    async def turn(self, client: m.MessageReader) -> bool:
        """Wait until PostgreSQL has answered every message forwarded so far, so that the
        port may answer the next one; False if PostgreSQL skips the current batch (an
        error), and so must the port. A COPY met meanwhile gets the client's data."""
        if self._expected and not self._expected[-1].expect.ends_with_ready:
            self._outgoing.append(m.FLUSH)  # PostgreSQL holds its answers until Sync or Flush
        await self.flush()
        while not self._idle.is_set():
            if self._copying.is_set():
                await self._pump_copy(client)
                continue
            waiters = [asyncio.ensure_future(e.wait()) for e in (self._idle, self._copying)]
            try:
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waiters:
                    waiter.cancel()
        return not self.failed

    async def run_part(self, query: bytes, client: m.MessageReader) -> bool:
        """Run one part of a multi-statement query string; False if it failed."""
        pending = self.forward(query, Expect.SCRIPT)
        await self.turn(client)
        return pending is not None and not pending.failed

    async def abort_transaction(self, client: m.MessageReader) -> None:
        """Make PostgreSQL's transaction fail, as the port's refusal failed the client's."""
        self.forward(m.query(ABORT_TRANSACTION), Expect.ABORT)
        await self.turn(client)

    async def _pump_copy(self, client: m.MessageReader) -> None:
        """Forward the client's COPY data to PostgreSQL (a COPY in a multi-statement query
        string, while the port waits for that string's end)."""
        while True:
            message = await client.message()
            if message is None:
                raise ClientGone
            self.writer.write(message.raw)
            if message.kind in (b"c", b"f"):
                break
        self._copying.clear()
        await self.writer.drain()

    # ---- PostgreSQL's messages to the client -----------------------------------------

    async def relay(self) -> None:
        """Copy PostgreSQL's messages to the client until PostgreSQL closes the connection
        (its FATAL error, if any, relayed)."""
        buffer = bytearray()
        while True:
            chunk = await self.messages.chunk()
            if not chunk:
                return
            buffer += chunk
            spans, rest = m.split_messages(buffer)
            relayed = 0
            for start, end in spans:
                if buffer[start] == 0x44:  # DataRow: the bulk of most answers
                    continue
                if not self._book(bytes(buffer[start : start + 1]), buffer, start, end):
                    self.client.write(buffer[relayed:start])
                    relayed = end
            self.client.write(buffer[relayed:rest])
            del buffer[:rest]
            await self.client.drain()

    def _book(self, kind: bytes, buffer: bytearray, start: int, end: int) -> bool:
        """Book a message of PostgreSQL's; False if it is not for the client."""
        head = self._expected[0] if self._expected else None
        if kind == b"Z":
            self.status = chr(buffer[start + 5])
            self._copying.clear()
            relay = True
            while self._expected:  # after an error, the entries of skipped messages too
                pending = self._expected.popleft()
                if pending.expect.ends_with_ready:
                    relay = pending.expect not in (Expect.SCRIPT, Expect.ABORT)
                    break
            self.failed = False
            self._settle()
            return relay
        if kind == b"E":
            self._copying.clear()
            if self.status == "T":
                self.status = "E"
            if head is None:
                return True
            if head.expect.ends_with_ready:
                head.failed = True
                return head.expect is not Expect.ABORT
            # PostgreSQL now skips every message up to the next Sync.
            while self._expected and not self._expected[0].expect.ends_with_ready:
                self._expected.popleft()
            if not self._expected:
                self.failed = True
            self._settle()
            return True
        if kind == b"S":
            self._parameter_status(memoryview(buffer)[start + 5 : end])
        elif kind in (b"G", b"W"):
            self._copying.set()
        elif kind == b"C":
            self._copying.clear()
            self._track_transaction(bytes(buffer[start + 5 : end - 1]))
        if head is not None:
            if kind in head.expect.completes and not head.expect.ends_with_ready:
                self._expected.popleft()
                self._settle()
            elif head.expect is Expect.ABORT:
                return False
        return True

    def _track_transaction(self, tag: bytes) -> None:
        """The status a Sync would report, known before it comes (the extended protocol
        may run BEGIN and a Strata statement in one batch)."""
        word = tag.split(b" ", 1)[0]
        if word in (b"BEGIN", b"START"):
            self.status = "T"
        elif word in (b"COMMIT", b"ROLLBACK"):
            self.status = "I"

    def _settle(self) -> None:
        if self._expected:
            self._idle.clear()
        else:
            self._idle.set()

    def _parameter_status(self, body: memoryview) -> None:
        reader = m.BodyReader(body)
        name, value = reader.cstring(), reader.cstring()
        if name == "client_encoding":
            codec = _ENCODINGS.get(value.upper().replace("-", ""))
            if codec is None:
                try:
                    codec = codecs.lookup(value).name
                except LookupError:
                    codec = "utf-8"
            self.encoding = codec
