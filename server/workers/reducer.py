"""The reducer (seeds/003): keeps partial archives small by folding the partial rows of a
(window, group) into one row, still in partial form, so that later late data still merges.

Policy: the partial rows of a pane are moved into the stream's consolidated table once the
pane holds more than ``min_rows`` of them (0: at every pass), at most ``batch`` panes per
statement; the consolidated table keeps one row per window and group, with the final
values the view reads like a plain table. A pass runs every ``interval`` seconds, and at
once when a commit brings late rows (the ingest pipeline wakes the reducer): a window late
data reopened is merged on read only until that pass has folded it, not for a whole
interval. It folds ``concurrency`` streams at once (STRATA_REDUCE_CONCURRENCY), each on its
own connection.
Every fold is one statement (one transaction), so no reader ever sees a view change
because of it; a lock per stream keeps two reducers (two servers on one database) from
folding the same window at once.

An aggregate joined with tables on read keeps its view's rows of reduced windows joined
(rewriter/build_joined.py): the fold writes those of the windows it rewrites, and after a
table changed, the step writes them all anew under the same lock, having put the change
feed's trigger on the tables (server/feed/tables.py), which counts their changes. A table
Strata's role may not put a trigger on is joined on read at every read, as before.
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg
import sqlalchemy as sa

from rewriter.plan import JoinedRows, ParallelAggregatePlan, StreamPlan
from server import faults
from server.catalog import PlanCache
from server.errors import NoFeed
from server.feed.tables import watch
from server.metrics import Metrics
from server.settings import DEFAULTS
from server.workers.loop import Worker

log = logging.getLogger(__name__)

# The first key of the reducer's advisory locks (the second is the stream's name hashed).
REDUCER_LOCK_SPACE = 5_310


def lock_reducer(connection: sa.Connection, stream: str) -> None:
    """Hold the reducer of ``stream`` off until the transaction ends (or wait for its
    fold in flight)."""
    connection.execute(
        sa.text("SELECT pg_advisory_xact_lock(:space, hashtext(:stream))"),
        {"space": REDUCER_LOCK_SPACE, "stream": stream},
    )


class Reducer(Worker):
    name = "reducer"

    def __init__(
        self,
        engine: sa.Engine,
        plans: PlanCache,
        *,
        min_rows: int = DEFAULTS.reduce_min_rows,
        max_groups: int = 500,
        interval: float = DEFAULTS.reduce_interval,
        concurrency: int = DEFAULTS.reduce_concurrency,
        metrics: Metrics | None = None,
    ) -> None:
        super().__init__(
            engine,
            plans,
            interval=interval,
            batch=max_groups,
            metrics=metrics,
            concurrency=concurrency,
        )
        self.min_rows = min_rows
        # Streams joining a table whose changes no trigger can count (NoFeed).
        self._unwatched: set[str] = set()

    def applies_to(self, plan: StreamPlan) -> bool:
        return isinstance(plan, ParallelAggregatePlan)

    def step(self, plan: StreamPlan) -> int:
        assert isinstance(plan, ParallelAggregatePlan)
        with self.transaction() as connection:
            # The stream's lock first: an ALTER's swap takes it too (server/alter.py), and
            # waits for the fold in flight while no new one starts.
            lock_reducer(connection, plan.name)
            if not self.plans.hold(connection, plan):
                return 0
            driver = connection.connection.driver_connection
            assert driver is not None
            params = {"min_rows": self.min_rows, "max_groups": self.batch}
            folded = int(driver.execute(plan.reduce_statement, params).rowcount)
            if folded:
                faults.reach("reduce_fold", [plan.name], rows=folded)
            if plan.joined is not None:
                self._keep_joined(driver, plan, plan.joined)
            return folded

    def _keep_joined(
        self, driver: psycopg.Connection[Any], plan: ParallelAggregatePlan, joined: JoinedRows
    ) -> None:
        """Write the stream's joined rows anew if a table changed since they were written
        (or they never were), in the fold's transaction."""
        row = driver.execute(joined.current_query).fetchone()
        if row is None or row[0] or plan.name in self._unwatched:
            return
        try:
            watch(driver, plan.name, plan.tables)
        except NoFeed as refused:
            self._unwatched.add(plan.name)  # until the server starts again
            log.info("%s: joined with tables on read at every read: %s", plan.name, refused)
            return
        driver.execute(joined.refresh_statement)
        faults.reach("join_refresh", [plan.name], tables=plan.tables)
        row = driver.execute(joined.current_query).fetchone()
        if row is None or not row[0]:  # a trigger there but disabled: left as it is
            self._unwatched.add(plan.name)
            log.info(
                "%s: joined with tables on read at every read: a trigger is disabled", plan.name
            )
