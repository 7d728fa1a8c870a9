"""The rewriter's entry point: CREATE STREAM text + existing streams -> an immutable plan.

The passes run in order, each a pure function of its inputs:
parse_stream -> (raw) build_archive
             -> (derived) resolve_window -> split_aggregates -> build_views
"""

from __future__ import annotations

from collections.abc import Mapping

from rewriter.build_archive import build_archive
from rewriter.build_views import build_views
from rewriter.parse_stream import RawStreamStatement, parse_stream
from rewriter.plan import StreamPlan
from rewriter.resolve_window import resolve_window
from rewriter.split_aggregates import split_aggregates


def rewrite(sql: str, streams: Mapping[str, StreamPlan]) -> StreamPlan:
    """Plan a stream. ``streams`` are the existing streams, by name (the plan's sources)."""
    statement = parse_stream(sql)
    if isinstance(statement, RawStreamStatement):
        return build_archive(statement)
    window = resolve_window(statement.select, streams)
    split = split_aggregates(statement.select, window)
    return build_views(statement.name, split, window)
