"""Spark's warm-up after a start: synthetic batches through the ingest path's Spark jobs,
run while no run waits, so that the JVM has compiled its hot code before runs need it.

A freshly started JVM interprets Spark's code and compiles the hot parts over its first
few dozen batches: on a 2-core machine the first 50,000-row batches of three streams took
about twice as long as the fortieth, and the first one ten times as long. The warm-up
spends that time while the server is idle instead. Its batches are those of a synthetic
raw stream (text key, integer, double, numeric, event time) with streams of the usual
kinds - count, sum, average, minimum, maximum and count(DISTINCT) over tumbling windows,
and an hourly roll-up - alternately all together (one partition, jobs side by side) and
one alone (Spark's parallel plan, with a shuffle), as the pipeline reads them.

The warm-up gives way to ingest: it starts a batch only while the pipeline has no run
being received, queued, computed or committed, so a run waits at most for the one
warm-up batch in flight. Nothing of it is written to PostgreSQL; its Spark session and
temporary views are its own (SparkBackend gives each thread a session). A failure ends the
warm-up with a warning; the server is unaffected. ``STRATA_SPARK_WARMUP`` says how many
batches (0: none).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from prometheus_client import Gauge

from rewriter import rewrite
from rewriter.naming import RUN_COLUMN
from rewriter.plan import ParallelAggregatePlan, StreamPlan
from server.catalog import ComputedPlan
from server.engines.backend import SparkBackend, SparkStopped
from server.workers.loop import Background

WARMUP_ROWS = 50_000
WARMUP_KEYS = 200
# How long the warm-up waits, between checks, for the pipeline to become idle.
IDLE_POLL = 0.05

RAW = "warmup"  # never in the catalog: its temporary views are the warm-up session's
STREAMS = (
    f"CREATE STREAM {RAW} (k text, n bigint, x double precision, v numeric(12,4), "
    "t timestamptz) WITH (event_time = 't')",
    f"CREATE STREAM {RAW}_1m AS SELECT k, count(*) AS c, sum(v) AS sv, sum(n) AS sn, "
    f"window_end AS t FROM TUMBLE({RAW}, t, INTERVAL '1 minute') GROUP BY k, window_end",
    f"CREATE STREAM {RAW}_5m AS SELECT k, avg(x) AS ax, max(v) AS mv, min(n) AS mn, "
    f"count(DISTINCT n) AS dn, window_end AS t "
    f"FROM TUMBLE({RAW}, t, INTERVAL '5 minutes') GROUP BY k, window_end",
    f"CREATE STREAM {RAW}_1h AS SELECT k, sum(c) AS c, sum(sv) AS sv, window_end AS t "
    f"FROM TUMBLE({RAW}_1m, t, INTERVAL '1 hour') GROUP BY k, window_end",
)


def warmup_plans() -> list[ComputedPlan]:
    """The derived streams of the synthetic raw stream, in creation order."""
    plans: dict[str, StreamPlan] = {}
    for statement in STREAMS:
        plan = rewrite(statement, plans)
        plans[plan.name] = plan
    derived: list[ComputedPlan] = [
        p for p in plans.values() if isinstance(p, ParallelAggregatePlan)
    ]
    assert len(derived) == len(STREAMS) - 1, "every warm-up stream is a parallel aggregate"
    return derived


def warmup_rows(rows: int = WARMUP_ROWS, seed: int = 7) -> pa.Table:
    """One run of the synthetic raw stream: ``rows`` rows over one day, with its run
    column."""
    rng = random.Random(seed)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    return pa.table(
        {
            "k": [f"key_{rng.randrange(WARMUP_KEYS)}" for _ in range(rows)],
            "n": pa.array([rng.randrange(1_000_000) for _ in range(rows)], pa.int64()),
            "x": pa.array([rng.random() for _ in range(rows)], pa.float64()),
            "v": pa.array(
                [Decimal(rng.randrange(1_000_000)).scaleb(-4) for _ in range(rows)],
                pa.decimal128(12, 4),
            ),
            "t": pa.array(
                [start + timedelta(seconds=86_400 * i / rows) for i in range(rows)],
                pa.timestamp("us", tz="UTC"),
            ),
            RUN_COLUMN: pa.array([1] * rows, pa.int64()),
        }
    )


class Warmup(Background):
    """Runs ``batches`` synthetic batches through ``backend`` in a thread of its own,
    each while ``idle()`` holds; ``left`` (and the gauge, when given) says how many are
    still to run."""

    name = "warmup"

    def __init__(
        self,
        backend: SparkBackend,
        scratch: Path,
        *,
        batches: int,
        idle: Callable[[], bool],
        gauge: Gauge | None = None,
    ) -> None:
        self.backend = backend
        self.scratch = scratch
        self.batches = batches
        self.idle = idle
        self.gauge = gauge
        self.left = batches
        super().__init__()
        self._show()

    def start(self) -> None:
        if self.batches > 0:
            super().start()

    def _loop(self) -> None:
        path = self.scratch / "warmup.parquet"
        try:
            plans = warmup_plans()
            rows = warmup_rows()
            self.scratch.mkdir(parents=True, exist_ok=True)
            pq.write_table(rows, path, compression="none")
            for batch in range(self.batches):
                if not self._wait_idle():
                    return
                # Alternately every stream (one partition, jobs side by side) and the
                # count(DISTINCT) stream alone (Spark's parallel plan).
                chosen = plans if batch % 2 == 0 else [plans[1]]
                self.backend.partials(rows, chosen, source=RAW, files=[str(path)])
                self.left -= 1
                self._show()
            # The warm-up grew the JVM's heap; a full collection gives the memory back.
            self.backend.collect_garbage()
            self.log.info("Spark warmed up (%d batches)", self.batches)
        except SparkStopped:
            pass
        except Exception as error:  # the server runs on; its first runs are slower
            if not self._stopping.is_set():
                self.log.warning("Spark's warm-up ended early: %s", error)
        finally:
            self.left = 0
            self._show()
            path.unlink(missing_ok=True)

    def _wait_idle(self) -> bool:
        """Wait until the pipeline is idle; False when stopping."""
        while not self._stopping.is_set():
            if self.idle():
                return True
            self._stopping.wait(IDLE_POLL)
        return False

    def _show(self) -> None:
        if self.gauge is not None:
            self.gauge.set(self.left)
