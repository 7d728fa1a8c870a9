"""The immutable plans the rewriter returns; the server only executes them."""

from __future__ import annotations

from dataclasses import dataclass, field

from rewriter.types import ColumnSpec


@dataclass(frozen=True)
class RawStreamPlan:
    """A raw stream: its schema and the PostgreSQL objects that archive it."""

    name: str
    columns: tuple[ColumnSpec, ...]
    event_time: str
    create_statements: tuple[str, ...]  # PostgreSQL: raw archive table, then the view
    drop_statements: tuple[str, ...]
    kind: str = field(default="raw", init=False)

    def column(self, name: str) -> ColumnSpec | None:
        return next((c for c in self.columns if c.name == name), None)


@dataclass(frozen=True)
class OutputColumn:
    name: str
    pg_type: str | None  # None where the type is PostgreSQL's to infer on the view


@dataclass(frozen=True)
class DerivedStreamPlan:
    """A continuous aggregate split into partial (Spark), reduce and final (PostgreSQL) parts."""

    name: str
    source: str
    window: str  # e.g. "TUMBLE(impsns, t, INTERVAL '1 minute')"
    window_size_us: int
    parallelism: str  # "PP" (parallel, partial/reduce/final) or "SP" (serial)
    parallelism_reason: str
    partial_query: (
        str  # Spark SQL over the run's rows (RUN_ROWS_VIEW), one row per run/window/group
    )
    partial_columns: tuple[tuple[str, str], ...]  # (column, PostgreSQL type) of the partial archive
    create_statements: tuple[str, ...]  # PostgreSQL: partial archive table, consolidating view
    drop_statements: tuple[str, ...]
    reduce_query: str  # PostgreSQL: partial rows -> one partial row per window and group
    view_query: str  # PostgreSQL: the consolidating view's SELECT (final aggregates)
    outputs: tuple[OutputColumn, ...]
    kind: str = field(default="derived", init=False)

    @property
    def dependencies(self) -> tuple[str, ...]:
        return (self.source,)


StreamPlan = RawStreamPlan | DerivedStreamPlan
