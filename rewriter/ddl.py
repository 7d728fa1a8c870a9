"""Builders of the PostgreSQL DDL the build passes emit: tables, columns, views, indexes.

Every statement is built as a sqlglot expression and rendered for PostgreSQL, so quoting
stays right; the names come from rewriter.naming.
"""

from __future__ import annotations

from sqlglot import exp

from rewriter import naming
from rewriter.types import SqlType


def table(name: str, schema: str = naming.INTERNAL_SCHEMA) -> exp.Table:
    return exp.table_(name, db=schema, quoted=True)


def column_def(name: str, pg_type: SqlType | str, *, not_null: bool = False) -> exp.ColumnDef:
    type_name = pg_type.pg() if isinstance(pg_type, SqlType) else pg_type
    constraints = []
    if type_name == "text":
        # Text compares by code point in Spark; the archives and the views compare the same
        # way, so min/max and grouping agree between the engines on any server collation.
        constraints.append(
            exp.ColumnConstraint(kind=exp.CollateColumnConstraint(this=exp.Var(this='"C"')))
        )
    if not_null:
        constraints.append(exp.ColumnConstraint(kind=exp.NotNullColumnConstraint()))
    return exp.ColumnDef(
        this=exp.to_identifier(name, quoted=True),
        kind=exp.DataType.build(type_name, dialect="postgres"),
        constraints=constraints or None,
    )


def create_table(
    target: exp.Table, columns: list[exp.ColumnDef], *, if_not_exists: bool = False
) -> str:
    return exp.Create(
        this=exp.Schema(this=target, expressions=columns), kind="TABLE", exists=if_not_exists
    ).sql("postgres")


def create_view(name: str, query: exp.Query) -> str:
    return exp.Create(this=table(name, naming.PUBLIC_SCHEMA), kind="VIEW", expression=query).sql(
        "postgres"
    )


def create_index(
    name: str,
    target: exp.Table,
    columns: list[exp.Expr],
    *,
    using: str | None = None,
    if_not_exists: bool = False,
) -> str:
    params = exp.IndexParameters(columns=[exp.Ordered(this=c) for c in columns])
    if using is not None:
        params.set("using", exp.Var(this=using))
    return exp.Create(
        this=exp.Index(this=exp.to_identifier(name), table=target.copy(), params=params),
        kind="INDEX",
        exists=if_not_exists,
    ).sql("postgres")


def drop(kind: str, target: exp.Table) -> str:
    return exp.Drop(tables=[target], kind=kind, exists=True).sql("postgres")
