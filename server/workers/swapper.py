"""The swapper: swaps in an ALTER STREAM's new definition once it has caught up with the
history (server/alter.py), in one transaction."""

from __future__ import annotations

import psycopg
import sqlalchemy as sa

from rewriter.plan import RawStreamPlan, StreamPlan
from server import alter, catalog, feed
from server.catalog import PlanCache
from server.metrics import Metrics
from server.workers.loop import Worker


class Swapper(Worker):
    name = "alter"

    def __init__(
        self,
        engine: sa.Engine,
        plans: PlanCache,
        *,
        interval: float = 0.5,
        metrics: Metrics | None = None,
    ) -> None:
        super().__init__(engine, plans, interval=interval, batch=1, metrics=metrics)

    def run_once(self) -> dict[str, int]:
        """A pass over the streams, when an ALTER is building (most passes have none)."""
        with self.engine.connect() as connection:
            if not alter.alterations(connection):
                return {}
        return super().run_once()

    def applies_to(self, plan: StreamPlan) -> bool:
        return not isinstance(plan, RawStreamPlan)

    def step(self, plan: StreamPlan) -> int:
        try:
            return self._swap(plan)
        except (sa.exc.OperationalError, psycopg.errors.LockNotAvailable) as error:
            if not alter.gave_way(error):
                raise
            self.log.info("swap of %s waits for readers; next pass", plan.name)
            return 0

    def _swap(self, plan: StreamPlan) -> int:
        with self.transaction() as connection:
            pending = alter.building(connection, plan.name)
            if pending is None or not alter.ready(connection, pending):
                return 0
            catalog.lock_ddl(connection)
            # Under the DDL lock: the ALTER may have been replaced or cancelled meanwhile.
            if alter.building(connection, plan.name) != pending:
                return 0
            alter.swap(connection, self.plans, plan.name)
            feed.follow_definitions(connection, self.plans)  # announce the new views
            return 1
