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
    # The watermark trails the latest event time by this much; rows behind it are "late"
    # (counted, never dropped).
    delay_us: int = 0
    # Raw rows older than this (by event time) are dropped from the raw archive by the
    # retention worker, with retention_statement (parameters cutoff, max_rows); 0 = kept.
    retention_us: int = 0
    retention_statement: str = ""
    kind: str = field(default="raw", init=False)

    def column(self, name: str) -> ColumnSpec | None:
        return next((c for c in self.columns if c.name == name), None)


@dataclass(frozen=True)
class OutputColumn:
    """A column of a derived stream's view, and what it is (streams built on it need to know).

    ``role`` is "window_start", "window_end", "key" (``ref`` = the key column of the partial
    archive), "aggregate" (``ref`` = the aggregate's index: the column is exactly its final
    form) or "expression" (anything else, computed from final values).
    """

    name: str
    pg_type: str | None  # None where the type is PostgreSQL's to infer on the view
    role: str = "expression"
    ref: str | None = None


@dataclass(frozen=True)
class AggregateState:
    name: str  # e.g. "count", "sum"
    column: str  # state column of the partial archive
    pg_type: str
    reduce: str  # aggregate merging states (same name in Spark and PostgreSQL)


@dataclass(frozen=True)
class PlannedAggregate:
    """An aggregate of a parallel stream, as streams rolled up on it see it."""

    rule: str  # registry name, e.g. "count(*)", "avg"
    states: tuple[AggregateState, ...]
    result_type: str
    arg_type: str | None  # PostgreSQL type of the argument as written (None for count(*))


@dataclass(frozen=True)
class SerialStatements:
    """How the workers keep a serial stream's archive: list the windows with source data
    in a range, delete a set of windows' rows, and compute them from the consolidated source
    (the view reads the archive for materialized windows not awaiting repair)."""

    windows_query: str  # window starts in [SERIAL_FROM, SERIAL_TO), at most SERIAL_LIMIT
    # Both act on the windows listed in SERIAL_WINDOWS and those starting in
    # [SERIAL_FROM, SERIAL_TO): a list for repair, a range for materialization.
    delete_statement: str  # the archived rows of those windows
    insert_statement: str  # those windows, computed from the source


@dataclass(frozen=True)
class DerivedStreamPlan:
    """A continuous aggregate split into partial (Spark), reduce and final (PostgreSQL) parts,
    or, for a serial (SP) stream, a view over the consolidated source."""

    name: str
    source: str
    window: str  # e.g. "TUMBLE(impsns, t, INTERVAL '1 minute')"
    window_size_us: int
    window_slide_us: int  # == window_size_us for TUMBLE
    pane_us: int  # partials are kept per pane: gcd(slide, size)
    parallelism: str  # "PP" (parallel, partial/reduce/final) or "SP" (serial)
    parallelism_reason: str
    # Spark SQL over partial_input (a batch of runs' rows, or the partial rows of the source
    # stream for a roll-up), one row per run, pane and group. Empty for SP streams.
    partial_query: str
    partial_input: str
    partial_columns: tuple[tuple[str, str], ...]  # (column, PostgreSQL type) of the archive
    create_statements: tuple[str, ...]  # PostgreSQL: partial archive table, view
    drop_statements: tuple[str, ...]
    reduce_query: str  # PostgreSQL: partial rows -> one partial row per pane and group
    # PostgreSQL DML of the reducer (parameters min_rows, max_groups); empty for SP streams.
    reduce_statement: str
    view_query: str  # PostgreSQL: the view's SELECT (final aggregates on read)
    outputs: tuple[OutputColumn, ...]
    aggregates: tuple[PlannedAggregate, ...]
    raw_sources: tuple[str, ...]  # the raw streams whose runs feed this stream
    # Serial streams only (empty for PP): PostgreSQL statements of the workers that
    # materialize closed windows into the stream's archive and repair them after late data.
    # They read their parameters from transaction-local settings (naming.SERIAL_*_SETTING).
    serial: SerialStatements | None = None
    kind: str = field(default="derived", init=False)

    @property
    def dependencies(self) -> tuple[str, ...]:
        return (self.source,)

    @property
    def is_parallel(self) -> bool:
        return self.parallelism == "PP"

    def output(self, name: str) -> OutputColumn | None:
        return next((o for o in self.outputs if o.name == name), None)


@dataclass(frozen=True)
class ProjectionBranch:
    """One SELECT of a projection stream: its raw source and the Spark SQL that maps a batch
    of that source's rows (RUN_ROWS_VIEW) onto the projection's columns."""

    source: str
    spark_query: str


@dataclass(frozen=True)
class ProjectionStreamPlan:
    """A stream without aggregates (seeds/004): selection, computed columns, UNION ALL of
    raw streams. In PostgreSQL it is a view over the raw views; aggregates over it are
    computed per run of each source through its branch."""

    name: str
    columns: tuple[ColumnSpec, ...]
    event_time: str
    branches: tuple[ProjectionBranch, ...]
    create_statements: tuple[str, ...]
    drop_statements: tuple[str, ...]
    view_query: str
    kind: str = field(default="derived", init=False)

    @property
    def dependencies(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(b.source for b in self.branches))

    @property
    def raw_sources(self) -> tuple[str, ...]:
        return self.dependencies

    def branch(self, source: str) -> ProjectionBranch | None:
        return next((b for b in self.branches if b.source == source), None)


# A stream a window can read rows from: declared columns and an event-time column.
RowStreamPlan = RawStreamPlan | ProjectionStreamPlan
StreamPlan = RawStreamPlan | DerivedStreamPlan | ProjectionStreamPlan
