"""The reducer (seeds/003): keeps partial archives small by folding the partial rows of a
(window, group) into one row, still in partial form, so that later late data still merges.

Policy: a (window, group) is folded once it holds more than ``min_rows`` partial rows, at
most ``batch`` groups per statement. Every fold is one statement (one transaction), so no
reader ever sees a view change because of it.
"""

from __future__ import annotations

import sqlalchemy as sa

from rewriter.plan import ParallelAggregatePlan, StreamPlan
from server.catalog import PlanCache
from server.metrics import Metrics
from server.settings import DEFAULTS
from server.workers.loop import Worker


class Reducer(Worker):
    name = "reducer"

    def __init__(
        self,
        engine: sa.Engine,
        plans: PlanCache,
        *,
        min_rows: int = DEFAULTS.reduce_min_rows,
        max_groups: int = 10_000,
        interval: float = DEFAULTS.reduce_interval,
        metrics: Metrics | None = None,
    ) -> None:
        super().__init__(engine, plans, interval=interval, batch=max_groups, metrics=metrics)
        self.min_rows = min_rows

    def applies_to(self, plan: StreamPlan) -> bool:
        return isinstance(plan, ParallelAggregatePlan)

    def step(self, plan: StreamPlan) -> int:
        assert isinstance(plan, ParallelAggregatePlan)
        with self.engine.begin() as connection:
            driver = connection.connection.driver_connection
            assert driver is not None
            params = {"min_rows": self.min_rows, "max_groups": self.batch}
            return int(driver.execute(plan.reduce_statement, params).rowcount)
