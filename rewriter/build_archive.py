"""Pass 4a: PostgreSQL objects of a raw stream: the raw archive table and the view over it."""

from __future__ import annotations

from sqlglot import exp

from rewriter import naming
from rewriter.ddl import column_def, create_index, create_table, create_view, drop, table
from rewriter.parse_stream import RawStreamStatement
from rewriter.plan import RawStreamPlan


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
        naming.raw_runs_index(statement.name),
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
        retention_statement=_retention_statement(statement) if statement.retention_us else None,
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
