"""What the migrations that carry streams forward share: each stream's plan as today's
rewriter makes it from the stream's stored SQL (as at every start), and the database
connection to run a plan's statements on, straight through psycopg without parameters (a
plan's SQL may hold a '%')."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from alembic import op

if TYPE_CHECKING:
    import psycopg

    from rewriter.plan import StreamPlan

Plan = TypeVar("Plan", bound="StreamPlan")


def stored_plans(kind: type[Plan]) -> tuple[psycopg.Connection, dict[str, Plan]]:
    """The migration's psycopg connection, and the plans of the streams of ``kind`` by
    name (for migrations after 0015, whose catalog has stream versions)."""
    from server.catalog import PlanCache

    connection = op.get_bind()
    driver = connection.connection.driver_connection
    assert driver is not None
    records = PlanCache().load(connection)
    return driver, {n: r.plan for n, r in records.items() if isinstance(r.plan, kind)}


def replace_views(kind: type[StreamPlan]) -> None:
    """Replace the view of every stream of ``kind`` with today's, after the functions it
    calls (rewriter.rename.replaced_views): the same columns of the same types, so that its
    readers and the streams built on it keep working."""
    from rewriter.rename import replaced_views

    driver, plans = stored_plans(kind)
    for plan in plans.values():
        for statement in replaced_views(plan):
            driver.execute(statement)
