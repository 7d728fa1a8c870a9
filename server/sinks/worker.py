"""The sink worker: every pass, each sink due delivers what its stream's feed holds after
the position it delivered last, batch by batch (server/sinks/postgres.py, webhook.py and kafka.py
say how each connector keeps exactly once).

A sink that fails (its target down, refusing, too slow) is logged, noted in the catalog
(state ``retrying``, its error, its failures in a row) and tried again after a backoff
that doubles up to STRATA_SINK_BACKOFF_MAX; the other sinks go on. Ingest never waits for a
sink: the feed keeps the changes (STRATA_FEED_RETENTION) and the sink catches up later.
"""

from __future__ import annotations

import time
from dataclasses import replace

import sqlalchemy as sa

from rewriter.plan import StreamPlan
from server import faults
from server.catalog import PlanCache
from server.metrics import Metrics
from server.settings import DEFAULTS
from server.sinks.kafka import KafkaDeliveryFailed, KafkaTarget
from server.sinks.postgres import PostgresTarget, TargetProblem
from server.sinks.source import SinkBroken
from server.sinks.store import Sink, load_sinks, record_delivered, record_failed
from server.sinks.webhook import DeliveryRefused, WebhookTarget
from server.workers.loop import Worker

Target = PostgresTarget | WebhookTarget | KafkaTarget
TARGETS: dict[str, type[PostgresTarget] | type[WebhookTarget] | type[KafkaTarget]] = {
    "postgres": PostgresTarget,
    "webhook": WebhookTarget,
    "kafka": KafkaTarget,
}
# The first retry's delay, in seconds; each failure in a row doubles it, up to the setting.
FIRST_BACKOFF = 0.5
# Most batches one sink delivers in one step, so that a pass visits every sink in turn.
BATCHES_PER_STEP = 10
_OWN_ERRORS = (SinkBroken, TargetProblem, DeliveryRefused, KafkaDeliveryFailed)


class SinkWorker(Worker):
    name = "sink"

    def __init__(
        self,
        engine: sa.Engine,
        plans: PlanCache,
        *,
        interval: float = DEFAULTS.sink_interval,
        batch: int = DEFAULTS.sink_batch,
        timeout: float = DEFAULTS.sink_timeout,
        backoff_max: float = DEFAULTS.sink_backoff_max,
        metrics: Metrics | None = None,
    ) -> None:
        super().__init__(engine, plans, interval=interval, batch=batch, metrics=metrics)
        self.timeout = timeout
        self.backoff_max = backoff_max
        self._targets: dict[str, Target] = {}
        self._due: dict[str, list[Sink]] = {}  # by stream, for this pass
        self._retry_at: dict[str, float] = {}  # by sink: no attempt before (monotonic)

    def run_once(self) -> dict[str, int]:
        with self.engine.connect() as connection:
            found = load_sinks(connection)
        for sink in found:  # a sink dropped and created again is another sink
            held = self._targets.get(sink.name)
            if held is not None and _definition(held.sink) != _definition(sink):
                self._forget(sink.name)
        for name in set(self._targets) - {s.name for s in found}:
            self._forget(name)
        self._due = {}
        for sink in found:
            self._due.setdefault(sink.stream, []).append(sink)
        return super().run_once()

    def applies_to(self, plan: StreamPlan) -> bool:
        return plan.name in self._due

    def step(self, plan: StreamPlan) -> int:
        delivered = 0
        for index, sink in enumerate(self._due.get(plan.name, [])):
            for _ in range(BATCHES_PER_STEP):
                if self._stopping.is_set() or self._retry_at.get(sink.name, 0) > time.monotonic():
                    break
                sink, count = self._deliver(sink)
                self._due[plan.name][index] = sink
                delivered += count
                if count < sink.batch_size(self.batch):
                    break
        return delivered

    def _deliver(self, sink: Sink) -> tuple[Sink, int]:
        """One batch of ``sink``; the sink as it is after, and the changes delivered."""
        target = self._targets.get(sink.name)
        if target is None:
            target = self._targets[sink.name] = TARGETS[sink.connector](sink, self.timeout)
        try:
            position, count = target.deliver(
                self.engine, self.plans, sink.batch_size(self.batch), sink.position
            )
        except SinkBroken as error:
            return self._failed_with(sink, "broken", str(error)), 0
        except Exception as error:  # its target's trouble: this sink waits, the others go on
            return self._failed_with(sink, "retrying", _reason(error)), 0
        self._retry_at.pop(sink.name, None)
        if count:
            faults.reach("sink_delivered", [sink.name], changes=count, position=position)
        if count or sink.state != "running" or sink.position != position:
            with self.engine.begin() as connection:
                record_delivered(connection, sink.name, position, moved=count > 0)
        return replace(sink, position=position, state="running", error=None, failures=0), count

    def _failed_with(self, sink: Sink, state: str, error: str) -> Sink:
        failures = sink.failures + 1
        # Doubling, capped (the exponent too: days of failures must not overflow a float).
        doubled = FIRST_BACKOFF * 2 ** min(failures - 1, 32)
        delay = self.backoff_max if state == "broken" else doubled
        self._retry_at[sink.name] = time.monotonic() + min(delay, self.backoff_max)
        self.log.warning("sink %s (%s): %s", sink.name, state, error)
        self._failed()
        with self.engine.begin() as connection:
            record_failed(connection, sink.name, state=state, error=error, failures=failures)
        return replace(sink, state=state, error=error, failures=failures)

    def _forget(self, name: str) -> None:
        self._targets.pop(name).close()
        self._retry_at.pop(name, None)

    def _loop(self) -> None:
        try:
            super()._loop()
        finally:
            for name in list(self._targets):
                self._forget(name)


def _definition(sink: Sink) -> tuple[object, ...]:
    return (sink.stream, sink.connector, sorted(sink.options.items()), sink.created_at)


def _reason(error: Exception) -> str:
    """What a sink's error says: our own messages as they are, others' first line with
    their kind ("OperationalError: connection refused")."""
    lines = str(error).strip().splitlines()
    if isinstance(error, _OWN_ERRORS):
        return " ".join(line.strip() for line in lines)
    return f"{type(error).__name__}: {lines[0] if lines else 'no message'}"
