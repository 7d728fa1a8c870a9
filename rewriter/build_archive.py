"""Pass 4a: PostgreSQL objects of a raw stream: the raw archive table and the view over it."""

from __future__ import annotations

from sqlglot import exp

from rewriter import naming
from rewriter.parse_stream import RawStreamStatement
from rewriter.plan import RawStreamPlan
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


def create_table(target: exp.Table, columns: list[exp.ColumnDef]) -> str:
    return exp.Create(this=exp.Schema(this=target, expressions=columns), kind="TABLE").sql(
        "postgres"
    )


def create_view(name: str, query: exp.Query) -> str:
    return exp.Create(this=table(name, naming.PUBLIC_SCHEMA), kind="VIEW", expression=query).sql(
        "postgres"
    )


def create_index(
    name: str, target: exp.Table, columns: list[exp.Expr], *, using: str | None = None
) -> str:
    params = exp.IndexParameters(columns=[exp.Ordered(this=c) for c in columns])
    if using is not None:
        params.set("using", exp.Var(this=using))
    return exp.Create(
        this=exp.Index(this=exp.to_identifier(name), table=target.copy(), params=params),
        kind="INDEX",
    ).sql("postgres")


def drop(kind: str, target: exp.Table) -> str:
    return exp.Drop(tables=[target], kind=kind, exists=True).sql("postgres")


def build_archive(statement: RawStreamStatement) -> RawStreamPlan:
    archive = table(naming.raw_archive_table(statement.name))
    columns = [
        column_def(c.name, c.type, not_null=c.name == statement.event_time)
        for c in statement.columns
    ]
    columns.append(column_def(naming.RUN_COLUMN, "bigint", not_null=True))
    view = exp.select(*(exp.column(c.name, quoted=True) for c in statement.columns)).from_(
        table(naming.raw_archive_table(statement.name))
    )
    # Back-fill reads history run by run; runs arrive in roughly increasing order, so a
    # BRIN index finds them for next to nothing on ingest.
    runs_index = create_index(
        f"{naming.raw_archive_table(statement.name)}_runs",
        archive,
        [exp.column(naming.RUN_COLUMN)],
        using="brin",
    )
    return RawStreamPlan(
        name=statement.name,
        columns=statement.columns,
        event_time=statement.event_time,
        create_statements=(
            create_table(archive, columns),
            runs_index,
            create_view(statement.name, view),
        ),
        drop_statements=(
            drop("VIEW", table(statement.name, naming.PUBLIC_SCHEMA)),
            drop("TABLE", archive),
        ),
        delay_us=statement.delay_us,
        retention_us=statement.retention_us,
        retention_statement=_retention_statement(statement) if statement.retention_us else "",
    )


def _retention_statement(statement: RawStreamStatement) -> str:
    """Drop at most %(max_rows)s raw rows with event time before %(cutoff)s (one batch)."""
    archive = table(naming.raw_archive_table(statement.name))
    oldest = (
        exp.select(exp.column("ctid"))
        .from_(archive.copy())
        .where(
            exp.LT(
                this=exp.column(statement.event_time, quoted=True),
                expression=exp.Placeholder(this="cutoff"),
            )
        )
        .limit(exp.Placeholder(this="max_rows"))
    )
    condition = exp.In(this=exp.column("ctid"), query=oldest.subquery())
    return exp.Delete(this=archive, where=exp.Where(this=condition)).sql("postgres")
