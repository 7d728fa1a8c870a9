"""ALTER STREAM: a stream's query changed over all history, swapped in one transaction.

Before the swap every view equals the batch query of the old definition, after it the
new one, whatever the split, order and lateness of the runs; the streams built on the
altered one follow it in the same swap."""

from __future__ import annotations

import itertools
import json
import random
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rewriter import naming
from server.workers.backfill import Backfiller, wait_for
from server.workers.reducer import Reducer
from server.workers.serial import Materializer, Repairer
from server.workers.swapper import Swapper
from tests.conftest import Strata, examples
from tests.oracle import SnapshotReader, late, late_runs, with_a_late_run

START = datetime(2024, 8, 1, tzinfo=UTC)
RAW = "CREATE STREAM {ev} (k text, v bigint, t timestamptz) WITH (event_time = 't')"
# m: per minute (parallel); h: its roll-up per hour (parallel); x: the busiest key per
# ten minutes (serial, a max over counts).
STREAMS = {
    "m": "SELECT window_start, k, count(*) AS c, sum(v) AS s FROM TUMBLE({ev}, t, "
    "INTERVAL '1 minute') {where}GROUP BY window_start, k",
    "h": "SELECT window_start, sum(c) AS c, sum(s) AS s FROM TUMBLE({m}, window_start, "
    "INTERVAL '1 hour') GROUP BY window_start",
    "x": "SELECT window_start, max(c) AS top FROM TUMBLE({m}, window_start, "
    "INTERVAL '10 minutes') GROUP BY window_start",
}
NEW_FILTER = "WHERE v > 0 "


def _bucket(column: str, seconds: int) -> str:
    return f"to_timestamp(floor(extract(epoch FROM {column}) / {seconds}) * {seconds})"


def oracles(ev: str, where: str) -> dict[str, str]:
    """Each stream as a batch query over the raw rows, for the definition of m with
    ``where``."""
    minute = _bucket("t", 60)
    m = f"SELECT {minute} AS w, k, count(*) AS c, sum(v) AS s FROM {ev} {where}GROUP BY 1, 2"
    return {
        "m": m,
        "h": f"SELECT {_bucket('w', 3600)}, sum(c), sum(s) FROM ({m}) m GROUP BY 1",
        "x": f"SELECT {_bucket('w', 600)}, max(c) FROM ({m}) m GROUP BY 1",
    }


def _rows(rng: random.Random, count: int, hours: float = 2) -> list[dict[str, object]]:
    return [
        {
            "k": rng.choice("abcd"),
            "v": rng.randrange(-50, 100),
            "t": (START + timedelta(seconds=rng.uniform(0, hours * 3600))).isoformat(),
        }
        for _ in range(count)
    ]


def _time(row: dict[str, object]) -> datetime:
    return datetime.fromisoformat(str(row["t"]))


def _ndjson(rows: list[dict[str, object]]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def _normal(rows: list[tuple]) -> list[str]:
    def value(v: object) -> object:
        return v.normalize() if isinstance(v, Decimal) else v

    return sorted(repr(tuple(value(v) for v in row)) for row in rows)


def definition(connection: psycopg.Connection, names: dict[str, str], ev: str) -> set[str]:
    """Which definitions every view shows, read in the connection's transaction: those of
    "old" and "new" whose batch queries all three views equal (both, while the new filter
    leaves the rows alike); the assertion says which view shows neither."""
    possible = {"old", "new"}
    for kind, name in names.items():
        view = _normal(connection.execute(f"SELECT * FROM {name}").fetchall())  # type: ignore[arg-type]
        shown = set()
        for label, where in (("old", ""), ("new", NEW_FILTER)):
            query = oracles(ev, where)[kind]
            if view == _normal(connection.execute(query).fetchall()):  # type: ignore[arg-type]
                shown.add(label)
        assert shown, f"{name} equals neither definition's batch query"
        possible &= shown
    assert possible, f"the views disagree on the definition ({names})"
    return possible


def shows(strata: Strata, names: dict[str, str], ev: str) -> set[str]:
    with psycopg.connect(strata.database_url) as connection:
        connection.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        return definition(connection, names, ev)


def _alter(strata: Strata, statement: str, status: int) -> dict[str, object]:
    response = strata.client.post("/streams", json={"sql": statement})
    assert response.status_code == status, response.text
    return response.json()["alter"]  # type: ignore[no-any-return]


def _swap(strata: Strata) -> int:
    return sum(Swapper(strata.service.engine, strata.service.plans).run_once().values())


def _swap_eventually(strata: Strata, timeout: float = 60) -> None:
    """Swap, passing again while readers keep the swap waiting (it gives way to them)."""
    deadline = time.monotonic() + timeout
    while _swap(strata) == 0:
        assert time.monotonic() < deadline, "the swap never got its locks"
        time.sleep(0.2)


def _fold(strata: Strata) -> None:
    """Run the reducer, the materializer and the repairer once over every stream."""
    engine, plans = strata.service.engine, strata.service.plans
    for worker in (Reducer(engine, plans), Materializer(engine, plans), Repairer(engine, plans)):
        worker.run_once()


def _create(strata: Strata, n: int) -> dict[str, str]:
    names = {kind: f"{kind}_{n}" for kind in STREAMS}
    ev = f"ev_{n}"
    strata.create(RAW.format(ev=ev))
    for kind, query in STREAMS.items():
        text = query.format(ev=ev, where="", **names)
        strata.create(f"CREATE STREAM {names[kind]} AS {text}")
    return names


def _alter_m(n: int, names: dict[str, str]) -> str:
    query = STREAMS["m"].format(ev=f"ev_{n}", where=NEW_FILTER, **names)
    return f"ALTER STREAM {names['m']} AS {query}"


_examples = itertools.count()


def differ(strata: Strata, ev: str) -> int:
    """The rows of m's old definition, which its new one must not equal (or an example
    could not tell which definition the views show)."""
    old, new = (_normal(strata.query(oracles(ev, where)["m"])) for where in ("", NEW_FILTER))
    assert old and old != new, "the old and the new definition give the same rows"
    return len(old)


@settings(
    max_examples=examples(6),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(seed=st.integers(0, 2**16), data=st.data())
def test_alter_equals_old_then_new_definition(module_strata: Strata, seed: int, data) -> None:
    strata = module_strata
    n = next(_examples)
    names = _create(strata, n)
    ev = f"ev_{n}"
    rng = random.Random(seed)
    rows = _rows(rng, data.draw(st.integers(2, 400)), hours=data.draw(st.sampled_from([1, 5])))
    cuts = sorted(data.draw(st.sets(st.integers(1, len(rows) - 1), min_size=1, max_size=6)))
    runs = [rows[a:b] for a, b in itertools.pairwise([0, *cuts, len(rows)])]
    rng.shuffle(runs)  # late and out of order: one run at least behind an earlier one
    runs = with_a_late_run(runs, _time)
    for run in runs:
        # A row the new definition's filter drops in every run: from the first run on, the
        # two definitions differ, so every check below tells which one the views show.
        run[rng.randrange(len(run))]["v"] = -rng.randrange(0, 51)
    alter_at = data.draw(st.integers(0, len(runs)))
    swap_at = data.draw(st.integers(alter_at, len(runs)))
    folds = data.draw(st.sets(st.integers(0, len(runs))))

    def expect(label: str, position: int) -> None:
        """The views show definition ``label``: alone, once a run is in."""
        shown = shows(strata, names, ev)
        if position > 0:
            assert shown == {label}, (label, shown)
        else:  # nothing in yet: both definitions give empty views
            assert label in shown, (label, shown)

    for position in range(len(runs) + 1):
        if position == alter_at:
            altered = strata.client.post("/streams", json={"sql": _alter_m(n, names)})
            assert altered.status_code in (200, 202), altered.text
            alter = altered.json()["alter"]
            assert alter["version"] == 2, alter
            if altered.status_code == 200:  # no history yet: in place at once
                assert (alter["path"], alter["state"]) == ("reuse", "done"), alter
                swap_at = position
            else:
                assert alter["state"] == "building", alter
        if position in folds:
            _fold(strata)
        if position == swap_at:
            for built in names.values():
                wait_for(strata.service.engine, f"{built}__next")
            if not (alter_at == swap_at == position):  # caught up, not swapped yet
                expect("old", position)
            _swap(strata)
            expect("new", position)
        elif position < alter_at or position < swap_at:
            expect("old", position)
        if position < len(runs):
            strata.ingest(ev, _ndjson(runs[position]))
    _fold(strata)
    expect("new", len(runs))
    assert strata.client.get(f"/streams/{names['m']}").json()["version"] == 2
    # The example proved something: definitions that differ, and a run that came late.
    assert differ(strata, ev) > 0
    assert late(runs, _time) and late_runs(strata, ev) > 0


def test_readers_see_one_definition_whole_through_the_swap(strata: Strata) -> None:
    """A reader in REPEATABLE READ snapshots, reading all the time while runs commit,
    back-fill runs and the swap happens, sees the old definition or the new one."""
    names = _create(strata, 0)
    rng = random.Random(7)
    for _ in range(4):
        strata.ingest("ev_0", _ndjson(_rows(rng, 400)))
    seen: list[set[str]] = []

    def read(connection: psycopg.Connection) -> None:
        seen.append(definition(connection, names, "ev_0"))

    with SnapshotReader(strata.database_url, read, min_snapshots=10):
        _alter(strata, _alter_m(0, names), 202)
        for _ in range(3):
            strata.ingest("ev_0", _ndjson(_rows(rng, 200)))
            _fold(strata)
        for built in names.values():
            wait_for(strata.service.engine, f"{built}__next")
        _swap_eventually(strata)
        for _ in range(2):
            strata.ingest("ev_0", _ndjson(_rows(rng, 200)))
            _fold(strata)
    only = ["".join(sorted(labels)) for labels in seen if len(labels) == 1]
    assert only[0] == "old" and only[-1] == "new"
    assert "old" not in only[only.index("new") :], "a reader saw the old definition after the new"


def test_progress_history_and_a_second_alter(strata: Strata) -> None:
    names = _create(strata, 1)
    rng = random.Random(1)
    for _ in range(3):
        strata.ingest("ev_1", _ndjson(_rows(rng, 300)))
    strata.runtime.workers["backfill"].stop()  # stepped by hand below
    altered = _alter(strata, _alter_m(1, names), 202)
    assert (altered["path"], altered["state"], altered["version"]) == ("backfill", "building", 2)
    assert altered["rebuilt"] == [names["m"], names["h"], names["x"]]
    progress = strata.client.get("/streams/m_1").json()["progress"]["alter"]
    assert (progress["state"], progress["rows_done"], progress["rows_total"]) == (
        "building",
        0,
        1800,  # m's and h's back-fills over 900 rows each (x is serial: exact on read)
    )
    assert _swap(strata) == 0  # not caught up yet
    assert "old" in shows(strata, names, "ev_1")
    Backfiller(strata.service.engine, strata.service.plans, strata.runtime.backend).run_once()
    assert _swap(strata) == 1
    described = strata.client.get("/streams/m_1").json()
    assert described["version"] == 2 and "v > 0" in described["sql"]
    assert described["progress"]["alter"]["state"] == "done"
    assert [(h["version"], "v > 0" in h["sql"]) for h in described["history"]] == [(1, False)]
    listed = [s["name"] for s in strata.client.get("/streams").json()]
    assert not [name for name in listed if name.endswith("__next")]
    assert "new" in shows(strata, names, "ev_1")
    # Back to the first definition: the partial rows of the second do not answer it.
    text = STREAMS["m"].format(ev="ev_1", where="", **names)
    assert _alter(strata, f"ALTER STREAM m_1 AS {text}", 202)["version"] == 3
    Backfiller(strata.service.engine, strata.service.plans, strata.runtime.backend).run_once()
    assert _swap(strata) == 1
    assert "old" in shows(strata, names, "ev_1")
    history = strata.client.get("/streams/m_1").json()["history"]
    assert [h["version"] for h in history] == [1, 2]


def test_cheap_alter_reuses_partial_rows(strata: Strata) -> None:
    strata.create(RAW.format(ev="ev"))
    strata.create(
        "CREATE STREAM per_min AS SELECT window_start, k, count(*) AS c, sum(v) AS s, "
        "count(v) AS cv FROM TUMBLE(ev, t, INTERVAL '1 minute') GROUP BY window_start, k"
    )
    rng = random.Random(2)
    for _ in range(3):
        strata.ingest("ev", _ndjson(_rows(rng, 300)))
    _fold(strata)  # some windows reduced, some not
    strata.ingest("ev", _ndjson(_rows(rng, 100)))
    # A column dropped, one renamed, an avg over the sum and count kept, a HAVING.
    altered = _alter(
        strata,
        "ALTER STREAM per_min AS SELECT window_start, k AS key, sum(v) AS total, avg(v) AS mean "
        "FROM TUMBLE(ev, t, INTERVAL '1 minute') GROUP BY window_start, k HAVING count(*) > 1",
        200,
    )
    assert (altered["path"], altered["state"]) == ("reuse", "done")
    assert altered["members"] == [{"stream": "per_min", "how": "reused partial rows"}]
    expected = (
        f"SELECT {_bucket('t', 60)}, k, sum(v), avg(v) FROM ev GROUP BY 1, 2 HAVING count(*) > 1"
    )
    assert _normal(strata.query("SELECT * FROM per_min")) == _normal(strata.query(expected))
    strata.ingest("ev", _ndjson(_rows(rng, 100)))
    _fold(strata)
    assert _normal(strata.query("SELECT * FROM per_min")) == _normal(strata.query(expected))
    columns = [c["name"] for c in strata.client.get("/streams/per_min").json()["columns"]]
    assert columns == ["window_start", "key", "total", "mean"]


def test_dependents_must_keep_their_columns(strata: Strata) -> None:
    names = _create(strata, 2)
    strata.ingest("ev_2", _ndjson(_rows(random.Random(3), 200)))
    before = strata.client.get("/streams/m_2").json()
    # h reads c: without it h cannot be planned.
    response = strata.client.post(
        "/streams",
        json={
            "sql": "ALTER STREAM m_2 AS SELECT window_start, k, sum(v) AS s FROM "
            "TUMBLE(ev_2, t, INTERVAL '1 minute') GROUP BY window_start, k"
        },
    )
    assert response.status_code == 409, response.text
    assert "'h_2'" in response.json()["error"]
    # x's column changes type (max over a sum is numeric, over a count bigint).
    response = strata.client.post(
        "/streams",
        json={
            "sql": "ALTER STREAM m_2 AS SELECT window_start, k, sum(v) AS c, sum(v) AS s FROM "
            "TUMBLE(ev_2, t, INTERVAL '1 minute') GROUP BY window_start, k"
        },
    )
    assert response.status_code == 409, response.text
    assert "x_2 (top)" in response.json()["error"]
    # Nothing changed: no stream built, the same definition, no ALTER on record.
    after = strata.client.get("/streams/m_2").json()
    assert after["sql"] == before["sql"] and after["version"] == 1
    assert after["progress"]["alter"] is None
    listed = {s["name"] for s in strata.client.get("/streams").json()}
    assert listed == {"ev_2", *names.values()}
    assert "old" in shows(strata, names, "ev_2")


def test_ddl_while_an_alter_builds(strata: Strata) -> None:
    names = _create(strata, 3)
    strata.ingest("ev_3", _ndjson(_rows(random.Random(4), 300)))
    strata.runtime.workers["backfill"].stop()  # the ALTER stays building
    _alter(strata, _alter_m(3, names), 202)

    def refused(method: str, path: str, sql: str | None = None) -> str:
        if method == "post":
            response = strata.client.post(path, json={"sql": sql})
        else:
            response = strata.client.delete(path)
        assert response.status_code == 409, response.text
        return str(response.json()["error"])

    # The raw source: its streams (the old and the new) still read it.
    assert "m_3__next" in refused("delete", "/streams/ev_3")
    # A stream it rebuilds, or one it builds.
    assert "ALTER STREAM m_3" in refused("delete", "/streams/h_3")
    assert "ALTER STREAM m_3" in refused("delete", "/streams/m_3__next")
    assert "ALTER STREAM m_3" in refused(
        "post",
        "/streams",
        "ALTER STREAM h_3 AS SELECT window_start, sum(c) AS c, sum(s) AS s FROM "
        "TUMBLE(m_3, window_start, INTERVAL '2 hours') GROUP BY window_start",
    )
    # A new stream on it would miss the new definition's history.
    assert "ALTER STREAM m_3" in refused(
        "post",
        "/streams",
        "CREATE STREAM y_3 AS SELECT window_start, count(*) AS n FROM "
        "TUMBLE(m_3, window_start, INTERVAL '1 hour') GROUP BY window_start",
    )
    # A newer ALTER replaces the one in flight.
    replaced = _alter(strata, _alter_m(3, names).replace("v > 0", "v > 10"), 202)
    assert replaced["version"] == 2
    Backfiller(strata.service.engine, strata.service.plans, strata.runtime.backend).run_once()
    assert _swap(strata) == 1
    expected = oracles("ev_3", "WHERE v > 10 ")["h"]
    assert _normal(strata.query("SELECT * FROM h_3")) == _normal(strata.query(expected))
    # Dropping the altered stream cancels its ALTER (and takes what it built).
    _alter(strata, _alter_m(3, names), 202)
    for name in ("x_3", "h_3"):
        assert "ALTER STREAM m_3" in refused("delete", f"/streams/{name}")
    listed = {s["name"] for s in strata.client.get("/streams").json()}
    assert {"m_3__next", "h_3__next", "x_3__next"} <= listed
    response = strata.client.post(
        "/streams",
        json={"sql": "ALTER STREAM ev_3 AS SELECT 1"},
    )
    assert response.status_code == 400 and "raw stream" in response.text


def test_drop_cancels_the_alter(strata: Strata) -> None:
    strata.create(RAW.format(ev="ev"))
    strata.create(STREAMS["m"].join(["CREATE STREAM m AS ", ""]).format(ev="ev", where=""))
    strata.ingest("ev", _ndjson(_rows(random.Random(5), 100)))
    strata.runtime.workers["backfill"].stop()
    _alter(strata, _alter_m(9, {"m": "m"}).replace("ev_9", "ev"), 202)
    dropped = strata.client.delete("/streams/m")
    assert (dropped.status_code, dropped.json()) == (200, {"name": "m", "dropped": True})
    assert {s["name"] for s in strata.client.get("/streams").json()} == {"ev"}
    leftovers = strata.query(
        "SELECT relname FROM pg_class WHERE relname LIKE 'm\\_\\_%' OR relname = 'm'"
    )
    assert leftovers == []
    # The name is free again, with no past.
    text = STREAMS["m"].join(["CREATE STREAM m AS ", ""]).format(ev="ev", where="")
    assert strata.client.post("/streams", json={"sql": text}).status_code == 201
    described = strata.client.get("/streams/m").json()
    assert described["version"] == 1 and described["history"] == []
    assert described["progress"]["alter"] is None


def test_alter_joins_sessions_top_n_and_serial_streams(strata: Strata) -> None:
    strata.create(RAW.format(ev="ev"))
    strata.create("CREATE STREAM keys (k text, label text, t timestamptz) WITH (event_time = 't')")
    strata.create(
        "CREATE STREAM j AS SELECT e.k, e.v, e.t, l.label FROM ev e JOIN keys l ON e.k = l.k"
    )
    strata.create(
        "CREATE STREAM sess AS SELECT k, count(*) AS n, window_start FROM "
        "SESSION(ev, t, INTERVAL '5 minutes') GROUP BY k, window_start"
    )
    strata.create(STREAMS["m"].join(["CREATE STREAM m AS ", ""]).format(ev="ev", where=""))
    strata.create(
        "CREATE STREAM top AS SELECT window_start, k, c FROM (SELECT window_start, k, c, "
        "ROW_NUMBER() OVER (PARTITION BY window_start ORDER BY c DESC, k) AS r FROM m) q "
        "WHERE r <= 1"
    )
    strata.create(STREAMS["x"].format(m="m").join(["CREATE STREAM x AS ", ""]))
    rng = random.Random(6)
    labels = [{"k": k, "label": f"key {k}", "t": START.isoformat()} for k in "abc"]
    strata.ingest("keys", _ndjson(labels))
    strata.ingest("ev", _ndjson(_rows(rng, 300)))
    _fold(strata)

    def same(view: str, query: str) -> None:
        assert _normal(strata.query(f"SELECT * FROM {view}")) == _normal(strata.query(query))

    # A join: its history is joined in the ALTER's transaction.
    altered = _alter(
        strata,
        "ALTER STREAM j AS SELECT e.k, e.v, e.t, l.label FROM ev e JOIN keys l "
        "ON e.k = l.k AND e.v > 10",
        200,
    )
    assert altered["members"] == [{"stream": "j", "how": "history joined"}]
    same("j", "SELECT e.k, e.v, e.t, l.label FROM ev e JOIN keys l ON e.k = l.k AND e.v > 10")
    strata.ingest("keys", _ndjson([{"k": "d", "label": "key d", "t": START.isoformat()}]))
    strata.ingest("ev", _ndjson(_rows(rng, 100)))
    same("j", "SELECT e.k, e.v, e.t, l.label FROM ev e JOIN keys l ON e.k = l.k AND e.v > 10")
    # A session window (computed on read).
    altered = _alter(
        strata,
        "ALTER STREAM sess AS SELECT k, count(*) AS n, sum(v) AS s, window_start FROM "
        "SESSION(ev, t, INTERVAL '10 minutes') GROUP BY k, window_start",
        200,
    )
    assert altered["members"] == [{"stream": "sess", "how": "view"}]
    assert "10 minutes" in strata.client.get("/streams/sess").json()["sql"]
    # The serial stream itself (exact on read, its archive rebuilt after the swap).
    altered = _alter(
        strata,
        "ALTER STREAM x AS SELECT window_start, min(c) AS top FROM TUMBLE(m, window_start, "
        "INTERVAL '10 minutes') GROUP BY window_start",
        200,
    )
    assert altered["members"] == [{"stream": "x", "how": "materialized after the swap"}]
    bottom = oracles("ev", "")["m"].join(
        ["SELECT " + _bucket("w", 600) + ", min(c) FROM (", ") m GROUP BY 1"]
    )
    same("x", bottom)
    _fold(strata)
    same("x", bottom)
    # m, with the top-N and the serial stream built on it following.
    altered = _alter(strata, _alter_m(0, {"m": "m", "x": "x"}).replace("ev_0", "ev"), 202)
    assert [m["stream"] for m in altered["members"]] == ["m", "top", "x"]
    wait_for(strata.service.engine, "m__next")
    assert _swap(strata) == 1
    filtered = oracles("ev", NEW_FILTER)["m"]
    same(
        "top",
        f"SELECT w, k, c FROM (SELECT w, k, c, ROW_NUMBER() OVER (PARTITION BY w ORDER BY c "
        f"DESC, k) AS r FROM ({filtered}) m) q WHERE r <= 1",
    )
    same("x", f"SELECT {_bucket('w', 600)}, min(c) FROM ({filtered}) m GROUP BY 1")
    # The serial streams' functions (x's, and the top-N's: it ranks m's windows, each kept
    # once it closes) are made under their own names at the swap, and the ones they were
    # built with go; dropping a stream drops its function.
    live = (
        "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
        "WHERE n.nspname = 'strata_internal' AND p.proname LIKE 'strata\\_live\\_%' "
        "ORDER BY 1"
    )
    functions = sorted((naming.serial_live_function(s),) for s in ("top", "x"))
    assert strata.query(live) == functions
    assert strata.client.delete("/streams/x").status_code == 200
    assert strata.query(live) == [(naming.serial_live_function("top"),)]


def test_alter_over_the_sql_port(strata: Strata) -> None:
    strata.create(RAW.format(ev="ev"))
    strata.create(STREAMS["m"].join(["CREATE STREAM m AS ", ""]).format(ev="ev", where=""))
    strata.ingest("ev", _ndjson(_rows(random.Random(8), 100)))
    notices: list[str] = []
    with psycopg.connect(strata.psql_url, autocommit=True) as connection:
        connection.add_notice_handler(lambda n: notices.append(n.message_primary or ""))
        cursor = connection.execute(
            "ALTER STREAM m AS SELECT window_start, k, count(*) AS c FROM "
            "TUMBLE(ev, t, INTERVAL '1 minute') GROUP BY window_start, k"
        )
        assert cursor.statusmessage == "ALTER STREAM"
        with pytest.raises(psycopg.errors.UndefinedTable):
            connection.execute("ALTER STREAM nope AS SELECT 1")
    assert notices and "in place" in notices[0]
    expected = f"SELECT {_bucket('t', 60)}, k, count(*) FROM ev GROUP BY 1, 2"
    assert _normal(strata.query("SELECT * FROM m")) == _normal(strata.query(expected))


def test_retention_refuses_an_alter_that_needs_the_raw_rows(strata: Strata) -> None:
    strata.create(
        RAW.format(ev="ev").replace("event_time = 't'", "event_time = 't', retention = '30 days'")
    )
    text = STREAMS["m"].format(ev="ev", where="")
    strata.create(f"CREATE STREAM m AS {text}")
    strata.ingest("ev", _ndjson(_rows(random.Random(9), 100)))
    response = strata.client.post(
        "/streams", json={"sql": _alter_m(0, {"m": "m"}).replace("ev_0", "ev")}
    )
    assert response.status_code == 400 and "retention" in response.json()["error"]
    assert {s["name"] for s in strata.client.get("/streams").json()} == {"ev", "m"}
    # What the archived partial rows answer needs no raw rows.
    assert _alter(strata, f"ALTER STREAM m AS {text} HAVING count(*) > 1", 200)["path"] == "reuse"
    expected = f"SELECT * FROM ({oracles('ev', '')['m']}) m WHERE c > 1"
    assert _normal(strata.query("SELECT * FROM m")) == _normal(strata.query(expected))


def test_altering_the_source_of_a_stream_being_altered(strata: Strata) -> None:
    names = _create(strata, 4)
    strata.ingest("ev_4", _ndjson(_rows(random.Random(10), 300)))
    strata.runtime.workers["backfill"].stop()
    coarser = STREAMS["h"].format(**names).replace("1 hour", "2 hours")
    _alter(strata, f"ALTER STREAM h_4 AS {coarser}", 202)
    response = strata.client.post("/streams", json={"sql": _alter_m(4, names)})
    assert response.status_code == 409, response.text
    assert "pending ALTER STREAM h_4" in response.json()["error"]
    Backfiller(strata.service.engine, strata.service.plans, strata.runtime.backend).run_once()
    assert _swap(strata) == 1
    # Swapped in: now m_4 can change, and h_4 (in its new form) follows.
    _alter(strata, _alter_m(4, names), 202)
    Backfiller(strata.service.engine, strata.service.plans, strata.runtime.backend).run_once()
    assert _swap(strata) == 1
    m = oracles("ev_4", NEW_FILTER)["m"]
    expected = f"SELECT {_bucket('w', 7200)}, sum(c), sum(s) FROM ({m}) m GROUP BY 1"
    assert _normal(strata.query("SELECT * FROM h_4")) == _normal(strata.query(expected))


def test_the_join_under_an_aggregate_is_altered_with_it(strata: Strata) -> None:
    strata.create(RAW.format(ev="ev"))
    strata.create("CREATE STREAM keys (k text, label text, t timestamptz) WITH (event_time = 't')")
    joined = (
        "SELECT l.label, count(*) AS n, window_start FROM TUMBLE(ev, t, INTERVAL '1 hour') e "
        "JOIN keys l ON e.k = l.k {where}GROUP BY l.label, window_start"
    )
    strata.create(f"CREATE STREAM per_label AS {joined.format(where='')}")
    strata.ingest(
        "keys", _ndjson([{"k": k, "label": f"L{k}", "t": START.isoformat()} for k in "ab"])
    )
    strata.ingest("ev", _ndjson(_rows(random.Random(11), 300)))
    response = strata.client.post(
        "/streams", json={"sql": f"ALTER STREAM per_label__rows AS {joined.format(where='')}"}
    )
    assert response.status_code == 400 and "alter 'per_label' instead" in response.text
    _alter(strata, f"ALTER STREAM per_label AS {joined.format(where='WHERE e.v > 0 ')}", 202)
    wait_for(strata.service.engine, "per_label__next")
    assert _swap(strata) == 1
    listed = {s["name"] for s in strata.client.get("/streams").json()}
    assert listed == {"ev", "keys", "per_label", "per_label__rows"}
    hour = _bucket("e.t", 3600)
    expected = (
        f"SELECT l.label, count(*), {hour} FROM ev e JOIN keys l ON e.k = l.k WHERE e.v > 0 "
        "GROUP BY 1, 3"
    )
    assert _normal(strata.query("SELECT * FROM per_label")) == _normal(strata.query(expected))
