"""The reducer (seeds/003): keeps partial archives small by folding the partial rows of a
(window, group) into one row, still in partial form, so that later late data still merges.

Policy: a (window, group) is folded once it holds more than ``min_rows`` partial rows; at
most ``max_groups`` per statement, repeated while there is work. Every fold is one
statement (one transaction), so no reader ever sees a view change because of it. One
failing stream is logged and skipped; the loop goes on.
"""

from __future__ import annotations

import logging
import threading

import sqlalchemy as sa

from rewriter.plan import DerivedStreamPlan
from server.catalog import PlanCache

log = logging.getLogger("strata.reducer")


class Reducer:
    def __init__(
        self,
        engine: sa.Engine,
        plans: PlanCache,
        *,
        min_rows: int = 4,
        max_groups: int = 10_000,
        interval: float = 5.0,
    ) -> None:
        self.engine = engine
        self.plans = plans
        self.min_rows = min_rows
        self.max_groups = max_groups
        self.interval = interval
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self) -> dict[str, int]:
        """One pass over every parallel stream; returns the groups folded per stream."""
        with self.engine.connect() as connection:
            records = self.plans.load(connection)
        folded: dict[str, int] = {}
        for record in records.values():
            plan = record.plan
            if not isinstance(plan, DerivedStreamPlan) or not plan.reduce_statement:
                continue
            try:
                folded[plan.name] = self._reduce(plan)
            except Exception:  # one stream's failure must not stop the others
                log.exception("reducing %s failed; skipped this round", plan.name)
        return folded

    def _reduce(self, plan: DerivedStreamPlan) -> int:
        total = 0
        params = {"min_rows": self.min_rows, "max_groups": self.max_groups}
        while not self._stopping.is_set():
            with self.engine.begin() as connection:
                driver = connection.connection.driver_connection
                assert driver is not None
                folded = driver.execute(plan.reduce_statement, params).rowcount
            total += folded
            if folded < self.max_groups:
                break
        if total:
            log.info("reduced %d groups of %s", total, plan.name)
        return total

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="strata-reducer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def _loop(self) -> None:
        while not self._stopping.wait(self.interval):
            self.run_once()
