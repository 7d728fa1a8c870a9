"""Strata's statements over the SQL port, run against the in-process service.

Every method blocks (the service talks to PostgreSQL and waits for runs to commit): the
session calls them in a worker thread. A COPY or INSERT is one run through the same
``StrataService.submit_rows`` as an HTTP body, and its command tag (``COPY n``,
``INSERT 0 n``) is only answered once the run is committed, so the answer means what a
``?wait=true`` 200 means over HTTP. A run that is refused raises the error the session
turns into an ErrorResponse; nothing of it was archived.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from rewriter.errors import InvalidSQL, StrataError, UnsupportedSQL
from rewriter.naming import PUBLIC_SCHEMA
from rewriter.plan import RawStreamPlan
from rewriter.types import ColumnSpec
from server.api.describe import describe
from server.catalog import RunRecord, StreamRecord
from server.errors import (
    InvalidValue,
    NotARawStream,
    RunFormatError,
    RunNotCommitted,
    RunRejected,
    UnknownStream,
)
from server.ingest.admission import check_run_id
from server.ingest.copy_format import CopyFormat, parse_copy
from server.ingest.parse import rows_from_fields
from server.pgwire.statements import (
    AlterStream,
    CopyFrom,
    CreateStream,
    DropStream,
    ExplainStream,
    FetchSubscription,
    Name,
    Refused,
    ShowSinks,
    ShowStreams,
    SinkStatement,
    Statement,
)
from server.pgwire.subscribe import COLUMNS as SUBSCRIPTION_COLUMNS
from server.service import StrataService
from server.settings import Settings
from server.sinks.ddl import run_sink_statement, sinks

TEXT_OID = 25


@dataclass
class Result:
    """What a statement answers: optional rows (``columns`` as (name, type oid)), the
    command tag, and notices sent before it."""

    tag: str
    columns: list[tuple[str, int]] | None = None
    rows: list[list[str | None]] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)


class Commands:
    def __init__(self, service: StrataService, settings: Settings) -> None:
        self.service = service
        self.settings = settings

    # ---- streams ---------------------------------------------------------------------

    def stream_of(self, name: Name) -> StreamRecord | None:
        """The stream ``name`` names (as PostgreSQL would resolve it to a view in public),
        or None if it names no stream."""
        if name.schema is not None and name.schema != PUBLIC_SCHEMA:
            return None
        return self.service.streams().get(name.name)

    def create_stream(self, statement: CreateStream) -> Result:
        self.service.create_stream(statement.text)
        return Result("CREATE STREAM")

    def alter_stream(self, statement: AlterStream) -> Result:
        altered = self.service.alter_stream(statement.text)
        if altered["state"] == "done":
            said = f"the new definition of {altered['stream']} is in place (no back-fill needed)"
        else:
            said = (
                f"the new definition of {altered['stream']} back-fills from the archived rows; "
                "the view serves the old one until it is swapped in (see EXPLAIN STREAM, or "
                "progress.alter of GET /streams/{name})"
            )
        return Result("ALTER STREAM", notices=[said])

    def drop_stream(self, statement: DropStream) -> Result:
        if self.stream_of(statement.name) is None:
            message = f"stream {statement.name.name!r} does not exist"
            if not statement.if_exists:
                raise UnknownStream(message)
            return Result("DROP STREAM", notices=[f"{message}, skipping"])
        self.service.drop_stream(statement.name.name)
        return Result("DROP STREAM")

    def show_streams(self) -> Result:
        records = self.service.streams()
        rows = []
        for record in records.values():
            shown = describe(record, records)
            sources = shown.get("raw_sources") or shown.get("sources")
            rows.append(
                [
                    record.name,
                    record.kind,
                    _text(shown.get("parallelism")),
                    ", ".join(sources) if isinstance(sources, list) else None,
                    record.sql,
                ]
            )
        return Result(f"SELECT {len(rows)}", result_columns(ShowStreams(0)), rows)

    def explain_stream(self, statement: ExplainStream) -> Result:
        record = self.stream_of(statement.name)
        if record is None:
            raise UnknownStream(f"stream {statement.name.name!r} does not exist")
        lines = explain(describe(record, self.service.streams()))
        return Result("EXPLAIN", result_columns(statement), [[line] for line in lines])

    # ---- sinks -----------------------------------------------------------------------

    def sink_statement(self, statement: SinkStatement) -> Result:
        done = run_sink_statement(self.service, statement.text)
        if done.changed:
            return Result(done.tag)
        why = "does not exist" if done.sink is None else "already exists"
        return Result(done.tag, notices=[f"sink {done.name!r} {why}, skipping"])

    def show_sinks(self) -> Result:
        rows = [
            [
                s.name,
                s.stream,
                s.connector,
                s.target,
                _text(s.position),
                _text(s.lag),
                s.state,
                s.error,
            ]
            for s in sinks(self.service.engine)
        ]
        return Result(f"SELECT {len(rows)}", result_columns(ShowSinks(0)), rows)

    # ---- runs ------------------------------------------------------------------------

    def copy(
        self,
        stream: str,
        data: bytes,
        copy_format: CopyFormat,
        names: Sequence[str],
        run_id: str | None,
    ) -> Result:
        """One run of the COPY data; ``COPY n`` once it is committed."""

        def read_rows(plan: RawStreamPlan) -> pa.Table:
            return parse_copy(data, copy_format, names, plan.columns, plan.event_time)

        record = self.service.submit_rows(stream, read_rows, run_id)
        return Result(f"COPY {self._committed(record).rows}")

    def insert(
        self,
        stream: str,
        names: Sequence[str],
        records: list[tuple[int, list[str | None]]],
        run_id: str | None = None,
    ) -> Result:
        """One run of the VALUES rows; ``INSERT 0 n`` once it is committed."""

        def read_rows(plan: RawStreamPlan) -> pa.Table:
            try:
                return rows_from_fields(records, names, plan.columns, plan.event_time)
            except RunFormatError as error:
                # Rows of VALUES, not lines: "row 2, column 'price': not a number ..."
                text = str(error)
                if error.line is not None:
                    text = f"row {error.line}" + text[len(f"line {error.line}") :]
                raise InvalidValue(text, row=error.line, column=error.column) from None

        record = self.service.submit_rows(stream, read_rows, run_id)
        return Result(f"INSERT 0 {self._committed(record).rows}")

    def _committed(self, record: RunRecord) -> RunRecord:
        record = self.service.wait(record, self.settings.run_wait_timeout)
        if record.status == "rejected":
            raise RunRejected(f"run {record.run_id!r} was rejected: {record.error}")
        if record.status != "committed":
            raise RunNotCommitted(
                f"run {record.run_id!r} was accepted but is not committed after "
                f"{self.settings.run_wait_timeout:g} s; it still may be: send it again with "
                "the same RUN_ID to wait for it"
            )
        return record


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def explain(described: dict[str, object]) -> list[str]:
    """A stream's description (GET /streams/{name}) as the lines EXPLAIN STREAM shows."""
    name, kind = described["name"], described["kind"]
    columns = described.get("columns")
    shown = (
        ", ".join(f"{c['name']} {c['type']}" for c in columns) if isinstance(columns, list) else ""
    )
    if kind == "raw":
        lines = [
            f"Raw stream {name}",
            f"  Columns: {shown}",
            f"  Event time: {described['event_time']}, delay {described['delay_seconds']:g} s"
            + (
                f", retention {described['retention_seconds']:g} s"
                if described.get("retention_seconds")
                else ""
            ),
            f"  Archive: {described['archive_table']}",
        ]
    else:
        lines = [
            f"Derived stream {name} ({described.get('parallelism')}): "
            f"{described.get('parallelism_reason')}",
            f"  Raw sources: {', '.join(described.get('raw_sources') or [])}",  # type: ignore[arg-type]
        ]
        sources = described.get("sources")
        if isinstance(sources, list) and sources:
            # The streams read on read: a union's branches, a join's inputs.
            lines.append(f"  Streams read: {', '.join(sources)}")
        if described.get("window") is not None:
            lines.append(f"  Window: {described['window']}")
        lines.append(f"  Columns: {shown}")
        rewrite = described.get("rewrite")
        assert isinstance(rewrite, dict)
        for key, title in (
            ("partial_query", "Partial query (Spark, per run)"),
            ("partial_archive_table", "Partial archive"),
            ("reduce_query", "Reduce (PostgreSQL)"),
            ("view_sql", "View"),
        ):
            if rewrite.get(key):
                lines += _block(title, str(rewrite[key]))
        for branch in rewrite.get("branches") or []:
            lines += _block(f"Branch over {branch['source']} (Spark)", branch["spark_query"])
        join = described.get("join")
        tables = rewrite.get("tables") or (join.get("tables") if isinstance(join, dict) else None)
        if isinstance(tables, list) and tables:
            lines.append(f"  Tables joined on read: {', '.join(tables)}")
        if isinstance(join, dict) and "inputs" in join:
            for given in join["inputs"]:
                lines.append(
                    f"  Join input {given['alias']}: {given['source']}"
                    + (f", {given['window']}" if given.get("window") else "")
                    + (f", where {given['filter']}" if given.get("filter") else "")
                )
            lines.append(f"  Join archive: {join['archive_table']}")
            lines += _block("Join strategy", str(join["strategy"]))
            for index, term in enumerate(rewrite.get("term_queries") or [], start=1):
                lines += _block(f"Join term {index} (Spark, per batch)", str(term))
    dependents = described.get("dependents")
    if dependents:
        lines.append(f"  Streams derived from it: {', '.join(dependents)}")  # type: ignore[arg-type]
    return lines


def _block(title: str, text: str) -> list[str]:
    body = text.strip().splitlines()
    if len(body) == 1:
        return [f"  {title}: {body[0]}"]
    return [f"  {title}:"] + [f"    {line}" for line in body]


# ---- statement details ------------------------------------------------------------------


def raw_plan(stream: StreamRecord) -> RawStreamPlan:
    """The plan of the raw stream runs are loaded into; NotARawStream for a derived one."""
    plan = stream.plan
    if not isinstance(plan, RawStreamPlan):
        raise NotARawStream(
            f"stream {stream.name!r} is derived; load runs into its raw source "
            f"{' or '.join(repr(s) for s in plan.raw_sources)}"
        )
    return plan


def raw_columns(stream: StreamRecord) -> list[ColumnSpec]:
    return list(raw_plan(stream).columns)


SHOW_STREAMS_COLUMNS = ("name", "kind", "parallelism", "raw_sources", "definition")
EXPLAIN_STREAM_COLUMN = "STREAM PLAN"
SHOW_SINKS_COLUMNS = ("name", "stream", "connector", "target", "position", "lag", "state", "error")


def result_columns(statement: Statement) -> list[tuple[str, int]] | None:
    """The columns of a statement's rows (Describe), None if it returns none."""
    if isinstance(statement, ShowStreams):
        return [(c, TEXT_OID) for c in SHOW_STREAMS_COLUMNS]
    if isinstance(statement, ExplainStream):
        return [(EXPLAIN_STREAM_COLUMN, TEXT_OID)]
    if isinstance(statement, ShowSinks):
        return [(c, TEXT_OID) for c in SHOW_SINKS_COLUMNS]
    if isinstance(statement, FetchSubscription):
        return list(SUBSCRIPTION_COLUMNS)
    return None


def copy_setup(
    statement: CopyFrom, stream: StreamRecord, columns: list[ColumnSpec]
) -> tuple[list[str], CopyFormat, str | None]:
    """The COPY's columns, format and run id, checked as PostgreSQL checks them."""
    declared = [c.name for c in columns]
    names = list(statement.columns) if statement.columns is not None else declared
    for name in names:
        if name not in declared:
            raise Refused(
                InvalidSQL(f"column {name!r} of stream {stream.name!r} does not exist"),
                statement.target.at,
            )
    if len(set(names)) != len(names):
        raise Refused(InvalidSQL("a column is named more than once"), statement.target.at)
    event_time = raw_plan(stream).event_time
    if event_time not in names:
        raise Refused(
            InvalidSQL(
                f"COPY into stream {stream.name!r} needs its event-time column "
                f"{event_time!r} among the columns"
            ),
            statement.target.at,
        )
    given: dict[str, str | None] = {}
    run_id: str | None = None
    for option in statement.options:
        try:
            if option.name in given or (option.name == "run_id" and run_id is not None):
                raise InvalidSQL(f"conflicting or redundant option {option.name!r}")
            if option.name == "run_id":
                if not option.value:
                    raise InvalidSQL("RUN_ID needs a value: RUN_ID 'id'")
                run_id = check_run_id(option.value)
            elif option.name == "encoding":
                if (option.value or "").upper().replace("-", "") not in ("UTF8", "SQL_ASCII"):
                    raise UnsupportedSQL("COPY into a stream takes UTF8 data only")
            elif option.name == "header":
                given["header"] = "true" if option.value is None else option.value  # HEADER alone
            elif option.name in ("format", "delimiter", "null", "quote", "escape"):
                if option.value is None:
                    raise InvalidSQL(f"COPY option {option.name!r} needs a value")
                given[option.name] = option.value
            else:
                raise UnsupportedSQL(
                    f"COPY option {option.name!r} is not supported for streams; supported: "
                    "FORMAT (text or csv), HEADER, DELIMITER, NULL, QUOTE, ESCAPE, ENCODING, "
                    "RUN_ID"
                )
        except StrataError as error:
            raise Refused(error, option.at) from None
    try:
        copy_format = CopyFormat.of(**given)  # type: ignore[arg-type]
    except StrataError as error:
        raise Refused(error, statement.at) from None
    return names, copy_format, run_id
