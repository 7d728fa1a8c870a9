"""How each engine computes a row's epoch-aligned window (DESIGN.md: windows are aligned
to the Unix epoch in UTC), for the passes that place rows in windows."""

from __future__ import annotations

from sqlglot import exp


def window_start_spark(time_column: str, size_us: int) -> exp.Expr:
    """Start of the epoch-aligned window holding ``time_column``, computed in microseconds;
    size 0 is the one window of an aggregate over all rows, which starts at the epoch."""
    if size_us == 0:
        return exp.func("timestamp_micros", exp.Literal.number(0))
    micros = exp.func("unix_micros", exp.column(time_column, quoted=True))
    offset = exp.func("pmod", micros.copy(), exp.Literal.number(size_us))
    return exp.func("timestamp_micros", exp.Sub(this=micros, expression=offset))
