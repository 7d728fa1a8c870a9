"""Retention: raw rows older than a raw stream's ``retention`` (by event time) are dropped
from its raw archive, in bounded batches. Partial archives keep their results, so the
views of existing streams still count those rows; what is gone is the raw history that a
stream created later back-fills from (see docs/concepts/late-data.md, "Retention")."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import sqlalchemy as sa

from rewriter.plan import RawStreamPlan, StreamPlan
from server.catalog import PlanCache
from server.metrics import Metrics
from server.workers.loop import Worker


class Retention(Worker):
    name = "retention"

    def __init__(
        self,
        engine: sa.Engine,
        plans: PlanCache,
        *,
        max_rows: int = 50_000,
        interval: float = 60.0,
        metrics: Metrics | None = None,
    ) -> None:
        super().__init__(engine, plans, interval=interval, batch=max_rows, metrics=metrics)

    def applies_to(self, plan: StreamPlan) -> bool:
        return isinstance(plan, RawStreamPlan) and plan.retention_us > 0

    def step(self, plan: StreamPlan) -> int:
        assert isinstance(plan, RawStreamPlan)
        cutoff = datetime.now(UTC) - timedelta(microseconds=plan.retention_us)
        with self.transaction() as connection:
            driver = connection.connection.driver_connection
            assert driver is not None
            params = {"cutoff": cutoff, "max_rows": self.batch}
            return int(driver.execute(plan.retention_statement, params).rowcount)
