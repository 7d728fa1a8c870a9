"""Pass 3g: session windows, ``SESSION(stream, time_column, INTERVAL 'gap')``, computed on
read (Nexmark q11).

A session of a group (the GROUP BY keys) is a maximal run of its rows, in event-time order,
each less than ``gap`` after the one before; the window starts at its first row and ends
``gap`` after its last (as Flink's session windows: [t, t + gap) per row, overlapping ones
merged). WHERE filters rows before sessions are formed. A late row can extend a session or
merge two, so a session's rows are only known from all rows of its group: the stream is a
view that forms the sessions from the source's view at every read (PostgreSQL window
functions: a row starts a session when the one before it in its group is ``gap`` or more
earlier; a running sum of those starts numbers the sessions). So it is exact at every
instant, whatever the lateness; reading it scans the source's rows (of the groups and time
range a reader's filter keeps, where PostgreSQL can push the filter down: over a raw
stream, a filter on the keys reads one range of an index of the raw archive on the keys
and event time, which the stream creates). Aggregates run in PostgreSQL as written
(approximate ones as their exact twins). Streams are not built on a session stream.
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlglot import exp

from rewriter import naming
from rewriter.ddl import create_index, create_view, drop, table
from rewriter.derived_select import check_clauses, check_shown_time, output_name
from rewriter.errors import UnknownSource, UnsupportedSQL
from rewriter.expressions import BOOLEAN, infer_type
from rewriter.parse_stream import SESSION_CALL
from rewriter.plan import (
    JoinStreamPlan,
    OnReadStreamPlan,
    OutputColumn,
    ProjectionStreamPlan,
    RawStreamPlan,
    StreamPlan,
)
from rewriter.registry import contains_aggregate, exact_in_postgres
from rewriter.resolve_window import fixed_interval, interval_text, parse_interval
from rewriter.split_query import group_by_keys

SESSION_FORM = "SESSION(source_stream, event_time_column, INTERVAL '10 seconds')"
_NEW = "strata_new_session"
_NUMBER = "strata_session"
_WINDOW_COLUMNS = (naming.WINDOW_START_COLUMN, naming.WINDOW_END_COLUMN)


def is_session(select: exp.Expr) -> bool:
    if not isinstance(select, exp.Select):
        return False
    from_ = select.args.get("from_")
    item = from_.this if from_ is not None else None
    call = item.this if isinstance(item, exp.Table) else None
    return isinstance(call, exp.Anonymous) and call.name.upper() in ("SESSION", SESSION_CALL)


def build_session(
    name: str, select: exp.Select, streams: Mapping[str, StreamPlan]
) -> OnReadStreamPlan:
    check_clauses(select)
    if select.args.get("joins"):
        raise UnsupportedSQL(
            f"a session window reads one stream: {SESSION_FORM}; join in a stream first"
        )
    item = select.args["from_"].this
    args = list(item.this.expressions)
    if len(args) != 3 or not all(isinstance(a, exp.Column) for a in args[:2]):
        raise UnsupportedSQL(
            f"SESSION takes a stream, its event-time column and a gap: {SESSION_FORM}"
        )
    source = streams.get(args[0].name)
    if source is None:
        raise UnknownSource(f"stream {args[0].name!r} does not exist")
    if not isinstance(source, RawStreamPlan | ProjectionStreamPlan | JoinStreamPlan):
        raise UnsupportedSQL(
            f"SESSION windows read a stream of rows (raw, a projection or a join), not the "
            f"aggregate stream {source.name!r}"
        )
    time_column = args[1].name
    check_shown_time(source.name, source.event_time, "a session window")
    if time_column != source.event_time:
        raise UnsupportedSQL(
            f"SESSION windows over the event-time column of {source.name!r}, "
            f"{source.event_time!r}, not {time_column!r}"
        )
    gap_us = parse_interval(args[2], "session gap")
    schema = {c.name: c.type for c in source.columns}
    keys = group_by_keys(select, schema)
    for key in keys:
        infer_type(key, schema)  # a row expression over the source's columns
    if not contains_aggregate(select) and not keys:
        raise UnsupportedSQL("a session stream aggregates: GROUP BY keys and window_start")
    where = select.args.get("where")
    if where is not None and (
        contains_aggregate(where.this) or infer_type(where.this, schema) != BOOLEAN
    ):
        raise UnsupportedSQL("WHERE needs a boolean condition on the rows, without aggregates")
    view = _view(select, source.name, time_column, gap_us, keys)
    outputs = []
    for item_ in select.expressions:
        expression = item_.this if isinstance(item_, exp.Alias) else item_
        role = "expression"
        if isinstance(expression, exp.Column) and expression.name in _WINDOW_COLUMNS:
            role = expression.name
        outputs.append(
            OutputColumn(
                naming.check_column_name(output_name(item_), window_names=True),
                "timestamptz" if role != "expression" else None,
                role,
            )
        )
    names = [o.name for o in outputs]
    if len(set(names)) != len(names):
        raise UnsupportedSQL("two output columns have the same name; give each its own alias")
    return OnReadStreamPlan(
        name=name,
        source=source.name,
        raw_sources=(source.name,) if isinstance(source, RawStreamPlan) else source.raw_sources,
        window=f"SESSION({source.name}, {time_column}, INTERVAL '{interval_text(gap_us)}')",
        parallelism_reason=(
            "session windows: a late row can extend or merge sessions, so they are formed "
            "from the source's rows on read"
        ),
        columns=tuple(outputs),
        create_statements=(*_key_index(source, keys, time_column), create_view(name, view)),
        drop_statements=(drop("VIEW", table(name, naming.PUBLIC_SCHEMA)),),
        view_query=view.sql("postgres"),
    )


def _key_index(source: StreamPlan, keys: list[exp.Expr], time_column: str) -> list[str]:
    """An index of a raw source's archive on the keys and the event time, when every key is
    a column of it: a reader's filter on a key (a campaign's sessions) reads that key's
    rows as one range of it, already in the order sessions are formed in, where the
    archive's rows were all scanned (its only index is on runs). It costs the raw stream's
    ingest an index entry per row, so only raw streams sessions read by key pay it."""
    if not isinstance(source, RawStreamPlan):
        return []
    columns = [k.name for k in keys if isinstance(k, exp.Column) and not k.table]
    known = {c.name for c in source.columns}
    if not keys or len(columns) != len(keys) or not set(columns) <= known:
        return []
    return [
        create_index(
            naming.session_index(source.name, [*columns, time_column]),
            table(naming.raw_archive_table(source.name)),
            [exp.column(c, quoted=True) for c in [*columns, time_column]],
            if_not_exists=True,
        )
    ]


def _view(
    select: exp.Select, source: str, time_column: str, gap_us: int, keys: list[exp.Expr]
) -> exp.Select:
    gap = fixed_interval(gap_us)
    time = exp.column(time_column, quoted=True)
    partition = [k.copy() for k in keys]

    def over(function: exp.Expr, *, ordered: bool, frame: bool = False) -> exp.Window:
        window = exp.Window(
            this=function,
            partition_by=[p.copy() for p in partition] or None,
            order=exp.Order(expressions=[exp.Ordered(this=time.copy())]) if ordered else None,
        )
        if frame:
            window.set(
                "spec",
                exp.WindowSpec(kind="ROWS", start="UNBOUNDED", start_side="PRECEDING"),
            )
        return window

    rows = exp.select(exp.Star()).from_(exp.alias_(table(source, naming.PUBLIC_SCHEMA), "src"))
    where = select.args.get("where")
    if where is not None:
        rows = rows.where(where.this.copy())
    previous = over(exp.func("lag", time.copy()), ordered=True)
    starts = exp.Case(
        ifs=[
            exp.If(
                this=exp.LT(this=exp.Sub(this=time.copy(), expression=previous), expression=gap),
                true=exp.Literal.number(0),
            )
        ],
        default=exp.Literal.number(1),
    )
    marked = exp.select(exp.Star(), exp.alias_(starts, _NEW)).from_(
        exp.alias_(rows.subquery(), "rows_")
    )
    numbered = exp.select(
        exp.Star(),
        exp.alias_(over(exp.Sum(this=exp.column(_NEW)), ordered=True, frame=True), _NUMBER),
    ).from_(exp.alias_(marked.subquery(), "marked"))
    session_start = exp.Min(this=time.copy())
    session_end = exp.Add(this=exp.Max(this=time.copy()), expression=gap.copy())

    def place(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Column) and node.name == naming.WINDOW_START_COLUMN:
            return session_start.copy()
        if isinstance(node, exp.Column) and node.name == naming.WINDOW_END_COLUMN:
            return session_end.copy()
        return node

    view = select.copy()
    view.set("from_", exp.From(this=exp.alias_(numbered.subquery(), "sessions")))
    view.set("where", None)
    view.set(
        "group",
        exp.Group(expressions=[*(k.copy() for k in keys), exp.column(_NUMBER)]),
    )
    items = []
    for item in select.expressions:
        expression = item.this if isinstance(item, exp.Alias) else item
        items.append(exp.alias_(expression.copy(), output_name(item), quoted=True))
    view.set("expressions", items)
    placed = view.transform(place).transform(exact_in_postgres)
    assert isinstance(placed, exp.Select)
    return placed
