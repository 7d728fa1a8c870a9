"""Strata's query rewriter: pure functions from CREATE STREAM SQL to immutable plans."""

from rewriter.errors import StrataError
from rewriter.plan import (
    JoinStreamPlan,
    ParallelAggregatePlan,
    Parallelism,
    ProjectionStreamPlan,
    RawStreamPlan,
    SerialAggregatePlan,
    StreamPlan,
    WindowedAggregatePlan,
)
from rewriter.rewrite import companion, rewrite

__all__ = [
    "JoinStreamPlan",
    "ParallelAggregatePlan",
    "Parallelism",
    "ProjectionStreamPlan",
    "RawStreamPlan",
    "SerialAggregatePlan",
    "StrataError",
    "StreamPlan",
    "WindowedAggregatePlan",
    "companion",
    "rewrite",
]
