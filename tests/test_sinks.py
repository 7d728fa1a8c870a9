"""Sinks (CREATE SINK): a second, real PostgreSQL and a real receiving HTTP server, each killed
with -9 during a delivery and started again, while shuffled, hours-late runs commit; at the
end the target table is the view (and the view its batch query over the raw rows), the
receiver holds the view's rows, and every position was applied once: the receiver's ledger
has each change once and in order, and the target's position moved from batch to batch
without a repeat or a gap. Refusals name what they refuse."""

from __future__ import annotations

import itertools
import json
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rewriter.errors import InvalidSQL
from server import faults
from server.engines.embedded_pg import EmbeddedPostgres
from server.net import free_port
from server.sinks.statement import CreateSink, DropSink, is_sink_statement, parse_sink
from server.sinks.worker import SinkWorker
from server.workers.serial import Materializer, Repairer
from tests.conftest import Strata, examples
from tests.oracle import execute
from tests.test_feed import PER_MINUTE, RAW, TOP_PER_5, latest, run_body, view_rows

ROOT = Path(__file__).resolve().parent.parent
NAMES = itertools.count()
# The batch query of PER_MINUTE over the raw rows, in plain PostgreSQL.
ORACLE = (
    "SELECT k, count(*)::bigint AS c, sum(v) AS s, "
    "date_bin('1 minute', t, timestamptz 'epoch') + interval '1 minute' AS w "
    "FROM {ev} GROUP BY k, w"
)
# A ledger of the target's positions, made before the sink makes its table: each batch
# committed in the target moves its sink's position from "before" to "after".
POSITION_LEDGER = """
CREATE TABLE IF NOT EXISTS strata_sink_positions (sink text PRIMARY KEY, stream text NOT NULL,
  feed text, position bigint, updated_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE IF NOT EXISTS position_ledger (id bigserial PRIMARY KEY, sink text,
  before bigint, after bigint, txid bigint NOT NULL DEFAULT txid_current());
CREATE OR REPLACE FUNCTION note_position() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.position IS DISTINCT FROM OLD.position THEN
    INSERT INTO position_ledger (sink, before, after) VALUES (NEW.sink, OLD.position, NEW.position);
  END IF;
  RETURN NEW;
END $$;
CREATE OR REPLACE TRIGGER note_position AFTER UPDATE ON strata_sink_positions
  FOR EACH ROW EXECUTE FUNCTION note_position();
CREATE TABLE IF NOT EXISTS write_ledger (tbl text, txid bigint);
CREATE OR REPLACE FUNCTION note_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO write_ledger VALUES (TG_TABLE_NAME, txid_current());
  RETURN NULL;
END $$;
"""
# Every transaction that writes a watched table is noted (write_ledger).
WATCH = (
    "CREATE OR REPLACE TRIGGER note_write AFTER INSERT OR UPDATE OR DELETE ON {table} "
    "FOR EACH STATEMENT EXECUTE FUNCTION note_write()"
)


# ---- the other end: a PostgreSQL and a receiver, each a process of its own -------------


class Target:
    """A second embedded PostgreSQL, which a test kills with -9 and starts again (on the
    same port: the sink's URL stays right)."""

    def __init__(self, directory: Path) -> None:
        self.pg = EmbeddedPostgres(directory)
        self.url = self.pg.start()
        with psycopg.connect(self.url, autocommit=True) as connection:
            connection.execute(POSITION_LEDGER)

    def execute(self, statement: str) -> None:
        with psycopg.connect(self.url, autocommit=True) as connection:
            connection.execute(statement)  # type: ignore[arg-type]

    def watch(self, table: str) -> None:
        """Note every transaction that writes ``table`` from now on."""
        self.execute(WATCH.format(table=table))

    def kill(self) -> None:
        pid = self.pg.pid
        assert pid is not None
        faults.kill_tree(pid)

    def revive(self) -> None:
        assert self.pg.revive(), "the target was not down"

    def rows(self, table: str) -> list[tuple]:
        with psycopg.connect(self.url) as connection:
            return sorted(connection.execute(f"SELECT * FROM {table}").fetchall(), key=str)

    def positions(self, sink: str) -> list[tuple[int | None, int, int]]:
        with psycopg.connect(self.url) as connection:
            return connection.execute(  # type: ignore[return-value]
                "SELECT before, after, txid FROM position_ledger WHERE sink = %s ORDER BY id",
                (sink,),
            ).fetchall()

    def writers(self, table: str) -> set[int]:
        """The transactions that wrote ``table`` since it was watched."""
        with psycopg.connect(self.url) as connection:
            found = connection.execute("SELECT txid FROM write_ledger WHERE tbl = %s", (table,))
            return {row[0] for row in found}

    def stop(self) -> None:
        self.pg.stop()


class Receiver:
    """tests/sink_receiver.py as a process, killed with -9 and started again on its port."""

    def __init__(self, directory: Path, *, reply_delay: float = 0.0, fail_every: int = 0) -> None:
        self.port = free_port()
        directory.mkdir(parents=True, exist_ok=True)
        self.database = directory / "receiver.sqlite"
        self.options = ["--reply-delay", str(reply_delay), "--fail-every", str(fail_every)]
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/changes"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.sink_receiver", str(self.port), str(self.database)]
            + self.options,
            cwd=ROOT,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{self.port}/", timeout=1)
                return
            except httpx.TransportError:
                assert time.monotonic() < deadline and self.process.poll() is None
                time.sleep(0.05)

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait(10)

    def log(self) -> list[str]:
        path = Path(f"{self.database}.log")
        return path.read_text().splitlines() if path.exists() else []

    def query(self, statement: str, *params: object) -> list[tuple]:
        connection = sqlite3.connect(self.database)
        try:
            return connection.execute(statement, params).fetchall()
        finally:
            connection.close()

    def rows(self, sink: str) -> dict[str, Any]:
        found = self.query("SELECT key, row FROM rows WHERE sink = ?", sink)
        return {key: json.loads(row, parse_float=Decimal) for key, row in found}

    def ledger(self, sink: str) -> list[tuple[str, int]]:
        return self.query(  # type: ignore[return-value]
            "SELECT kind, position FROM ledger WHERE sink = ? ORDER BY rowid", sink
        )

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.kill()


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    instance = Target(tmp_path_factory.mktemp("target"))
    try:
        yield instance
    finally:
        instance.stop()


@pytest.fixture(scope="module")
def receiver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Receiver]:
    # Each answer comes a third of a second after the batch is applied (a kill then is the
    # worst moment: applied, not acknowledged), and every 7th request fails with 503.
    instance = Receiver(tmp_path_factory.mktemp("receiver"), reply_delay=0.3, fail_every=7)
    try:
        yield instance
    finally:
        instance.close()


# ---- helpers ----------------------------------------------------------------------------


def table_rows(strata: Strata, view: str) -> list[tuple]:
    return sorted(strata.query(f"SELECT * FROM {view}"), key=str)


def sink_state(strata: Strata, stream: str) -> dict[str, dict[str, Any]]:
    response = strata.client.get(f"/streams/{stream}")
    assert response.status_code == 200, response.text
    return {s["name"]: s for s in response.json()["sinks"]}


def catch_up(strata: Strata, worker: SinkWorker, stream: str, timeout: float = 120) -> None:
    """Run the sink worker until every sink of ``stream`` has delivered the latest change."""
    deadline = time.monotonic() + timeout
    while True:
        worker.run_once()
        shown = sink_state(strata, stream)
        position = latest(strata.database_url, stream)
        if all(s["position"] == position and s["state"] == "running" for s in shown.values()):
            assert all(s["lag"] == 0 for s in shown.values()), shown
            return
        assert time.monotonic() < deadline, f"sinks of {stream} not caught up: {shown}"
        time.sleep(0.2)


class Passes:
    """The worker's passes, one after another in a thread, until stopped (a test strikes
    while one delivers)."""

    def __init__(self, worker: SinkWorker) -> None:
        self.worker = worker
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping.is_set():
            self.worker.run_once()
            time.sleep(0.05)

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(60)
        assert not self.thread.is_alive(), "a pass of the sink worker hangs"


def kill_target_mid_transaction(target: Target, worker: SinkWorker, table: str) -> None:
    """Hold the target table locked, let the worker deliver until a sink's transaction
    waits on it (its position row locked, its batch read from the feed), then kill -9 the
    target's PostgreSQL, and start it again."""
    blocker = psycopg.connect(target.url)
    blocker.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
    passes = Passes(worker)
    deadline = time.monotonic() + 60
    with psycopg.connect(target.url, autocommit=True) as watcher:
        while not watcher.execute(
            "SELECT 1 FROM pg_stat_activity WHERE application_name LIKE 'strata sink %%' "
            "AND xact_start IS NOT NULL AND wait_event_type = 'Lock'"
        ).fetchone():
            assert time.monotonic() < deadline, "no sink's transaction waited on the table"
            time.sleep(0.02)
    target.kill()
    passes.stop()
    blocker.close()
    target.revive()


def kill_receiver_mid_request(receiver: Receiver, worker: SinkWorker) -> None:
    """Let the worker deliver until the receiver has applied a batch and not answered it,
    then kill -9 the receiver, and start it again."""
    seen = len(receiver.log())
    passes = Passes(worker)
    deadline = time.monotonic() + 60
    while not receiver.log()[seen:] or not receiver.log()[-1].startswith("applied "):
        assert time.monotonic() < deadline, "the receiver applied no batch"
        time.sleep(0.01)
    receiver.kill()
    assert receiver.log()[-1].startswith("applied "), "killed after its answer"
    passes.stop()
    receiver.start()


def assert_ledger(receiver: Receiver, sink: str, last: int) -> None:
    """Every change after the (last) snapshot, once each and in order, up to ``last``."""
    entries = receiver.ledger(sink)
    assert not [e for e in entries if e[0] == "gap"], entries
    snapshots = [i for i, e in enumerate(entries) if e[0] == "snapshot"]
    assert snapshots, entries
    start = entries[snapshots[-1]][1]
    changes = [p for kind, p in entries[snapshots[-1] :] if kind == "change"]
    assert changes == list(range(start + 1, last + 1)), entries
    before = [p for kind, p in entries[: snapshots[-1]] if kind == "change"]
    assert not before, "a snapshot was sent again after changes were acknowledged"


def assert_chain(target: Target, sink: str, table: str, last: int) -> None:
    """The target's position moved batch by batch: from nothing (the snapshot) to the
    latest, each batch's start where the last one ended: none applied twice, none skipped;
    and every transaction that wrote the sink's table since it was watched moved the
    position too: no rows without their position."""
    moves = target.positions(sink)
    assert moves and moves[0][0] is None, moves
    for (_, end, _), (start, _, _) in itertools.pairwise(moves):
        assert start == end, moves
    assert moves[-1][1] == last, moves
    alone = target.writers(table) - {txid for _, _, txid in moves}
    assert not alone, f"transactions wrote {table} without moving the position: {alone}"


# ---- the property -----------------------------------------------------------------------

RUN = st.lists(
    st.tuples(
        st.sampled_from("abcd"),
        st.integers(0, 9),
        st.integers(0, 8 * 3600),  # eight hours: a run sent after a later one is hours late
    ),
    min_size=1,
    max_size=6,
)
STEP = st.one_of(
    RUN,
    st.sampled_from(["deliver", "kill target", "kill receiver", "repair"]),
)


@settings(
    max_examples=examples(1),  # 30 s or so each: the nightly profile draws ten
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    steps=st.lists(STEP, min_size=3, max_size=10),
    first=RUN,
    kills=st.tuples(st.integers(0, 10), st.integers(0, 10)),
)
def test_sinks_deliver_every_change_once_through_kills(
    module_strata: Strata,
    target: Target,
    receiver: Receiver,
    steps: list[Any],
    first: list[tuple[str, int, int]],
    kills: tuple[int, int],
) -> None:
    strata = module_strata
    # Every example kills each end at least once, wherever the draw puts it.
    steps = list(steps)
    steps.insert(kills[0], "kill target")
    steps.insert(kills[1], "kill receiver")
    n = next(NAMES)
    ev, agg, top = f"ev_s{n}", f"agg_s{n}", f"top_s{n}"
    strata.create(RAW.format(ev=ev))
    strata.create(PER_MINUTE.format(agg=agg, ev=ev))
    strata.create(TOP_PER_5.format(top=top, agg=agg))
    strata.ingest(ev, run_body(first), run_id=f"{ev}-first")  # before the sinks: a snapshot
    sinks = {
        f"pg_{agg}": (agg, "postgres", f"table = 'counts_{n}'"),
        f"pg_{top}": (top, "postgres", f"table = 'tops_{n}', batch_size = 2"),
        f"hook_{agg}": (agg, "webhook", "batch_size = 3"),
    }
    for name, (stream, connector, options) in sinks.items():
        url = receiver.url if connector == "webhook" else target.url
        created = strata.client.post(
            "/streams",
            json={
                "sql": f"CREATE SINK {name} FROM {stream} WITH (connector = '{connector}', "
                f"url = '{url}', {options})"
            },
        )
        assert created.status_code == 201, created.text
        assert created.json()["state"] == "starting" and created.json()["position"] is None
        assert "***" in created.json()["target"] or connector == "webhook"
    engine, plans = strata.service.engine, strata.service.plans
    worker = SinkWorker(engine, plans, batch=4, timeout=5, backoff_max=0.5)
    materializer, repairer = Materializer(engine, plans), Repairer(engine, plans)
    worker.run_once()
    target.watch(f"counts_{n}")
    target.watch(f"tops_{n}")
    for i, step in enumerate(steps):
        if isinstance(step, list):
            strata.ingest(ev, run_body(step), run_id=f"{ev}-{i}")
        elif step == "deliver":
            worker.run_once()
        elif step == "repair":
            materializer.run_once()
            repairer.run_once()
        elif step == "kill target":
            strata.ingest(ev, run_body([("a", 1, 7 * 3600)]), run_id=f"{ev}-{i}")
            kill_target_mid_transaction(target, worker, f"counts_{n}")
        else:
            strata.ingest(ev, run_body([("b", 2, 60)]), run_id=f"{ev}-{i}")  # hours late
            kill_receiver_mid_request(receiver, worker)
    materializer.run_once()
    repairer.run_once()
    catch_up(strata, worker, agg)
    catch_up(strata, worker, top)

    # The target tables are the views, and the view is its batch query over the raw rows.
    assert target.rows(f"counts_{n}") == table_rows(strata, agg)
    assert table_rows(strata, agg) == sorted(strata.query(ORACLE.format(ev=ev)), key=str)
    assert target.rows(f"tops_{n}") == table_rows(strata, top)
    assert receiver.rows(f"hook_{agg}") == view_rows(strata.database_url, agg, ("w", "k"))
    for name, (stream, connector, _) in sinks.items():
        last = latest(strata.database_url, stream)
        if connector == "webhook":
            assert_ledger(receiver, name, last)
        else:
            assert_chain(target, name, f"{'counts' if stream == agg else 'tops'}_{n}", last)
    for name in sinks:
        assert strata.client.post("/streams", json={"sql": f"DROP SINK {name}"}).json() == {
            "dropped": True
        }


# ---- the rest -----------------------------------------------------------------------------


def test_a_postgres_sink_follows_a_stream_joining_a_table(
    module_strata: Strata, target: Target
) -> None:
    """A stream joining the user's table on read: its sink's table is the view, and the
    batch query of plain PostgreSQL over the raw rows and the table, after runs and after
    the table changes (keyed by the owner the table gives); one that hides that key is
    refused."""
    strata = module_strata
    n = next(NAMES)
    ev, dim, agg = f"ev_t{n}", f"dim_t{n}", f"owners_t{n}"
    strata.create(RAW.format(ev=ev))
    execute(strata, f"CREATE TABLE {dim} (k text PRIMARY KEY, owner text)")
    execute(strata, f"INSERT INTO {dim} VALUES ('a', 'o1'), ('b', 'o2'), ('c', 'o1')")
    joined = (
        f"FROM TUMBLE({ev}, t, INTERVAL '10 minutes') e JOIN {dim} d ON d.k = e.k "
        "GROUP BY d.owner, window_end"
    )
    strata.create(
        f"CREATE STREAM {agg} AS SELECT d.owner, count(*) AS c, sum(e.v) AS s, "
        f"window_end AS w {joined}"
    )
    strata.create(f"CREATE STREAM hidden_t{n} AS SELECT count(*) AS c, window_end AS w {joined}")
    oracle = (
        "SELECT d.owner, count(*)::bigint, sum(e.v), date_bin('10 minutes', e.t, "
        f"timestamptz 'epoch') + interval '10 minutes' FROM {ev} e JOIN {dim} d "
        "ON d.k = e.k GROUP BY 1, 4"
    )
    strata.ingest(ev, run_body([("a", 1, 60), ("b", 2, 60), ("c", 3, 4000)]), run_id=f"{ev}-0")
    created = strata.client.post(
        "/streams",
        json={
            "sql": f"CREATE SINK pg_{agg} FROM {agg} WITH (connector = 'postgres', "
            f"url = '{target.url}', table = 'owners_{n}')"
        },
    )
    assert created.status_code == 201, created.text
    hidden = strata.client.post(
        "/streams",
        json={
            "sql": f"CREATE SINK pg_hidden_t{n} FROM hidden_t{n} WITH (connector = 'postgres', "
            f"url = '{target.url}', table = 'hidden_{n}')"
        },
    )
    assert hidden.status_code == 400 and "every GROUP BY column" in hidden.text, hidden.text
    worker = SinkWorker(strata.service.engine, strata.service.plans, batch=4, timeout=5)
    catch_up(strata, worker, agg)
    assert target.rows(f"owners_{n}") == table_rows(strata, agg)
    for change in (
        f"UPDATE {dim} SET owner = 'o3' WHERE k = 'a'",
        f"DELETE FROM {dim} WHERE k = 'b'",
        f"INSERT INTO {dim} VALUES ('d', 'o2')",
    ):
        execute(strata, change)
        strata.ingest(ev, run_body([("d", 4, 90), ("a", 5, 30)]), run_id=f"{ev}-{change[:6]}")
        worker.run_once()
        catch_up(strata, worker, agg)
        assert target.rows(f"owners_{n}") == table_rows(strata, agg)
        assert table_rows(strata, agg) == sorted(strata.query(oracle), key=str)
    assert strata.client.post("/streams", json={"sql": f"DROP SINK pg_{agg}"}).status_code == 200


def test_refusals_name_what_they_refuse(module_strata: Strata, target: Target) -> None:
    strata = module_strata
    n = next(NAMES)
    ev, agg = f"ev_r{n}", f"agg_r{n}"
    strata.create(RAW.format(ev=ev))
    strata.create(PER_MINUTE.format(agg=agg, ev=ev))
    strata.create(
        f"CREATE STREAM hidden_r{n} AS SELECT count(*) AS c, window_end AS w "
        f"FROM TUMBLE({ev}, t, INTERVAL '1 minute') GROUP BY k, window_end"
    )
    url = target.url

    def refused(statement: str, status: int) -> str:
        response = strata.client.post("/streams", json={"sql": statement})
        assert response.status_code == status, response.text
        return str(response.json()["error"])

    base = f"CREATE SINK s_{n} FROM {agg} WITH "
    assert "connector 'smtp' is not supported; supported connectors: postgres, webhook" in (
        refused(base + f"(connector = 'smtp', url = '{url}')", 400)
    )
    assert "the kafka connector needs the option 'brokers'" in refused(
        base + "(connector = 'kafka')", 400
    )
    assert "option 'topic' is not an option of the webhook connector" in refused(
        base + "(connector = 'webhook', url = 'http://127.0.0.1:9/x', topic = 't')", 400
    )
    assert "the postgres connector needs the option 'table'" in refused(
        base + f"(connector = 'postgres', url = '{url}')", 400
    )
    assert "url must be a http or https:// URL" in refused(
        base + "(connector = 'webhook', url = 'ftp://example')", 400
    )
    assert "needs a connector option" in refused(base + "(url = 'http://127.0.0.1:9/')", 400)
    assert "option 'url' is given twice" in refused(
        base + "(connector = 'webhook', url = 'http://a/', url = 'http://b/')", 400
    )
    assert "batch_size must be a whole number" in refused(
        base + "(connector = 'webhook', url = 'http://a/', batch_size = 0)", 400
    )
    assert "stream 'nowhere' does not exist" in refused(
        f"CREATE SINK s_{n} FROM nowhere WITH (connector = 'webhook', url = 'http://a/')", 400
    )
    assert "aggregate streams" in refused(
        f"CREATE SINK s_{n} FROM {ev} WITH (connector = 'webhook', url = 'http://a/')", 400
    )
    assert "does not show every GROUP BY column" in refused(
        f"CREATE SINK s_{n} FROM hidden_r{n} WITH (connector = 'postgres', url = '{url}', "
        "table = 't')",
        400,
    )
    assert "needs FROM stream" in refused(f"CREATE SINK s_{n} {agg}", 400)
    assert refused(f"DROP SINK nothing_{n}", 404) == f"sink 'nothing_{n}' does not exist"
    hook = base + "(connector = 'webhook', url = 'http://127.0.0.1:9/')"
    assert strata.client.post("/streams", json={"sql": hook}).status_code == 201
    assert "already exists" in refused(hook, 409)
    exists = hook.replace("CREATE SINK", "CREATE SINK IF NOT EXISTS")
    assert strata.client.post("/streams", json={"sql": exists}).status_code == 200
    dropping = strata.client.delete(f"/streams/{agg}")
    assert dropping.status_code == 409, dropping.text
    assert f"delivered by the sink(s) s_{n}" in dropping.json()["error"]

    # The same over the SQL port, with PostgreSQL's codes.
    with psycopg.connect(strata.psql_url, autocommit=True) as connection:
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="connector 'smtp'"):
            connection.execute(f"CREATE SINK x_{n} FROM {agg} WITH (connector = 'smtp')")
        with pytest.raises(psycopg.errors.DuplicateObject, match="already exists"):
            connection.execute(hook)
        with pytest.raises(psycopg.errors.DependentObjectsStillExist, match=f"s_{n}"):
            connection.execute(f"DROP STREAM {agg}")
        shown = connection.execute("SHOW SINKS").fetchall()
        assert [r[:3] for r in shown if r[0] == f"s_{n}"] == [(f"s_{n}", agg, "webhook")]
        connection.execute(f"DROP SINK s_{n}")
        connection.execute(f"DROP SINK IF EXISTS s_{n}")
        with pytest.raises(psycopg.errors.UndefinedObject, match="does not exist"):
            connection.execute(f"DROP SINK s_{n}")
    assert strata.client.delete(f"/streams/hidden_r{n}").status_code == 200
    assert strata.client.delete(f"/streams/{agg}").status_code == 200


def test_a_dead_receiver_lags_then_catches_up_and_lost_changes_break_it(
    module_strata: Strata, tmp_path: Path
) -> None:
    """Ingest goes on while the receiver is down; the sink's lag shows in GET /streams and
    /metrics, and it catches up once the receiver is back. A sink whose next changes were
    dropped by retention says so (broken) instead of skipping them."""
    strata = module_strata
    n = next(NAMES)
    ev, agg = f"ev_d{n}", f"agg_d{n}"
    strata.create(RAW.format(ev=ev))
    strata.create(PER_MINUTE.format(agg=agg, ev=ev))
    down = Receiver(tmp_path)
    try:
        down.kill()
        sql = f"CREATE SINK d_{n} FROM {agg} WITH (connector = 'webhook', url = '{down.url}')"
        assert strata.client.post("/streams", json={"sql": sql}).status_code == 201
        worker = SinkWorker(strata.service.engine, strata.service.plans, backoff_max=0.2)
        worker.run_once()
        shown = sink_state(strata, agg)[f"d_{n}"]
        assert shown["state"] == "retrying" and "ConnectError" in shown["error"], shown
        for i in range(3):
            strata.ingest(ev, run_body([("a", i, 60 * i)]), run_id=f"{ev}-{i}")
        down.start()
        time.sleep(0.3)
        worker.run_once()  # the snapshot, at the position it is current at
        for i in range(3, 6):
            strata.ingest(ev, run_body([("a", i, 60 * i)]), run_id=f"{ev}-{i}")
        down.kill()
        worker.run_once()
        shown = sink_state(strata, agg)[f"d_{n}"]
        assert shown["lag"] == 3 and shown["failures"] >= 1, shown
        metrics = strata.client.get("/metrics").text
        assert f'strata_sink_lag_changes{{sink="d_{n}",stream="{agg}"}} 3.0' in metrics
        assert f'strata_sink_failing{{sink="d_{n}",stream="{agg}"}} 1.0' in metrics
        down.start()
        time.sleep(0.3)
        catch_up(strata, worker, agg)
        assert down.rows(f"d_{n}") == view_rows(strata.database_url, agg, ("w", "k"))
        assert_ledger(down, f"d_{n}", latest(strata.database_url, agg))
        # Retention drops changes the sink has not delivered: it stops, broken.
        down.kill()
        for i in range(6, 9):
            strata.ingest(ev, run_body([("a", i, 60 * i)]), run_id=f"{ev}-{i}")
        # As retention would (STRATA_FEED_RETENTION): every change kept so far goes.
        execute(
            strata,
            "UPDATE strata_catalog.feeds SET pruned_through = position WHERE stream = %s",
            agg,
        )
        execute(strata, "DELETE FROM strata_catalog.feed_changes WHERE stream = %s", agg)
        down.start()
        time.sleep(0.3)
        worker.run_once()
        shown = sink_state(strata, agg)[f"d_{n}"]
        assert shown["state"] == "broken", shown
        assert "no longer kept" in shown["error"] and "does not skip them" in shown["error"]
        assert_ledger(down, f"d_{n}", shown["position"])
    finally:
        down.close()


def test_sink_statements_read_as_written() -> None:
    """CREATE SINK and DROP SINK as psql users write them: any case, comments, quoted
    names, IF [NOT] EXISTS, a trailing semicolon; options by name in any order."""

    text = (
        '-- counts to the dashboard\ncreate sink if not exists "Out" from public.agg\n'
        "  with (URL = 'postgresql://u:p@h/db', Connector = 'POSTGRES', table = 's.t', "
        "batch_size = 10);"
    )
    assert is_sink_statement(text) and not is_sink_statement("CREATE STREAM s AS SELECT 1")
    assert parse_sink(text) == CreateSink(
        "Out",
        "agg",
        "postgres",
        {"url": "postgresql://u:p@h/db", "table": "s.t", "batch_size": "10"},
        if_not_exists=True,
    )
    assert parse_sink("DROP SINK IF EXISTS out") == DropSink("out", True)
    with pytest.raises(InvalidSQL, match="line 2, column 1: CREATE SINK ends after"):
        parse_sink("CREATE SINK a FROM b WITH (connector = 'webhook', url = 'http://h/')\nx")
    with pytest.raises(InvalidSQL, match="table must name a table"):
        parse_sink(
            "CREATE SINK a FROM b WITH (connector = 'postgres', url = 'postgresql://h/', "
            "table = 'a.b.c')"
        )


def test_a_receiver_that_never_answers_holds_no_commit_back(module_strata: Strata) -> None:
    """A webhook receiver that takes the connection and never answers: while the sink waits
    on it (its POST in flight), runs still commit and their changes are read by the feed;
    the sink lags by them and fails once its timeout passes, without having delivered."""
    strata = module_strata
    n = next(NAMES)
    ev, agg = f"ev_h{n}", f"agg_h{n}"
    strata.create(RAW.format(ev=ev))
    strata.create(PER_MINUTE.format(agg=agg, ev=ev))
    strata.ingest(ev, run_body([("a", 0, 0)]), run_id=f"{ev}-0")  # a change to deliver
    silent = socket.create_server(("127.0.0.1", 0))  # accepts (the backlog), never answers
    url = f"http://127.0.0.1:{silent.getsockname()[1]}/hook"
    sql = f"CREATE SINK h_{n} FROM {agg} WITH (connector = 'webhook', url = '{url}')"
    assert strata.client.post("/streams", json={"sql": sql}).status_code == 201
    worker = SinkWorker(strata.service.engine, strata.service.plans, timeout=60)
    posting = threading.Thread(target=worker.run_once)
    try:
        posting.start()
        time.sleep(1.0)
        assert posting.is_alive(), "the sink's POST ended: the receiver was meant to hang"
        for i in range(1, 4):
            strata.ingest(ev, run_body([("a", i, 60 * i)]), run_id=f"{ev}-{i}")
        assert posting.is_alive(), "the runs committed only after the sink gave up"
        assert latest(strata.database_url, agg) == 3  # four changes, from position 0
    finally:
        silent.close()  # the POST fails now, well before its timeout
        posting.join(timeout=90)
    assert not posting.is_alive()
    shown = sink_state(strata, agg)[f"h_{n}"]
    assert shown["state"] == "retrying" and shown["failures"] == 1, shown
    assert shown["position"] is None and shown["latest_position"] == 3, shown  # none delivered
