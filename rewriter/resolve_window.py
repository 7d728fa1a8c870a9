"""Pass 2: the FROM clause of a derived stream -> its source stream and window.

Windows are aligned to the Unix epoch in UTC: a row at time t belongs to the tumbling
window starting at t - (t mod size), with t and size in microseconds.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from sqlglot import exp

from rewriter.errors import UnknownSource, UnsupportedSQL
from rewriter.plan import (
    OnReadStreamPlan,
    ParallelAggregatePlan,
    ReadJoinStreamPlan,
    ReadUnionStreamPlan,
    RowStreamPlan,
    SerialAggregatePlan,
    StreamPlan,
    WindowedAggregatePlan,
)
from rewriter.positions import located

_UNIT_US = {
    "microsecond": 1,
    "us": 1,
    "millisecond": 1_000,
    "ms": 1_000,
    "second": 1_000_000,
    "sec": 1_000_000,
    "s": 1_000_000,
    "minute": 60_000_000,
    "min": 60_000_000,
    "m": 60_000_000,
    "hour": 3_600_000_000,
    "h": 3_600_000_000,
    "day": 86_400_000_000,
    "d": 86_400_000_000,
    "week": 604_800_000_000,
    "w": 604_800_000_000,
}
_PART = re.compile(r"\s*(\d+)\s*([a-z]+)\s*")
WINDOW_FORM = "TUMBLE(source_stream, event_time_column, INTERVAL '1 minute')"
# The size of the one window of an aggregate without a window (a sentinel: no row is placed
# by arithmetic on it).
GLOBAL_WINDOW_US = 0
HOP_FORM = "HOP(source_stream, event_time_column, INTERVAL '1 minute', INTERVAL '5 minutes')"


@dataclass(frozen=True)
class WindowSpec:
    """The window of a derived stream: TUMBLE (slide == size) or HOP, over a source stream."""

    source: RowStreamPlan | WindowedAggregatePlan
    time_column: str
    size_us: int
    slide_us: int

    @property
    def is_hop(self) -> bool:
        return self.slide_us != self.size_us

    @property
    def is_global(self) -> bool:
        """No window: the aggregate runs over all rows (running totals), in one window
        that starts at the epoch (GLOBAL_WINDOW_US)."""
        return self.size_us == GLOBAL_WINDOW_US

    @property
    def pane_us(self) -> int:
        """Partials are kept per pane; every window is a whole number of panes."""
        return math.gcd(self.size_us, self.slide_us)

    def describe(self) -> str:
        if self.is_global:
            return f"none: over all rows of {self.source.name}"
        size = interval_text(self.size_us)
        if self.is_hop:
            slide = interval_text(self.slide_us)
            return (
                f"HOP({self.source.name}, {self.time_column}, INTERVAL '{slide}', "
                f"INTERVAL '{size}')"
            )
        return f"TUMBLE({self.source.name}, {self.time_column}, INTERVAL '{size}')"


_UNITS = (
    ("week", 604_800_000_000),
    ("day", 86_400_000_000),
    ("hour", 3_600_000_000),
    ("minute", 60_000_000),
    ("second", 1_000_000),
    ("millisecond", 1_000),
    ("microsecond", 1),
)
# The units an INTERVAL that SQL adds to a timestamptz may be spelled in (fixed_interval).
_FIXED_UNITS = _UNITS[2:]


def interval_text(size_us: int, units: tuple[tuple[str, int], ...] = _UNITS) -> str:
    """The largest whole unit spelling of a window size, e.g. 300_000_000 -> '5 minutes'."""
    for unit, size in units:
        if size_us % size == 0:
            count = size_us // size
            return f"{count} {unit}{'' if count == 1 else 's'}"
    raise AssertionError("unreachable")


def fixed_interval(size_us: int) -> exp.Interval:
    """An INTERVAL of exactly ``size_us`` microseconds, for the SQL that adds a window's
    size to a timestamptz (a window's end from its start, a session's end from its last
    row), spelled in hours at most: PostgreSQL adds a day or a week in the session's time
    zone, 23 or 25 hours across a daylight-saving change, so that a view read by a session
    in such a zone (or folded by a server whose database has one) placed a day window's end
    an hour off; windows are whole microseconds from the epoch, in every zone
    (strata_window_start), and '24 hours' is always 86,400 seconds."""
    return exp.Interval(this=exp.Literal.string(interval_text(size_us, _FIXED_UNITS)))


def parse_interval(node: exp.Expr, what: str = "window size") -> int:
    """Microseconds in a fixed-length INTERVAL literal; months and years are refused.
    ``what`` names the interval in errors (a window size, an interval in a condition)."""
    if not isinstance(node, exp.Interval) or not isinstance(node.this, exp.Literal):
        raise UnsupportedSQL(f"{what} must be an INTERVAL literal, e.g. {WINDOW_FORM}")
    text = node.this.name.lower()
    unit = node.args.get("unit")
    if unit is not None:
        text = f"{text} {unit.name.lower()}"
    total = 0
    position = 0
    while position < len(text):
        match = _PART.match(text, position)
        if match is None:
            break
        amount, name = int(match.group(1)), match.group(2)
        size = _UNIT_US.get(name) or _UNIT_US.get(name.rstrip("s"))
        if size is None:
            raise UnsupportedSQL(
                f"interval unit {name!r} is not supported in a {what}; use whole microseconds "
                "to weeks (months and years have no fixed length)"
            )
        total += amount * size
        position = match.end()
    if position != len(text) or total <= 0:
        raise UnsupportedSQL(
            f"cannot read the {what} {node.sql('postgres')!r}: write whole numbers of units, "
            "e.g. INTERVAL '1500 milliseconds'"
        )
    return total


def resolve_window(select: exp.Select, streams: Mapping[str, StreamPlan]) -> WindowSpec:
    from_ = select.args.get("from_")
    with located(from_ if from_ is not None else select):
        return _resolve_window(select, streams)


def _resolve_window(select: exp.Select, streams: Mapping[str, StreamPlan]) -> WindowSpec:
    if select.args.get("joins"):
        raise UnsupportedSQL("joins are not supported in a derived stream")
    from_ = select.args.get("from_")
    table = from_.this if from_ is not None else None
    call = table.this if isinstance(table, exp.Table) else None
    kind = call.name.upper() if isinstance(call, exp.Anonymous) else None
    if isinstance(table, exp.Table) and isinstance(call, exp.Identifier):
        return _over_all_rows(table, streams)
    if kind == "CUMULATE":
        raise UnsupportedSQL(
            "CUMULATE windows are not supported: aggregate per step in a stream (FROM "
            "TUMBLE(source, t, INTERVAL 'step')), then read running totals over it with a "
            "stream of window functions: sum(n) OVER (PARTITION BY ..., date_trunc('day', "
            "window_start AT TIME ZONE 'UTC') ORDER BY window_start)"
        )
    if kind is not None and kind not in ("TUMBLE", "HOP"):
        raise UnsupportedSQL(
            f"{kind}(...) is not a window Strata knows; windows: {WINDOW_FORM}, {HOP_FORM} "
            "and SESSION(source_stream, event_time_column, INTERVAL 'gap')"
        )
    if kind not in ("TUMBLE", "HOP"):
        raise UnsupportedSQL(f"a derived stream reads FROM {WINDOW_FORM} or {HOP_FORM}")
    assert isinstance(call, exp.Anonymous)
    args = list(call.expressions)
    intervals = 1 if kind == "TUMBLE" else 2
    form = WINDOW_FORM if kind == "TUMBLE" else HOP_FORM
    # The time column may be left out: it is then the source's event-time column (or its
    # window_end, for a derived source); the seeds' <SLICES ...> sugar relies on this.
    if len(args) not in (1 + intervals, 2 + intervals) or not isinstance(args[0], exp.Column):
        raise UnsupportedSQL(f"{kind} takes a stream, its time column and intervals: {form}")
    source_name = args[0].name
    found = streams.get(source_name)
    if found is None:
        raise UnknownSource(f"stream {source_name!r} does not exist")
    source = _windowable(found)
    if len(args) == 2 + intervals:
        if not isinstance(args[1], exp.Column):
            raise UnsupportedSQL(f"the second argument of {kind} names a column: {form}")
        time_column = args[1].name
    else:
        time_column = _default_time_column(source)
    sizes = [parse_interval(a) for a in args[-intervals:]]
    size_us = sizes[-1]
    slide_us = sizes[0]
    if kind == "HOP" and size_us % slide_us != 0:
        raise UnsupportedSQL(
            f"HOP window size {interval_text(size_us)} must be a whole multiple of its slide "
            f"{interval_text(slide_us)}"
        )
    _check_time_column(source, time_column, kind)
    if isinstance(source, WindowedAggregatePlan):
        if kind == "HOP":
            raise UnsupportedSQL(
                f"HOP over the derived stream {source_name!r} is not supported; use TUMBLE"
            )
        if size_us % source.window_size_us != 0:
            raise UnsupportedSQL(
                f"the window {interval_text(size_us)} must be a whole multiple of the window "
                f"of {source_name!r} ({interval_text(source.window_size_us)}), so that each "
                "of its windows falls into exactly one"
            )
    return WindowSpec(source, time_column, size_us, slide_us)


def _over_all_rows(table: exp.Table, streams: Mapping[str, StreamPlan]) -> WindowSpec:
    """An aggregate without a window (``FROM stream GROUP BY keys``): running totals over
    every row of a stream of rows, in one window."""
    found = streams.get(table.name)
    if found is None:
        raise UnknownSource(f"stream {table.name!r} does not exist")
    source = _windowable(found)
    if isinstance(source, WindowedAggregatePlan):
        raise UnsupportedSQL(
            f"an aggregate over the derived stream {source.name!r} needs a window: "
            f"FROM TUMBLE({source.name}, window_end, INTERVAL '...')"
        )
    return WindowSpec(source, source.event_time, GLOBAL_WINDOW_US, GLOBAL_WINDOW_US)


def _windowable(source: StreamPlan) -> RowStreamPlan | WindowedAggregatePlan:
    """``source``, unless it is joined on read (with tables, or an outer join of three or
    more streams): such a stream has no per-run rows or partials a window could use."""
    if isinstance(source, ReadJoinStreamPlan | ParallelAggregatePlan) and source.tables:
        raise UnsupportedSQL(
            f"{source.name!r} joins the table {source.tables[0]!r} on read, so that it "
            "follows the table's changes; streams are not built on it: write the aggregate "
            "over the stream joined with the table in one statement, e.g. SELECT c.owner, "
            "sum(i.price) AS revenue, window_end AS t FROM TUMBLE(impsns, t, INTERVAL "
            "'1 minute') AS i JOIN campaigns c ON c.campaign = i.campaign GROUP BY c.owner, "
            "window_end"
        )
    if isinstance(source, ReadUnionStreamPlan):
        raise UnsupportedSQL(
            f"{source.name!r} is the union of the streams {', '.join(source.sources)}, read "
            "together; streams are not built on it: build them on each branch's stream"
        )
    if isinstance(source, OnReadStreamPlan):
        raise UnsupportedSQL(
            f"{source.name!r} is computed on read ({source.parallelism_reason}); streams are "
            "not built on it"
        )
    if isinstance(source, SerialAggregatePlan) and source.ranks_windows:
        raise UnsupportedSQL(
            f"{source.name!r} keeps the first rows of each window of {source.source!r} "
            f"({source.parallelism_reason.removeprefix('serial: ')}); streams are not built "
            "on it"
        )
    if isinstance(source, ReadJoinStreamPlan):
        raise UnsupportedSQL(
            f"{source.name!r} is an outer join of three or more streams, computed on read; "
            "streams are not built on it: build them on outer joins of two streams (a join "
            "stream of the others first)"
        )
    return source


def _default_time_column(source: RowStreamPlan | WindowedAggregatePlan) -> str:
    if not isinstance(source, WindowedAggregatePlan):
        return source.event_time
    for role in ("window_end", "window_start"):
        column = next((o.name for o in source.outputs if o.role == role), None)
        if column is not None:
            return column
    raise UnsupportedSQL(
        f"stream {source.name!r} exposes no window column (window_start or window_end) to "
        "window over"
    )


def _check_time_column(
    source: RowStreamPlan | WindowedAggregatePlan, time_column: str, kind: str
) -> None:
    if not isinstance(source, WindowedAggregatePlan):
        if time_column != source.event_time:
            raise UnsupportedSQL(
                f"{kind} windows over the event-time column of {source.name!r}, "
                f"{source.event_time!r}, not {time_column!r}"
            )
        return
    output = source.output(time_column)
    if output is None or output.role not in ("window_start", "window_end"):
        raise UnsupportedSQL(
            f"{kind} over the derived stream {source.name!r} windows over its window column "
            f"(its window_start or window_end output), not {time_column!r}"
        )
