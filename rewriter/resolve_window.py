"""Pass 2: the FROM clause of a derived stream -> its source stream and window.

Windows are aligned to the Unix epoch in UTC: a row at time t belongs to the tumbling
window starting at t - (t mod size), with t and size in microseconds.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from sqlglot import exp

from rewriter.errors import UnknownStream, UnsupportedSQL
from rewriter.plan import RawStreamPlan, StreamPlan

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


@dataclass(frozen=True)
class WindowSpec:
    source: RawStreamPlan
    time_column: str
    size_us: int

    def describe(self) -> str:
        size = interval_text(self.size_us)
        return f"TUMBLE({self.source.name}, {self.time_column}, INTERVAL '{size}')"


def interval_text(size_us: int) -> str:
    """The largest whole unit spelling of a window size, e.g. 300_000_000 -> '5 minutes'."""
    for unit, size in (
        ("week", 604_800_000_000),
        ("day", 86_400_000_000),
        ("hour", 3_600_000_000),
        ("minute", 60_000_000),
        ("second", 1_000_000),
        ("millisecond", 1_000),
        ("microsecond", 1),
    ):
        if size_us % size == 0:
            count = size_us // size
            return f"{count} {unit}{'' if count == 1 else 's'}"
    raise AssertionError("unreachable")


def parse_interval(node: exp.Expr) -> int:
    """Microseconds in a fixed-length INTERVAL literal; months and years are refused."""
    if not isinstance(node, exp.Interval) or not isinstance(node.this, exp.Literal):
        raise UnsupportedSQL(f"window size must be an INTERVAL literal, e.g. {WINDOW_FORM}")
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
                f"interval unit {name!r} is not supported in a window; use microseconds to "
                "weeks (months and years have no fixed length)"
            )
        total += amount * size
        position = match.end()
    if position != len(text) or total <= 0:
        raise UnsupportedSQL(f"cannot read the window size {node.sql('postgres')!r}")
    return total


def resolve_window(select: exp.Select, streams: Mapping[str, StreamPlan]) -> WindowSpec:
    if select.args.get("joins"):
        raise UnsupportedSQL("joins are not supported in a derived stream")
    from_ = select.args.get("from_")
    table = from_.this if from_ is not None else None
    call = table.this if isinstance(table, exp.Table) else None
    if not isinstance(call, exp.Anonymous) or call.name.upper() != "TUMBLE":
        raise UnsupportedSQL(f"a derived stream reads FROM {WINDOW_FORM}")
    args = call.expressions
    if len(args) != 3 or not all(isinstance(a, exp.Column) for a in args[:2]):
        raise UnsupportedSQL(f"TUMBLE takes three arguments: {WINDOW_FORM}")
    source_name, time_column = args[0].name, args[1].name
    source = streams.get(source_name)
    if source is None:
        raise UnknownStream(f"stream {source_name!r} does not exist")
    if not isinstance(source, RawStreamPlan):
        raise UnsupportedSQL(
            f"{source_name!r} is a derived stream; deriving from derived streams is not supported "
            "yet, derive from a raw stream"
        )
    if time_column != source.event_time:
        raise UnsupportedSQL(
            f"TUMBLE windows over the event-time column of {source_name!r}, "
            f"{source.event_time!r}, not {time_column!r}"
        )
    return WindowSpec(source, time_column, parse_interval(args[2]))
