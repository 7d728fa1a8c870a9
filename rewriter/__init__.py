"""Strata's query rewriter: pure functions from CREATE STREAM SQL to immutable plans."""

from rewriter.errors import StrataError
from rewriter.plan import DerivedStreamPlan, RawStreamPlan, StreamPlan
from rewriter.rewrite import rewrite

__all__ = ["DerivedStreamPlan", "RawStreamPlan", "StrataError", "StreamPlan", "rewrite"]
