"""The Kafka sink: a stream's changes as keyed messages in a Kafka topic.

Each change is one message: its key the row's key (the JSON of the view's window and group
columns, the same bytes every time, so that a compacted topic keeps the latest change of
each row), its value the change as the change feed gives it (position, op, key, old, new,
late, lateness_seconds, revision, cause, ...), its headers ``strata-position`` and
``strata-sink``. A delete is a message with op ``delete``, not a tombstone: it carries its
position, which a consumer compares (below). The first batch is the snapshot: the view's
rows as inserts at the position they are current at (cause ``snapshot``).

Where a sink stands is kept in Kafka: after the brokers acknowledged every message of a
batch (``acks=all``, an idempotent producer: a producer's retries neither repeat nor
reorder), the sink writes a **progress record** (key: the sink's name; value: its position
and the feed it counts in) to the compacted topic ``<topic>.strata-progress``, and waits
for it to be acknowledged too. A delivery resumes from the last progress record there
(read to the topic's end whenever the sink connects anew), not from this server's copy of
the position, which is for display. So the topic holds every change up to the progress
record's position, whatever dies when; what dies between a batch's messages and its
progress record (the brokers, Strata, the network) makes the next attempt send the batch
again from its first change: **at least once on the wire**. A consumer that keeps, per key,
the change with the highest position (and skips a change at or below the one it holds)
applies each change exactly once, in position order per key.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

from server import faults
from server.catalog import PlanCache
from server.sinks.source import Batch, feed_of, read_batch
from server.sinks.store import Sink

log = logging.getLogger("strata.sink.kafka")
PROGRESS_SUFFIX = ".strata-progress"
# Both topics, when the sink makes them: one partition (a topic in position order),
# compacted (the latest message of each key is kept: a row's latest change, a sink's
# latest progress). A topic that exists is used as it is.
NEW_TOPIC_CONFIG = {"cleanup.policy": "compact"}


class KafkaDeliveryFailed(Exception):
    """The brokers did not acknowledge a batch or its progress record (in time)."""


@dataclass(frozen=True)
class Progress:
    """A sink's last progress record: everything up to ``position`` of ``feed`` is in the
    topic."""

    position: int
    feed: str


class _Acknowledgements:
    """What the brokers answered for the messages of one flush."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.failed: list[str] = []

    def __call__(self, error: KafkaError | None, _message: Message) -> None:
        if error is not None:
            with self.lock:
                self.failed.append(error.str())


class KafkaTarget:
    """One Kafka sink's producer, and the progress it resumes from."""

    def __init__(self, sink: Sink, timeout: float) -> None:
        self.sink = sink
        self.timeout = timeout
        self.topic = sink.options["topic"]
        self.progress_topic = self.topic + PROGRESS_SUFFIX
        self._producer: Producer | None = None
        # The progress record read when this producer connected, then the ones it wrote;
        # None until read (and after any failure: it is read from Kafka again).
        self._progress: Progress | None = None
        self._resumed = False

    def close(self) -> None:
        producer, self._producer = self._producer, None
        self._progress, self._resumed = None, False
        if producer is not None:
            # Messages not acknowledged are given up: the next producer sends the batch
            # again from the progress record.
            producer.purge(in_queue=True, in_flight=True, blocking=False)
            producer.close()

    def deliver(
        self, engine: sa.Engine, plans: PlanCache, limit: int, after: int | None = None
    ) -> tuple[int, int]:
        """Deliver the next batch (or nothing); (the position delivered up to, changes).
        ``after``, this server's copy of the position, is not used: Kafka's counts."""
        try:
            return self._deliver(engine, plans, limit)
        except BaseException:
            self.close()  # a batch cut short: connect anew, resume from the progress record
            raise

    def _deliver(self, engine: sa.Engine, plans: PlanCache, limit: int) -> tuple[int, int]:
        producer = self._connect()
        name, stream = self.sink.name, self.sink.stream
        if not self._resumed:
            self._progress = self._read_progress()
            self._resumed = True
        progress = self._progress
        # A position of another feed (the stream's of another Strata, say) means nothing
        # here: start again from a snapshot.
        after = None
        if progress is not None and progress.feed == feed_of(engine, stream):
            after = progress.position
        batch = read_batch(engine, plans, stream, after, limit)
        if batch.empty:
            return (after if after is not None else batch.position), 0
        faults.reach("sink_produce", [name], changes=len(batch.changes), position=batch.position)
        acknowledged = _Acknowledgements()
        for change in batch.changes:
            key = change.fields[1]
            assert key is not None, "every change of a followed stream has its key"
            headers: list[tuple[str, str | bytes | None]] = [
                ("strata-position", str(change.position)),
                ("strata-sink", name),
            ]
            while True:
                try:
                    producer.produce(
                        self.topic,
                        key=key.encode(),
                        value=change.data.encode(),
                        headers=headers,
                        on_delivery=acknowledged,
                    )
                    break
                except BufferError:
                    # The producer's queue is full (a snapshot larger than it): wait for
                    # acknowledgements (or time-outs) to make room.
                    producer.poll(0.1)
        self._flush(producer, acknowledged, f"the batch up to position {batch.position}")
        # Every message of the batch is acknowledged: only now may the progress say so.
        faults.reach("sink_progress", [name], changes=len(batch.changes), position=batch.position)
        self._write_progress(producer, batch)
        self._progress = Progress(batch.position, batch.feed)
        return batch.position, len(batch.changes)

    def _connect(self) -> Producer:
        if self._producer is None:
            self._producer = Producer(
                {
                    **self._client_config(),
                    "enable.idempotence": True,
                    "acks": "all",
                    "linger.ms": 5,
                    # A batch not acknowledged by then fails; the next attempt sends it again.
                    "message.timeout.ms": max(1000, round(self.timeout * 1000)),
                }
            )
            self._ensure_topics(self._producer)
        return self._producer

    def _client_config(self) -> dict[str, Any]:
        timeout_ms = max(1000, round(self.timeout * 1000))
        return {
            "bootstrap.servers": self.sink.options["brokers"],
            "client.id": f"strata-sink-{self.sink.name}",
            "socket.connection.setup.timeout.ms": timeout_ms,
            "socket.timeout.ms": timeout_ms,
            # librdkafka's own log (a broker that refuses connections, ...) to ours, not
            # to stderr: the sink's error says what failed.
            "logger": log,
        }

    def _ensure_topics(self, producer: Producer) -> None:
        """Create the topic and its progress topic where they are missing."""
        found = producer.list_topics(timeout=self.timeout).topics
        missing = [
            NewTopic(topic, num_partitions=1, config=NEW_TOPIC_CONFIG)
            for topic in (self.topic, self.progress_topic)
            if topic not in found or found[topic].error is not None
        ]
        if not missing:
            return
        admin = AdminClient(self._client_config())
        for future in admin.create_topics(missing, request_timeout=self.timeout).values():
            try:
                future.result(self.timeout)
            except KafkaException as error:
                if error.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise

    def _read_progress(self) -> Progress | None:
        """The sink's last progress record in ``<topic>.strata-progress``, read to its end
        (a tombstone for the sink's key forgets it: the sink starts from a snapshot).

        A broker that answers but gives nothing more for ``timeout`` seconds before the end
        it announced (Tansu, killed, can leave its high watermark one past a record it never
        stored) ends the reading there: a progress record missed can only make the sink
        resume from an earlier one and send batches again, never skip one."""
        consumer = Consumer(
            {
                **self._client_config(),
                "group.id": f"strata-sink-{self.sink.name}",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",
            }
        )
        try:
            metadata = consumer.list_topics(self.progress_topic, timeout=self.timeout)
            partitions = list(metadata.topics[self.progress_topic].partitions)
            consumer.assign(
                [TopicPartition(self.progress_topic, p, OFFSET_BEGINNING) for p in partitions]
            )
            pending, found = set(partitions), None
            while pending:
                message = consumer.poll(self.timeout)
                if message is None:
                    unanswered = [
                        p
                        for p in pending
                        if consumer.get_watermark_offsets(
                            TopicPartition(self.progress_topic, p), cached=True
                        )[1]
                        < 0
                    ]
                    if unanswered:
                        raise KafkaDeliveryFailed(
                            f"the progress topic {self.progress_topic} was not read within "
                            f"{self.timeout:g} s"
                        )
                    log.warning(
                        "sink %s: %s gave nothing more before its end for %g s; resuming "
                        "from the last progress record read (%s)",
                        self.sink.name,
                        self.progress_topic,
                        self.timeout,
                        found,
                    )
                    break
                error = message.error()
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        raise KafkaException(error)
                    pending.discard(message.partition())
                    continue
                if message.key() != self.sink.name.encode():
                    continue
                value = message.value()
                if value is None:
                    found = None
                    continue
                record = json.loads(value)
                found = Progress(int(record["position"]), str(record["feed"]))
            return found
        finally:
            consumer.close()

    def _write_progress(self, producer: Producer, batch: Batch) -> None:
        acknowledged = _Acknowledgements()
        record = {
            "sink": self.sink.name,
            "stream": batch.stream,
            "feed": batch.feed,
            "position": batch.position,
        }
        producer.produce(
            self.progress_topic,
            key=self.sink.name.encode(),
            value=json.dumps(record).encode(),
            on_delivery=acknowledged,
        )
        self._flush(producer, acknowledged, f"the progress record of position {batch.position}")

    def _flush(self, producer: Producer, acknowledged: _Acknowledgements, what: str) -> None:
        """Wait until the brokers acknowledged every message produced; KafkaDeliveryFailed
        if one failed or they did not answer in time."""
        left = producer.flush(self.timeout + 1)
        with acknowledged.lock:
            failed = list(acknowledged.failed)
        if failed or left:
            reason = failed[0] if failed else f"no acknowledgement within {self.timeout:g} s"
            raise KafkaDeliveryFailed(f"the brokers did not take {what}: {reason}")
