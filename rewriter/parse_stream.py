"""Pass 1: CREATE STREAM text -> a raw or derived stream statement (sqlglot AST, checked)."""

from __future__ import annotations

from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.dialects.postgres import Postgres
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import TokenType

from rewriter.errors import InvalidSQL, UnsupportedSQL
from rewriter.naming import check_column_name, check_stream_name
from rewriter.types import ColumnSpec, sql_type_from_sqlglot

RAW_OPTIONS = ("event_time",)
EXAMPLE = (
    "CREATE STREAM impsns (campaign text, price numeric(12,4), t timestamptz) "
    "WITH (event_time = 't')  or  CREATE STREAM impsn_count AS SELECT campaign, count(*) AS c, "
    "window_end AS t FROM TUMBLE(impsns, t, INTERVAL '1 minute') GROUP BY campaign, window_end"
)


@dataclass(frozen=True)
class RawStreamStatement:
    name: str
    columns: tuple[ColumnSpec, ...]
    event_time: str


@dataclass(frozen=True)
class DerivedStreamStatement:
    name: str
    select: exp.Select


StreamStatement = RawStreamStatement | DerivedStreamStatement


def parse_stream(sql: str) -> StreamStatement:
    """Parse one CREATE STREAM statement; anything else is refused with the expected form."""
    tokens = _tokenize(sql)
    body = [t for t in tokens if t.token_type != TokenType.SEMICOLON]
    semicolons = [t for t in tokens if t.token_type == TokenType.SEMICOLON]
    if not body:
        raise InvalidSQL(f"empty statement; expected CREATE STREAM, e.g. {EXAMPLE}")
    if semicolons and semicolons[0].start < body[-1].start:
        raise InvalidSQL(
            "only one statement per request is accepted; found a ';' at line "
            f"{semicolons[0].line}, column {semicolons[0].col}"
        )
    if len(body) < 3 or body[0].token_type != TokenType.CREATE or body[1].text.upper() != "STREAM":
        raise InvalidSQL(f"expected a CREATE STREAM statement, e.g. {EXAMPLE}")
    # sqlglot knows CREATE TABLE; swap the keyword in place (same width keeps error positions).
    keyword = body[1]
    text = sql[: keyword.start] + "TABLE " + sql[keyword.end + 1 :]
    try:
        statement = sqlglot.parse_one(text, read="postgres")
    except ParseError as err:
        first = err.errors[0] if err.errors else {}
        where = f" at line {first.get('line')}, column {first.get('col')}" if first else ""
        raise InvalidSQL(f"syntax error{where}: {first.get('description', err)}") from None
    if not isinstance(statement, exp.Create) or statement.kind != "TABLE":
        raise InvalidSQL(f"expected a CREATE STREAM statement, e.g. {EXAMPLE}")
    for flag in ("exists", "replace", "unique"):
        if statement.args.get(flag):
            raise UnsupportedSQL(
                f"CREATE STREAM does not support {flag.upper().replace('EXISTS', 'IF NOT EXISTS')}"
            )
    if statement.expression is not None:
        return _derived(statement)
    return _raw(statement)


def _tokenize(sql: str) -> list:
    try:
        return list(Postgres().tokenize(sql))
    except TokenError as err:
        raise InvalidSQL(f"syntax error: {err}") from None


def _options(statement: exp.Create) -> dict[str, str]:
    found: dict[str, str] = {}
    properties = statement.args.get("properties")
    for prop in properties.expressions if properties else []:
        if not isinstance(prop, exp.Property) or not isinstance(
            prop.args.get("value"), exp.Literal
        ):
            raise UnsupportedSQL(
                f"unsupported stream property {prop.sql('postgres')!r}; "
                f"supported: WITH ({', '.join(o + ' = ...' for o in RAW_OPTIONS)})"
            )
        key = prop.name.lower()
        if key not in RAW_OPTIONS:
            raise UnsupportedSQL(
                f"unknown stream option {key!r}; supported options: {', '.join(RAW_OPTIONS)}"
            )
        found[key] = prop.args["value"].name
    return found


def _raw(statement: exp.Create) -> RawStreamStatement:
    schema = statement.this
    if not isinstance(schema, exp.Schema) or not isinstance(schema.this, exp.Table):
        raise InvalidSQL(f"a raw stream declares its columns, e.g. {EXAMPLE}")
    name = check_stream_name(_table_name(schema.this))
    columns: list[ColumnSpec] = []
    for column_def in schema.expressions:
        if not isinstance(column_def, exp.ColumnDef):
            raise UnsupportedSQL(
                f"{column_def.sql('postgres')!r}: table constraints are not supported in a stream"
            )
        column = check_column_name(column_def.this.name)
        if column_def.args.get("constraints"):
            raise UnsupportedSQL(
                f"column {column!r}: constraints are not supported; a stream declares names "
                "and types only"
            )
        if any(c.name == column for c in columns):
            raise InvalidSQL(f"column {column!r} is declared twice")
        kind = column_def.args.get("kind")
        if kind is None:
            raise InvalidSQL(f"column {column!r} has no type")
        columns.append(ColumnSpec(column, sql_type_from_sqlglot(kind, column=column)))
    if not columns:
        raise InvalidSQL(f"a raw stream needs at least one column, e.g. {EXAMPLE}")
    options = _options(statement)
    event_time = options.get("event_time")
    if event_time is None:
        raise InvalidSQL(
            "a raw stream names its event-time column: add WITH (event_time = 'column')"
        )
    spec = next((c for c in columns if c.name == event_time), None)
    if spec is None:
        raise InvalidSQL(f"event_time names {event_time!r}, which is not a declared column")
    if spec.type.name != "timestamptz":
        raise UnsupportedSQL(
            f"the event-time column {event_time!r} must be timestamptz, not {spec.type.pg()}"
        )
    return RawStreamStatement(name, tuple(columns), event_time)


def _derived(statement: exp.Create) -> DerivedStreamStatement:
    target = statement.this
    if not isinstance(target, exp.Table):
        raise UnsupportedSQL("a derived stream takes its columns from its SELECT; drop the list")
    name = check_stream_name(_table_name(target))
    if statement.args.get("properties"):
        raise UnsupportedSQL("a derived stream takes no WITH options")
    query = statement.expression
    if not isinstance(query, exp.Select):
        raise UnsupportedSQL(
            f"a derived stream is defined by one SELECT (found {type(query).__name__.upper()}), "
            f"e.g. {EXAMPLE}"
        )
    return DerivedStreamStatement(name, query.copy())


def _table_name(table: exp.Table) -> str:
    if table.args.get("db") or table.args.get("catalog"):
        raise InvalidSQL(f"stream names are not schema-qualified: {table.sql('postgres')!r}")
    return table.name
