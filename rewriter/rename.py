"""Renaming streams for ALTER STREAM: the CREATE STREAM an ALTER stands for, a statement
with the streams it creates and reads renamed, and the relations a plan creates.

A changed query is built beside its stream under another name (naming.altering_stream),
with every stream built on it, and swapped in once it has caught up: the streams are
renamed in the statements (by the positions parse_stream records, so nothing else in the
text moves) and their relations in PostgreSQL (pairing the relations two plans of one
statement create, in the order they create them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.tokens import TokenType

from rewriter.ddl import CREATE_FUNCTION
from rewriter.errors import InvalidSQL
from rewriter.parse_stream import DerivedStreamStatement, _tokenize, parse_stream
from rewriter.plan import StreamPlan

ALTER_FORM = "ALTER STREAM name AS SELECT ..."


def alter_as_create(sql: str) -> str:
    """The CREATE STREAM statement that ``ALTER STREAM name AS SELECT ...`` stands for."""
    body = [t for t in _tokenize(sql) if t.token_type != TokenType.SEMICOLON]
    if len(body) < 2 or body[0].text.upper() != "ALTER" or body[1].text.upper() != "STREAM":
        raise InvalidSQL(f"expected an ALTER STREAM statement: {ALTER_FORM}")
    if len(body) < 4 or body[3].token_type != TokenType.ALIAS:
        raise InvalidSQL(
            f"ALTER STREAM gives the stream's new query: {ALTER_FORM} (a raw stream's "
            "columns cannot be changed)"
        )
    return sql[: body[0].start] + "CREATE" + sql[body[0].end + 1 :]


def stream_name(sql: str) -> str:
    """The name a CREATE STREAM statement creates."""
    return parse_stream(sql).name


@dataclass(frozen=True)
class _Span:
    start: int
    end: int  # inclusive


def rename_streams(sql: str, names: Mapping[str, str]) -> str:
    """``sql`` (a CREATE STREAM statement) with the stream it creates and the streams it
    reads renamed by ``names`` (old -> new); qualified columns follow their stream."""
    statement = parse_stream(sql)
    spans: dict[_Span, str] = {}
    body = [t for t in _tokenize(sql) if t.token_type != TokenType.SEMICOLON]
    if statement.name in names:
        spans[_Span(body[2].start, body[2].end)] = names[statement.name]
    if isinstance(statement, DerivedStreamStatement):
        read = [statement.select, *statement.with_bodies]
        for identifier in (i for query in read for i in _stream_identifiers(query)):
            name = identifier.this if identifier.quoted else identifier.this.lower()
            meta = identifier.meta
            if name in names and "start" in meta and "end" in meta:
                spans[_Span(meta["start"], meta["end"])] = names[name]
    for span in sorted(spans, key=lambda s: s.start, reverse=True):
        sql = sql[: span.start] + spans[span] + sql[span.end + 1 :]
    return sql


def _stream_identifiers(select: exp.Expr) -> list[exp.Identifier]:
    """Where ``select`` names a stream: its tables, the source of a window (TUMBLE(s, ...)),
    and the qualifier of a column."""
    found: list[exp.Identifier] = []
    for table in select.find_all(exp.Table):
        if table.args.get("db") is not None:
            continue  # schema-qualified: a PostgreSQL table, never a stream
        if isinstance(table.this, exp.Identifier):
            found.append(table.this)
        elif isinstance(table.this, exp.Anonymous) and table.this.expressions:
            source = table.this.expressions[0]
            if isinstance(source, exp.Column) and isinstance(source.this, exp.Identifier):
                found.append(source.this)
    for column in select.find_all(exp.Column):
        qualifier = column.args.get("table")
        if isinstance(qualifier, exp.Identifier) and not column.args.get("db"):
            found.append(qualifier)
    return found


@dataclass(frozen=True)
class Relation:
    """A relation a plan creates: kind (TABLE, INDEX, VIEW), schema and name."""

    kind: str
    schema: str
    name: str


def replaced_views(plan: StreamPlan) -> list[str]:
    """``plan``'s CREATE VIEW statements as CREATE OR REPLACE VIEW, each after the CREATE OR
    REPLACE FUNCTION statements before it (the functions a view calls: a serial stream's
    windows computed on read, an aggregate stream's windows waiting for the reducer), in
    the plan's order."""
    statements = []
    for statement in plan.create_statements:
        if statement.startswith(CREATE_FUNCTION):
            statements.append(statement)
            continue
        create = sqlglot.parse_one(statement, read="postgres")
        if isinstance(create, exp.Create) and create.kind == "VIEW":
            create.set("replace", True)
            statements.append(create.sql("postgres"))
    return statements


def dropped_functions(plan: StreamPlan) -> list[str]:
    """``plan``'s DROP FUNCTION statements: what the swap of an ALTER drops of the plan it
    built, whose relations it renames but whose functions (named after the stream as it
    was built) it makes anew under the final name."""
    statements = []
    for statement in plan.drop_statements:
        dropped = sqlglot.parse_one(statement, read="postgres")
        if isinstance(dropped, exp.Drop) and str(dropped.args.get("kind")).upper() == "FUNCTION":
            statements.append(statement)
    return statements


def created_relations(plan: StreamPlan) -> list[Relation]:
    """The relations ``plan``'s create statements make, in order (an index in its table's
    schema); not its functions."""
    made: list[Relation] = []
    for statement in plan.create_statements:
        if statement.startswith(CREATE_FUNCTION):
            continue
        create = sqlglot.parse_one(statement, read="postgres")
        if not isinstance(create, exp.Create):
            continue
        target = create.this
        if isinstance(target, exp.Schema):
            target = target.this
        if isinstance(target, exp.Index):
            table = target.args["table"]
            made.append(Relation("INDEX", table.db, target.name))
        elif isinstance(target, exp.Table):
            made.append(Relation(str(create.kind), target.db, target.name))
    return made
