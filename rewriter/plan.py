"""The immutable plans the rewriter returns; the server only executes them.

A StreamPlan is one of five kinds, each its own type: a raw stream, a projection, a join,
and a windowed aggregate that is either parallel (PP) or serial (SP). Ask which with isinstance;
a kind has only the fields it uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar

from rewriter import naming
from rewriter.types import ColumnSpec


class Parallelism(StrEnum):
    """How a derived stream is computed (DESIGN.md): per run and merged (PP), or from final
    values at a gather point (SP)."""

    PARALLEL = "PP"
    SERIAL = "SP"
    ON_READ = "on read"  # nothing computed per run: the view joins PostgreSQL tables on read


@dataclass(frozen=True)
class RawStreamPlan:
    """A raw stream: its schema and the PostgreSQL objects that archive it."""

    kind: ClassVar[str] = "raw"

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
    retention_statement: str | None = None

    def column(self, name: str) -> ColumnSpec | None:
        return next((c for c in self.columns if c.name == name), None)


@dataclass(frozen=True)
class OutputColumn:
    """A column of a derived stream's view, and what it is (streams built on it need to know).

    ``role`` is "window_start", "window_end", "key" (``ref`` = the key column of the partial
    archive), "group" (a GROUP BY item computed on read, from a table joined there; ``ref`` =
    the item as PostgreSQL SQL), "aggregate" (``ref`` = the aggregate's index: the column is
    exactly its final form) or "expression" (anything else, computed from final values).
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
class WindowedAggregatePlan:
    """What every windowed aggregate stream has, parallel or serial: its source and window,
    its view and the columns the view shows. The plans are its two kinds below."""

    kind: ClassVar[str] = "derived"
    parallelism: ClassVar[Parallelism]

    name: str
    source: str
    window: str  # e.g. "TUMBLE(impsns, t, INTERVAL '1 minute')"
    window_size_us: int
    window_slide_us: int  # == window_size_us for TUMBLE
    pane_us: int  # partials are kept per pane: gcd(slide, size)
    parallelism_reason: str
    create_statements: tuple[str, ...]  # PostgreSQL: the archive table, its index, the view
    drop_statements: tuple[str, ...]
    view_query: str  # PostgreSQL: the view's SELECT
    outputs: tuple[OutputColumn, ...]
    raw_sources: tuple[str, ...]  # the raw streams whose runs feed this stream

    @property
    def dependencies(self) -> tuple[str, ...]:
        return (self.source,)

    def output(self, name: str) -> OutputColumn | None:
        return next((o for o in self.outputs if o.name == name), None)


@dataclass(frozen=True)
class JoinedRows:
    """How an aggregate stream joined with tables on read keeps its view's rows of reduced
    windows (naming.joined_table) while the tables do not change: the reducer writes the
    rows of the windows it folds in its statement, and all of them again (the refresh)
    once a table has changed; the view reads them while the tables' versions are the ones
    they were written at, and joins on read otherwise and for windows late data waits in."""

    current_query: str  # PostgreSQL: whether the rows follow the tables' current versions
    refresh_statement: str  # PostgreSQL: every reduced window's rows written anew


@dataclass(frozen=True)
class ParallelAggregatePlan(WindowedAggregatePlan):
    """A continuous aggregate split into partial (Spark), reduce and final (PostgreSQL)
    parts: partial rows per run in the partial archive, final aggregates on read."""

    parallelism: ClassVar[Parallelism] = Parallelism.PARALLEL

    # Spark SQL over partial_input (a batch of runs' rows, or the partial rows of the source
    # stream for a roll-up), one row per run, pane and group.
    partial_query: str
    partial_input: str
    partial_columns: tuple[tuple[str, str], ...]  # (column, PostgreSQL type) of the archive
    reduce_query: str  # PostgreSQL: partial rows -> one partial row per pane and group
    reduce_statement: str  # PostgreSQL DML of the reducer (parameters min_rows, max_groups)
    aggregates: tuple[PlannedAggregate, ...]
    # PostgreSQL tables the view joins on read (aggregates over a stream-table join): the
    # partials are kept per window and the stream's join columns, the table joined on read.
    tables: tuple[str, ...] = ()
    # Its GROUP BY items computed on read (from those tables), as PostgreSQL SQL.
    read_keys: tuple[str, ...] = ()
    # With those tables: the view's rows of reduced windows, kept joined.
    joined: JoinedRows | None = None


@dataclass(frozen=True)
class SerialAggregatePlan(WindowedAggregatePlan):
    """A stream with a gather point: the query as written over the consolidated source,
    its closed windows materialized into the stream's archive and repaired after late data
    by the workers, with the ``serial`` statements. Those read their parameters from
    transaction-local settings (naming.SERIAL_*_SETTING)."""

    parallelism: ClassVar[Parallelism] = Parallelism.SERIAL

    serial: SerialStatements

    @property
    def ranks_windows(self) -> bool:
        """Whether it keeps the first rows of each window (a top-N, rewriter.build_top_n),
        which show no window column of their own and no key, not a row per window."""
        return not any(o.role in ("window_start", "window_end") for o in self.outputs)


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

    kind: ClassVar[str] = "derived"
    parallelism: ClassVar[Parallelism] = Parallelism.PARALLEL
    parallelism_reason: ClassVar[str] = "no aggregates: each source's runs are mapped row by row"

    name: str
    columns: tuple[ColumnSpec, ...]  # the rows' columns, naming.HIDDEN_EVENT_TIME included
    event_time: str
    branches: tuple[ProjectionBranch, ...]
    create_statements: tuple[str, ...]
    drop_statements: tuple[str, ...]
    view_query: str

    @property
    def shown(self) -> tuple[ColumnSpec, ...]:
        """The view's columns: all but an event time the query does not select."""
        return tuple(c for c in self.columns if c.name != naming.HIDDEN_EVENT_TIME)

    @property
    def dependencies(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(b.source for b in self.branches))

    @property
    def raw_sources(self) -> tuple[str, ...]:
        return self.dependencies

    def branch(self, source: str) -> ProjectionBranch | None:
        return next((b for b in self.branches if b.source == source), None)


@dataclass(frozen=True)
class JoinInput:
    """One input of a join stream: a raw stream under an alias, windowed (TUMBLE) or not.

    ``filter_sql`` is the PostgreSQL condition over the raw stream's own columns that the
    query's conditions put on this input alone (None if none): probes apply it in
    PostgreSQL, so that rows that can never match are not read.
    """

    alias: str
    source: str
    columns: tuple[ColumnSpec, ...]
    event_time: str
    window_us: int | None = None
    filter_sql: str | None = None


class ProbeKind(StrEnum):
    """How a link narrows the rows of one input to those another input's rows can match."""

    EQUAL = "equal"  # target column = one of the bound values
    AT_LEAST = "at_least"  # target column >= the smallest bound value + offset
    AT_MOST = "at_most"  # target column <= the largest bound value + offset
    SAME_WINDOW = "same_window"  # target event time in the windows of the bound rows


@dataclass(frozen=True)
class ProbeLink:
    """A conjunct of the join condition read as a restriction on the rows of input
    ``target`` given the rows already read for input ``bound`` (positions in ``inputs``).

    ``bound_column`` is a raw column of the bound input (for SAME_WINDOW, its event time);
    ``offset_us`` shifts the bound values (a band such as ``b.t - INTERVAL '1 minute'``).
    A link only narrows what is read: the whole condition is evaluated on what was read.
    """

    target: int
    column: str
    kind: ProbeKind
    bound: int
    bound_column: str
    offset_us: int = 0


@dataclass(frozen=True)
class JoinStreamPlan:
    """A stream of the rows an inner join of raw streams produces (seeds/001, seeds/004).

    Its rows are archived, each attributed to the run whose commit produced it: a batch of
    runs of one source joins with every row of the other inputs committed before it, and
    with itself where the stream is joined with itself (server/ingest/joins.py). Spark runs
    ``term_queries[i]`` for every input ``i`` fed by the batch; the history archived before
    the stream existed is joined once, in PostgreSQL, by ``history_statement``.
    """

    kind: ClassVar[str] = "derived"
    parallelism: ClassVar[Parallelism] = Parallelism.PARALLEL
    parallelism_reason: ClassVar[str] = (
        "inner join: its rows only grow, so each batch of runs adds the pairs it completes"
    )

    name: str
    # the SELECT list as archived (naming.HIDDEN_EVENT_TIME last when it selects no event
    # time); the view shows ``shown``
    columns: tuple[ColumnSpec, ...]
    event_time: str
    inputs: tuple[JoinInput, ...]
    links: tuple[ProbeLink, ...]
    # Spark SQL over the views naming.join_input_view(k) (the rows of input k, with the run
    # column), one per input: the join with input i's run as the rows' run.
    term_queries: tuple[str, ...]
    history_statement: str  # PostgreSQL: INSERT the join over every archived row
    create_statements: tuple[str, ...]
    drop_statements: tuple[str, ...]
    view_query: str
    # The inputs an outer join keeps every row of (empty for an inner join). The archive
    # holds the inner join; the view adds their unmatched rows, padded with NULLs, on read.
    preserved: tuple[int, ...] = ()
    # Where the event time comes from: the input (by position) and its column (its raw
    # event-time column, or window_start/window_end of a windowed input).
    event_time_input: int = 0
    event_time_column: str = ""

    @property
    def shown(self) -> tuple[ColumnSpec, ...]:
        """The view's columns: all but an event time the query does not select."""
        return tuple(c for c in self.columns if c.name != naming.HIDDEN_EVENT_TIME)

    @property
    def raw_sources(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(i.source for i in self.inputs))

    @property
    def dependencies(self) -> tuple[str, ...]:
        return self.raw_sources

    def positions(self, source: str) -> tuple[int, ...]:
        """The inputs fed by the runs of raw stream ``source``."""
        return tuple(k for k, i in enumerate(self.inputs) if i.source == source)


@dataclass(frozen=True)
class ReadJoinStreamPlan:
    """A join computed on read: a view over the inputs' views (and the PostgreSQL tables it
    joins, and versions of them, FOR SYSTEM_TIME AS OF), so every read joins the current
    content, and nothing is computed per run. Stream-table joins, and outer joins of three
    or more streams, whose padded rows a late row of any input may retract."""

    kind: ClassVar[str] = "derived"
    parallelism: ClassVar[Parallelism] = Parallelism.ON_READ
    parallelism_reason: ClassVar[str] = (
        "joined on read: results follow the inputs' and tables' current content"
    )

    name: str
    sources: tuple[str, ...]  # the streams joined
    raw_sources: tuple[str, ...]
    columns: tuple[OutputColumn, ...]
    event_time: str | None  # an input's event-time column, if selected
    tables: tuple[str, ...]
    create_statements: tuple[str, ...]
    drop_statements: tuple[str, ...]
    view_query: str

    @property
    def dependencies(self) -> tuple[str, ...]:
        return self.sources


@dataclass(frozen=True)
class ReadUnionStreamPlan:
    """A UNION ALL whose branches aggregate (or a query grouped by GROUPING SETS, ROLLUP
    or CUBE, a branch per grouping set): each branch a stream made with it, and the stream
    a view of the UNION ALL of their views. Every branch's view is exact at every instant
    and one statement reads them in one snapshot, so the union is too; nothing more is
    computed per run than the branches'."""

    kind: ClassVar[str] = "derived"
    parallelism: ClassVar[Parallelism] = Parallelism.ON_READ
    parallelism_reason: ClassVar[str] = "the union of its branches' streams, read together"

    name: str
    sources: tuple[str, ...]  # the branches' streams, in order
    raw_sources: tuple[str, ...]
    columns: tuple[OutputColumn, ...]
    create_statements: tuple[str, ...]
    drop_statements: tuple[str, ...]
    view_query: str

    @property
    def dependencies(self) -> tuple[str, ...]:
        return self.sources


@dataclass(frozen=True)
class OnReadStreamPlan:
    """A stream whose rows a late row can change anywhere (session windows, top-N and
    dedup): a view that computes the query from its source's view at every read, so it is
    exact at every instant, and nothing is computed per run. ``parallelism_reason`` says
    which form it is."""

    kind: ClassVar[str] = "derived"
    parallelism: ClassVar[Parallelism] = Parallelism.ON_READ

    name: str
    source: str
    raw_sources: tuple[str, ...]
    window: str | None  # e.g. "SESSION(bid, date_time, INTERVAL '10 seconds')"
    parallelism_reason: str
    columns: tuple[OutputColumn, ...]
    create_statements: tuple[str, ...]
    drop_statements: tuple[str, ...]
    view_query: str

    @property
    def dependencies(self) -> tuple[str, ...]:
        return (self.source,)


# A stream a window can read rows from: declared columns and an event-time column.
RowStreamPlan = RawStreamPlan | ProjectionStreamPlan | JoinStreamPlan
StreamPlan = (
    RawStreamPlan
    | ProjectionStreamPlan
    | JoinStreamPlan
    | ReadJoinStreamPlan
    | ReadUnionStreamPlan
    | OnReadStreamPlan
    | ParallelAggregatePlan
    | SerialAggregatePlan
)
