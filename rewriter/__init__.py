"""Strata's query rewriter: pure functions from CREATE STREAM SQL to immutable plans."""

from rewriter.errors import StrataError
from rewriter.plan import (
    ParallelAggregatePlan,
    Parallelism,
    ProjectionStreamPlan,
    RawStreamPlan,
    SerialAggregatePlan,
    StreamPlan,
    WindowedAggregatePlan,
)
from rewriter.rewrite import rewrite

__all__ = [
    "ParallelAggregatePlan",
    "Parallelism",
    "ProjectionStreamPlan",
    "RawStreamPlan",
    "SerialAggregatePlan",
    "StrataError",
    "StreamPlan",
    "WindowedAggregatePlan",
    "rewrite",
]
