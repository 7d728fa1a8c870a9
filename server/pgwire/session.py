"""One client connection of the SQL port: PostgreSQL's protocol, relayed to a PostgreSQL
connection of its own (server/pgwire/upstream.py), with Strata's statements answered here.

The startup and the authentication are relayed byte for byte: PostgreSQL checks the
password, and the port learns the role from the startup message once PostgreSQL accepts
it. The BackendKeyData is PostgreSQL's, so a CancelRequest is forwarded to it as it came.
Then two tasks share the connection: the client task reads the client's messages in order
and forwards each one or answers it, the relay task copies PostgreSQL's answers back.

In the simple protocol a query string is answered by PostgreSQL unless one of its
statements is Strata's (server/pgwire/statements.py). In the extended protocol a Parse of
a Strata statement is prepared by the port, and so are the portals bound to it: Bind,
Describe, Execute and Close of those names are answered here, all else goes on.

Transactions: a Strata statement commits on its own (a run is committed, a stream created,
when its command completes), so it cannot be part of a transaction that could still roll
back. Inside BEGIN ... COMMIT it is refused with SQLSTATE 25001, as PostgreSQL refuses its
own CREATE DATABASE there, and the refusal aborts PostgreSQL's transaction too, so the
client's COMMIT rolls back, as after any error. A query string of several statements runs
them one after the other, each on its own, up to the first error (PostgreSQL would run it
as one transaction: with a Strata statement among them it cannot be one).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rewriter.errors import InvalidSQL, StrataError
from server.catalog import StreamRecord
from server.errors import (
    CopyFailed,
    Forbidden,
    InTransactionBlock,
    InvalidValue,
    PayloadTooLarge,
    SubscriptionCanceled,
    TransactionAborted,
)
from server.ingest.admission import admit
from server.pgwire import messages as m
from server.pgwire import subscribe
from server.pgwire.commands import Commands, Result, copy_setup, raw_columns, result_columns
from server.pgwire.errors import fields_of, notice, protocol_violation
from server.pgwire.lexer import Unreadable, split
from server.pgwire.statements import (
    AlterStream,
    CloseSubscription,
    CopyFrom,
    CopySubscribe,
    CreateStream,
    DeclareSubscription,
    DropStream,
    ExplainStream,
    FetchSubscription,
    Insert,
    Refused,
    ShowSinks,
    ShowStreams,
    SinkStatement,
    Statement,
    Subscription,
    changes_streams,
    classify,
    may_hold_strata,
    title,
)
from server.pgwire.upstream import ClientGone, Expect, Upstream
from server.pgwire.values import insert_records, parameter_text, parameter_types, type_oid
from server.service import StrataService
from server.settings import Settings

log = logging.getLogger("strata.pgwire")

T = TypeVar("T")


@dataclass(frozen=True)
class Port:
    """What every session of the port shares."""

    service: StrataService
    settings: Settings
    commands: Commands
    executor: Executor
    owner: str  # the role Strata's statements that change streams need: Strata's own
    database: str  # the database whose streams they are
    connect: Callable[[], Any]  # -> awaitable (reader, writer) to PostgreSQL
    cancel: Callable[[bytes], Any]  # -> awaitable: forwards a CancelRequest
    # The COPY (SUBSCRIBE ...) running, by their session's backend key: a CancelRequest
    # with that key ends it (PostgreSQL has nothing running to cancel).
    subscriptions: dict[bytes, asyncio.Event] = field(default_factory=dict)


@dataclass(frozen=True)
class _Part:
    """A statement of a query string: ``text[start:end]``; ``statement`` if Strata's."""

    start: int
    end: int
    statement: Statement | Refused | None
    stream: StreamRecord | None


@dataclass
class _Prepared:
    """A statement the port prepared (the extended protocol's Parse of a Strata one)."""

    query: str
    statement: Statement
    stream: StreamRecord | None
    parameter_oids: tuple[int, ...]


@dataclass
class _Portal:
    prepared: _Prepared
    parameters: list[str | None]
    rows: list[list[str | None]] | None = None  # of a result not yet fully fetched
    tag: str = ""
    done: bool = False


class Session:
    def __init__(
        self, port: Port, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.port = port
        self.client = m.MessageReader(reader)
        self.client_writer = writer
        self.user = ""
        self.database = ""
        self._upstream: Upstream | None = None
        self._discarding = False  # the port skips messages until Sync (after its error)
        self._statements: dict[str, _Prepared] = {}
        self._portals: dict[str, _Portal] = {}
        self._strata = False  # does this session take Strata's statements?
        self._cursors: dict[str, subscribe.Subscription] = {}  # subscription cursors

    @property
    def upstream(self) -> Upstream:
        assert self._upstream is not None
        return self._upstream

    @property
    def encoding(self) -> str:
        return self._upstream.encoding if self._upstream is not None else "utf-8"

    # ---- the connection --------------------------------------------------------------

    async def run(self) -> None:
        tasks: list[asyncio.Task[None]] = []
        try:
            if not await self._start():
                return
            tasks = [
                asyncio.create_task(self.upstream.relay()),
                asyncio.create_task(self._serve()),
            ]
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()
        except m.ProtocolViolation as violation:
            log.info("SQL port: closing a connection: %s", violation)
            self.client_writer.write(m.error_response(protocol_violation(str(violation))))
        except (ClientGone, ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            for task in tasks:
                task.cancel()
            await self._close()

    async def _close(self) -> None:
        if self._upstream is not None:
            self._upstream.close()
        try:
            self.client_writer.close()
            await asyncio.wait_for(self.client_writer.wait_closed(), 5)
        except (ConnectionError, TimeoutError, RuntimeError):
            pass

    async def _start(self) -> bool:
        """Relay the startup and authentication; True once PostgreSQL is ready."""
        while True:
            packet = await self.client.startup()
            if packet is None:
                return False
            code = m.startup_code(packet)
            if code in (m.SSL_REQUEST, m.GSSENC_REQUEST):
                # The port speaks plain TCP to clients (see README, "SQL port").
                self.client_writer.write(b"N")
                await self.client_writer.drain()
                continue
            if code == m.CANCEL_REQUEST:
                await self.port.cancel(packet)
                return False
            if code >> 16 != 3:
                self.client_writer.write(
                    m.error_response(
                        protocol_violation(f"unsupported frontend protocol {code >> 16}")
                    )
                )
                return False
            break
        parameters = m.startup_parameters(packet)
        self.user = parameters.get("user", "")
        self.database = parameters.get("database") or self.user
        try:
            upstream_reader, upstream_writer = await self.port.connect()
        except (OSError, ConnectionError, asyncio.IncompleteReadError) as exc:
            fields = {
                "S": "FATAL",
                "V": "FATAL",
                "C": "08006",
                "M": f"the SQL port could not connect to PostgreSQL: {exc}",
            }
            self.client_writer.write(m.error_response(fields))
            return False
        self._upstream = Upstream(upstream_reader, upstream_writer, self.client_writer)
        if not await self._upstream.authenticate(packet, self.client):
            return False
        # Strata's statements are served where Strata's streams are, and not to replication
        # connections (their commands are PostgreSQL's walsender's).
        self._strata = self.database == self.port.database and not parameters.get("replication")
        return True

    # ---- the client's messages ------------------------------------------------------

    async def _turn(self) -> bool:
        return await self.upstream.turn(self.client)

    async def _serve(self) -> None:
        while True:
            if not self.client.has_message():
                await self.upstream.flush()
                await self.client_writer.drain()
            message = await self.client.message()
            if message is None:
                return
            kind = message.kind
            if self._discarding:
                if kind == b"S":
                    self._discarding = False
                    self.upstream.sync(message.raw)
                elif kind == b"X":
                    return
                continue
            if kind in _NAMED and not self._statements and not self._portals:
                # No statement of the port's here: nothing to look up (most traffic).
                self.upstream.forward(message.raw, _NAMED[kind])
            elif kind == b"Q":
                await self._query(message)
            elif kind == b"P":
                await self._parse(message)
            elif kind == b"B":
                await self._bind(message)
            elif kind == b"D":
                await self._describe(message)
            elif kind == b"E":
                await self._execute(message)
            elif kind == b"C":
                await self._close_target(message)
            elif kind == b"S":
                self.upstream.sync(message.raw)
            elif kind == b"F":
                self.upstream.forward(message.raw, Expect.QUERY)
            elif kind == b"X":
                return
            else:  # Flush, COPY data, and what PostgreSQL answers itself
                self.upstream.forward(message.raw, None)

    # ---- the simple protocol ---------------------------------------------------------

    async def _query(self, message: m.Message) -> None:
        text = m.decode_query(message.body, self.encoding)
        statements = await self._strata_statements(text)
        if statements is None:
            self.upstream.forward(message.raw, Expect.QUERY)
            return
        await self._turn()
        if len(statements) == 1 and statements[0].statement is not None:
            await self._run_simple(text, statements[0].statement, statements[0].stream)
        else:
            await self._run_script(text, statements)
        self.client_writer.write(m.ready_for_query(self.upstream.status))

    async def _strata_statements(self, text: str) -> list[_Part] | None:
        """The statements of ``text``, if any is Strata's; None if PostgreSQL is to run the
        string as it is."""
        if not self._strata or not may_hold_strata(text):
            return None
        try:
            pieces = [p for p in split(text) if p.tokens]
        except Unreadable:
            return None
        parts: list[_Part] = []
        for piece in pieces:
            statement: Statement | Refused | None
            try:
                statement = classify(text, piece)
            except Refused as refused:
                statement = refused
            stream = None
            if (
                isinstance(statement, FetchSubscription | CloseSubscription)
                and statement.cursor not in self._cursors
            ):
                statement = None  # a cursor of PostgreSQL's
            if isinstance(statement, CopyFrom | Insert):
                stream = await self._call(self.port.commands.stream_of, statement.target)
                if stream is None:
                    statement = None  # into a table of PostgreSQL's
            # A part runs to its semicolon, included: PostgreSQL takes it as it came.
            parts.append(_Part(piece.start, min(piece.end + 1, len(text)), statement, stream))
        return parts if any(p.statement is not None for p in parts) else None

    async def _run_script(self, text: str, parts: list[_Part]) -> None:
        """A query string of several statements, some Strata's: each runs in turn, on its
        own; consecutive statements of PostgreSQL's go to it together."""
        index = 0
        while index < len(parts):
            part = parts[index]
            if part.statement is not None:
                if not await self._run_simple(text, part.statement, part.stream):
                    return
                index += 1
                continue
            start = part.start
            while index < len(parts) and parts[index].statement is None:
                end = parts[index].end
                index += 1
            if not await self.upstream.run_part(
                m.query(text[start:end], self.encoding), self.client
            ):
                return

    async def _run_simple(
        self, text: str, statement: Statement | Refused, stream: StreamRecord | None
    ) -> bool:
        """Answer a Strata statement of a simple query (all but ReadyForQuery); False if it
        failed."""
        try:
            if isinstance(statement, Refused):
                raise statement
            self._check(statement)
            if isinstance(statement, CopyFrom):
                assert stream is not None
                result = await self._copy(statement, stream)
            elif isinstance(statement, CopySubscribe):
                result = await self._copy_subscription(statement)
            else:
                result = await self._execute_statement(statement, stream, [])
            self._write_result(result, describe=True)
            return True
        except Exception as error:  # every failure is the client's ErrorResponse
            await self._fail(error, text, statement)
            return False

    # ---- the extended protocol -------------------------------------------------------

    async def _parse(self, message: m.Message) -> None:
        if not self._statements and not (self._strata and may_hold_strata(message.raw)):
            self.upstream.forward(message.raw, Expect.PARSE)
            return
        parse = m.decode_parse(message.body, self.encoding)
        statements = await self._strata_statements(parse.query)
        if statements is None:
            self._statements.pop(parse.statement, None)
            self.upstream.forward(message.raw, Expect.PARSE)
            return
        if not await self._turn():
            return
        try:
            if len(statements) > 1:
                raise Refused(
                    InvalidSQL("cannot insert multiple commands into a prepared statement"),
                    statements[1].start,
                )
            statement, stream = statements[0].statement, statements[0].stream
            assert statement is not None
            if isinstance(statement, Refused):
                raise statement
            if isinstance(statement, (CopyFrom, Insert)) and statement.problem is not None:
                raise statement.problem
            if parse.statement and parse.statement in self._statements:
                raise _Duplicate(f"prepared statement {parse.statement!r} already exists")
            self._statements[parse.statement] = _Prepared(
                parse.query, statement, stream, parse.parameter_types
            )
            self.client_writer.write(m.PARSE_COMPLETE)
        except Exception as error:
            await self._fail(error, parse.query, statements[0].statement, extended=True)

    async def _bind(self, message: m.Message) -> None:
        bind = m.decode_bind(message.body, self.encoding)
        prepared = self._statements.get(bind.statement)
        if prepared is None:
            self._portals.pop(bind.portal, None)
            self.upstream.forward(message.raw, Expect.BIND)
            return
        if not await self._turn():
            return
        try:
            parameters = self._parameters(prepared, bind)
            self._portals[bind.portal] = _Portal(prepared, parameters)
            self.client_writer.write(m.BIND_COMPLETE)
        except Exception as error:
            await self._fail(error, prepared.query, None, extended=True)

    def _parameters(self, prepared: _Prepared, bind: m.Bind) -> list[str | None]:
        statement = prepared.statement
        if not isinstance(statement, Insert):
            if bind.parameters:
                raise InvalidSQL(
                    f"bind message supplies {len(bind.parameters)} parameters, but the "
                    "statement requires 0"
                )
            return []
        if len(bind.parameters) != statement.parameters:
            raise InvalidSQL(
                f"bind message supplies {len(bind.parameters)} parameters, but the statement "
                f"requires {statement.parameters}"
            )
        assert prepared.stream is not None
        columns = raw_columns(prepared.stream)
        oids = parameter_types(statement, columns)
        by_oid = {type_oid(c.type): c.type.name for c in columns}
        texts = []
        for index, value in enumerate(bind.parameters):
            declared = prepared.parameter_oids[index] if index < len(prepared.parameter_oids) else 0
            texts.append(
                parameter_text(
                    value,
                    bind.parameter_format(index) == 1,
                    declared,
                    by_oid.get(oids[index], "text"),
                    self.encoding,
                )
            )
        return texts

    async def _describe(self, message: m.Message) -> None:
        target, name = m.decode_target(message.body, self.encoding)
        prepared = self._statements.get(name) if target == "S" else None
        portal = self._portals.get(name) if target == "P" else None
        if prepared is None and portal is None:
            self.upstream.forward(message.raw, Expect.DESCRIBE)
            return
        if not await self._turn():
            return
        if prepared is not None:
            oids: list[int] = []
            if isinstance(prepared.statement, Insert) and prepared.stream is not None:
                oids = parameter_types(prepared.statement, raw_columns(prepared.stream))
            self.client_writer.write(m.parameter_description(oids))
        statement = (prepared or portal.prepared).statement  # type: ignore[union-attr]
        columns = result_columns(statement)
        self.client_writer.write(
            m.row_description(columns, self.encoding) if columns else m.NO_DATA
        )

    async def _execute(self, message: m.Message) -> None:
        name, limit = m.decode_execute(message.body, self.encoding)
        portal = self._portals.get(name)
        if portal is None:
            self.upstream.forward(message.raw, Expect.EXECUTE)
            return
        if not await self._turn():
            return
        prepared = portal.prepared
        try:
            if portal.rows is None:
                if portal.done:
                    raise InvalidSQL("this portal has run its statement already")
                statement = prepared.statement
                self._check(statement)
                if isinstance(statement, CopyFrom):
                    assert prepared.stream is not None
                    result = await self._copy(statement, prepared.stream)
                else:
                    result = await self._execute_statement(
                        statement, prepared.stream, portal.parameters
                    )
                for text in result.notices:
                    self.client_writer.write(m.notice_response(notice(text), self.encoding))
                portal.rows, portal.tag, portal.done = list(result.rows), result.tag, True
            rows = portal.rows
            if limit > 0 and len(rows) > limit:
                for row in rows[:limit]:
                    self.client_writer.write(m.data_row(row, self.encoding))
                portal.rows = rows[limit:]
                self.client_writer.write(m.PORTAL_SUSPENDED)
                return
            for row in rows:
                self.client_writer.write(m.data_row(row, self.encoding))
            portal.rows = None
            self.client_writer.write(m.command_complete(portal.tag))
        except Exception as error:
            await self._fail(error, prepared.query, prepared.statement, extended=True)

    async def _close_target(self, message: m.Message) -> None:
        target, name = m.decode_target(message.body, self.encoding)
        table: dict[str, Any] = self._statements if target == "S" else self._portals
        if name not in table:
            self.upstream.forward(message.raw, Expect.CLOSE)
            return
        if not await self._turn():
            return
        del table[name]
        self.client_writer.write(m.CLOSE_COMPLETE)

    # ---- Strata's statements ---------------------------------------------------------

    def _check(self, statement: Statement) -> None:
        """Refuse what this session may not run now: changes by a role other than the
        owner, and any Strata statement inside a transaction block."""
        if isinstance(statement, Insert | CopyFrom) and statement.problem is not None:
            raise statement.problem
        if changes_streams(statement) and self.user != self.port.owner:
            raise Forbidden(
                f"permission denied: role {self.user!r} may not run {title(statement)}; "
                "Strata's statements that change streams or load runs need the owner role "
                f"{self.port.owner!r}"
            )
        status = self.upstream.status
        if status == "E":
            raise TransactionAborted(
                "current transaction is aborted, commands ignored until end of transaction block"
            )
        if status == "T" and not isinstance(statement, Subscription):  # those change nothing
            raise InTransactionBlock(
                f"{title(statement)} cannot run inside a transaction block: Strata's "
                "statements commit on their own"
            )

    async def _execute_statement(
        self, statement: Statement, stream: StreamRecord | None, parameters: list[str | None]
    ) -> Result:
        commands = self.port.commands
        if isinstance(statement, CreateStream):
            return await self._call(commands.create_stream, statement)
        if isinstance(statement, DropStream):
            return await self._call(commands.drop_stream, statement)
        if isinstance(statement, AlterStream):
            return await self._call(commands.alter_stream, statement)
        if isinstance(statement, ShowStreams):
            return await self._call(commands.show_streams)
        if isinstance(statement, ExplainStream):
            return await self._call(commands.explain_stream, statement)
        if isinstance(statement, SinkStatement):
            return await self._call(commands.sink_statement, statement)
        if isinstance(statement, ShowSinks):
            return await self._call(commands.show_sinks)
        if isinstance(statement, DeclareSubscription):
            if statement.cursor in self._cursors:
                raise _DuplicateCursor(f"cursor {statement.cursor!r} already exists")
            opened = await self._call(subscribe.subscribe, self.port.service, statement.subscribe)
            self._cursors[statement.cursor] = opened
            return Result("DECLARE CURSOR")
        if isinstance(statement, FetchSubscription):
            return await self._fetch(statement)
        if isinstance(statement, CloseSubscription):
            self._cursors.pop(statement.cursor, None)
            return Result("CLOSE CURSOR")
        if isinstance(statement, Insert):
            assert stream is not None
            names, records = insert_records(statement, raw_columns(stream), parameters)
            try:
                return await self._call(commands.insert, stream.name, names, records)
            except InvalidValue as error:
                raise Refused(error, _value_at(statement, error, names)) from None
        raise AssertionError(f"not a statement the port runs here: {statement!r}")

    async def _copy(self, statement: CopyFrom, stream: StreamRecord) -> Result:
        """COPY stream FROM STDIN: the data, then one run; nothing happens to the run
        before CopyDone (a client that leaves or sends CopyFail leaves nothing)."""
        columns = raw_columns(stream)
        names, copy_format, run_id = copy_setup(statement, stream, columns)
        await admit(self.port.service, self.port.settings, run_id)
        self.client_writer.write(m.copy_in_response(len(names)))
        await self.client_writer.drain()
        # Read to the end whatever happens, so that no COPY data is left in flight.
        limit = self.port.settings.max_run_bytes
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await self.client.message()
            if message is None:
                raise ClientGone
            if message.kind == b"d":
                size += len(message.raw) - 5
                if size <= limit:
                    chunks.append(bytes(message.body))
            elif message.kind == b"c":
                break
            elif message.kind == b"f":
                reason = m.BodyReader(message.body).cstring(self.encoding)
                raise CopyFailed(f"COPY from stdin failed: {reason}")
            elif message.kind in (b"H", b"S"):
                continue  # PostgreSQL ignores Flush and Sync during COPY data
            else:
                raise m.ProtocolViolation(
                    f"unexpected message type {message.kind!r} during COPY from stdin"
                )
        if size > limit:
            raise PayloadTooLarge(
                f"COPY data of {size} bytes exceeds the run limit of {limit} bytes "
                "(STRATA_MAX_RUN_BYTES)"
            )
        data = b"".join(chunks)
        if self.encoding != "utf-8":
            data = data.decode(self.encoding, "replace").encode("utf-8")
        return await self._call(
            self.port.commands.copy, stream.name, data, copy_format, names, run_id
        )

    async def _fetch(self, statement: FetchSubscription) -> Result:
        """The changes there are (up to the count), once there is one or the timeout has
        passed (none given: until one comes)."""
        cursor = self._cursors[statement.cursor]
        loop = asyncio.get_running_loop()
        deadline = None if statement.timeout is None else loop.time() + statement.timeout
        while True:
            changes = await self._call(cursor.take, statement.count)
            left = None if deadline is None else deadline - loop.time()
            if changes or (left is not None and left <= 0):
                break
            await asyncio.sleep(
                subscribe.POLL_SECONDS if left is None else min(left, subscribe.POLL_SECONDS)
            )
        rows = [subscribe.row_of(c) for c in changes]
        return Result(f"FETCH {len(rows)}", subscribe.COLUMNS, rows)

    async def _copy_subscription(self, statement: CopySubscribe) -> Result:
        """COPY (SUBSCRIBE ...) TO STDOUT: every change as a line of COPY data as it comes,
        until the client cancels (then 57014, as PostgreSQL's own COPY) or leaves."""
        opened = await self._call(subscribe.subscribe, self.port.service, statement.subscribe)
        self.client_writer.write(m.copy_out_response(len(subscribe.COLUMNS)))
        canceled = asyncio.Event()
        key = self.upstream.backend_key
        if key is not None:
            self.port.subscriptions[key] = canceled
        try:
            while not canceled.is_set():
                changes = await self._call(opened.take, 1000)
                for change in changes:
                    self.client_writer.write(m.copy_data(subscribe.copy_line(change)))
                await self.client_writer.drain()
                if self.client_writer.is_closing():
                    raise ClientGone
                if not changes:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(canceled.wait(), subscribe.POLL_SECONDS)
        finally:
            if key is not None:
                self.port.subscriptions.pop(key, None)
        raise SubscriptionCanceled("canceling statement due to user request")

    def _write_result(self, result: Result, *, describe: bool) -> None:
        for text in result.notices:
            self.client_writer.write(m.notice_response(notice(text), self.encoding))
        if describe and result.columns is not None:
            self.client_writer.write(m.row_description(result.columns, self.encoding))
        for row in result.rows:
            self.client_writer.write(m.data_row(row, self.encoding))
        self.client_writer.write(m.command_complete(result.tag))

    async def _fail(
        self,
        error: BaseException,
        query: str,
        statement: Statement | Refused | None,
        *,
        extended: bool = False,
    ) -> None:
        """Send ``error`` as an ErrorResponse; in a transaction block, abort PostgreSQL's
        transaction too; in the extended protocol, skip messages until Sync."""
        if isinstance(error, ClientGone | m.ProtocolViolation | ConnectionError):
            raise error
        if isinstance(error, asyncio.CancelledError):
            raise error
        at = error.at if isinstance(error, Refused) else None
        cause = error.error if isinstance(error, Refused) else error
        fields = fields_of(
            cause,
            query=query,
            at=at,
            statement_at=statement.at if isinstance(statement, CreateStream) else None,
            sqlstate=(
                "42P05"
                if isinstance(cause, _Duplicate)
                else "42P03"
                if isinstance(cause, _DuplicateCursor)
                else None
            ),
        )
        self.client_writer.write(m.error_response(fields, self.encoding))
        if extended:
            self._discarding = True
        if self.upstream.status == "T":
            await self.upstream.abort_transaction(self.client)

    async def _call(self, function: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.port.executor, function, *args)


_NO = ("false", "off", "no", "0")
# Messages that name a prepared statement or portal, and what their answers are.
_NAMED = {
    b"B": Expect.BIND,
    b"D": Expect.DESCRIBE,
    b"E": Expect.EXECUTE,
    b"C": Expect.CLOSE,
}


class _Duplicate(StrataError):
    """A named prepared statement that exists already (SQLSTATE 42P05)."""


class _DuplicateCursor(StrataError):
    """A cursor name the session's subscriptions hold already (SQLSTATE 42P03)."""


def _value_at(statement: Insert, error: InvalidValue, names: list[str]) -> int:
    """Where in the query string the value an InvalidValue names is."""
    row = statement.rows[(error.row or 1) - 1]
    index = names.index(error.column) if error.column in names else 0
    return row[min(index, len(row) - 1)].at
