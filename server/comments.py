"""COMMENT ON every stream's view and its columns: what a BI tool's schema browser shows.

The view's comment is the stream's SQL; a column's says what it is (the window, a group
key, an aggregate) and, for an aggregate, whether a dashboard may add it up across rows
(sums and counts) or not (averages, extremes, distinct counts, percentiles, sketches).
Written when a stream is created and again at every start (COMMENT replaces), so streams
made by earlier releases have them too.
"""

from __future__ import annotations

import sqlalchemy as sa
from psycopg import sql

from rewriter.naming import PUBLIC_SCHEMA
from rewriter.plan import OutputColumn, ParallelAggregatePlan, StreamPlan, WindowedAggregatePlan
from server.catalog import PlanCache

# Aggregates whose values add up across windows and groups.
ADDITIVE = frozenset({"count(*)", "count", "sum"})
APPROXIMATE = frozenset({"approx_count_distinct", "approx_percentile"})


def comment_statements(plan: StreamPlan, text: str) -> list[sql.Composed]:
    """The COMMENT statements of ``plan``'s view, ``text`` being the stream's SQL."""
    view = sql.Identifier(PUBLIC_SCHEMA, plan.name)
    statements = [sql.SQL("COMMENT ON VIEW {} IS {}").format(view, sql.Literal(text))]
    if isinstance(plan, WindowedAggregatePlan):
        for output in plan.outputs:
            column = sql.Identifier(PUBLIC_SCHEMA, plan.name, output.name)
            statements.append(
                sql.SQL("COMMENT ON COLUMN {} IS {}").format(
                    column, sql.Literal(describe(plan, output))
                )
            )
    return statements


def describe(plan: WindowedAggregatePlan, output: OutputColumn) -> str:
    if output.role == "window_start":
        return f"window start ({plan.window})"
    if output.role == "window_end":
        return f"window end ({plan.window})"
    if output.role in ("key", "group"):
        return "group key"
    if output.role == "aggregate" and isinstance(plan, ParallelAggregatePlan) and output.ref:
        rule = plan.aggregates[int(output.ref)].rule
        if rule in ADDITIVE:
            return f"{rule}: additive, may be summed across rows"
        approximate = " (approximate)" if rule in APPROXIMATE else ""
        return f"{rule}{approximate}: non-additive, do not sum or average across rows"
    return "computed from the window's aggregates: non-additive unless a sum or count"


def comment_all(engine: sa.Engine) -> None:
    """Write the comments of every stream's view (at start)."""
    with engine.begin() as connection:
        driver = connection.connection.driver_connection
        assert driver is not None
        for record in PlanCache().load(connection).values():
            for statement in comment_statements(record.plan, record.sql):
                driver.execute(statement)
