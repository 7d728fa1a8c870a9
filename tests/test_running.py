"""Aggregates without a window (running totals: ``SELECT k, count(*) FROM s GROUP BY k``)
are exact under any lateness: each view equals the same GROUP BY run as a batch over all
rows received, after every run, whatever the split and order, with the reducer folding
partial rows meanwhile (real PostgreSQL, real Spark)."""

from __future__ import annotations

import itertools
import random
from datetime import timedelta

import psycopg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server.workers.reducer import Reducer
from tests.conftest import Strata, examples
from tests.oracle import (
    START,
    SnapshotReader,
    canonical,
    cut,
    late,
    late_runs,
    ndjson,
    same,
    with_a_late_run,
)

_names = itertools.count()


QUERIES = {
    # name: (SELECT list, FROM, WHERE/GROUP BY/HAVING tail) - the stream's and the oracle's
    "totals": (
        "campaign, count(*) AS n, sum(price) AS revenue, avg(price) AS mean, min(t) AS first, "
        "max(price) AS top, count(DISTINCT user_id) AS users",
        "GROUP BY campaign",
    ),
    "busy": ("campaign, count(*) AS n", "WHERE price > 10 GROUP BY campaign HAVING count(*) > 2"),
    "everything": ("count(*) AS n, sum(price) AS revenue, count(DISTINCT campaign) AS c", ""),
}


@given(
    rows=st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c", None]),
            st.integers(0, 5),
            st.integers(0, 4000),
            st.integers(-3 * 24 * 60, 60),
        ),
        min_size=2,
        max_size=40,
    ).filter(lambda rows: len({m for *_, m in rows}) > 1),  # a late run needs two times
    cuts=st.lists(st.integers(1, 7), min_size=1, max_size=8),
    order=st.randoms(use_true_random=False),
    created_after=st.integers(0, 3),
)
@settings(
    max_examples=examples(10),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_running_totals_equal_the_batch_group_by_after_every_run(
    module_strata: Strata,
    rows: list[tuple[str | None, int, int, int]],
    cuts: list[int],
    order: random.Random,
    created_after: int,
) -> None:
    strata = module_strata
    n = next(_names)
    raw = f"ev_{n}"
    strata.create(
        f"CREATE STREAM {raw} (campaign text, user_id integer, price numeric(10,2), "
        "t timestamptz) WITH (event_time = 't')"
    )
    # Two runs at least (no run holds every row), shuffled, one at least arriving late.
    chunks = list(cut(rows, [min(size, len(rows) - 1) for size in cuts]))
    order.shuffle(chunks)
    chunks = with_a_late_run(chunks, lambda row: row[3])
    runs = [
        ndjson(
            [
                {
                    "campaign": c,
                    "user_id": u,
                    "price": p / 100,
                    "t": (START + timedelta(minutes=m)).isoformat(),
                }
                for c, u, p, m in chunk
            ]
        )
        for chunk in chunks
    ]
    names = {q: f"{q}_{n}" for q in QUERIES}
    reducer = Reducer(strata.service.engine, strata.service.plans, min_rows=1, max_groups=3)
    compared: dict[str, int] = {}
    for step, body in enumerate([None, *runs]):
        if body is not None:
            strata.ingest(raw, body)
        if step == min(created_after, len(runs)):  # streams made over some history
            for query, (items, tail) in QUERIES.items():
                strata.create(f"CREATE STREAM {names[query]} AS SELECT {items} FROM {raw} {tail}")
        if step >= min(created_after, len(runs)):
            if step % 2:
                reducer.run_once()
            for query, (items, tail) in QUERIES.items():
                columns = ", ".join(i.split(" AS ")[-1].strip() for i in items.split(", "))
                columns = columns.replace("count(*)", "count")
                compared[query] = same(
                    strata,
                    f"SELECT {columns} FROM {names[query]}",
                    f"SELECT {items} FROM {raw} {tail}",
                )
    # The example proved something: totals to compare, and a run that came late.
    assert compared["totals"] > 0 and compared["everything"] == 1, compared
    assert late(chunks, lambda row: row[3]) and late_runs(strata, raw) > 0


def test_running_totals_over_a_projection_and_a_join_and_refusals(module_strata: Strata) -> None:
    strata = module_strata
    n = next(_names)
    left, right = f"l_{n}", f"r_{n}"
    for name in (left, right):
        strata.create(
            f"CREATE STREAM {name} (k integer, v integer, t timestamptz) WITH (event_time = 't')"
        )
    strata.create(f"CREATE STREAM big_{n} AS SELECT k, v * 2 AS w, t FROM {left} WHERE v > 3")
    strata.create(
        f"CREATE STREAM lr_{n} AS SELECT l.k, r.v, l.t FROM {left} l JOIN {right} r ON l.k = r.k"
    )
    strata.create(f"CREATE STREAM per_k_{n} AS SELECT k, sum(w) AS s FROM big_{n} GROUP BY k")
    strata.create(f"CREATE STREAM pairs_{n} AS SELECT k, count(*) AS n FROM lr_{n} GROUP BY k")
    rng = random.Random(2)
    for i in range(8):
        stream = left if i % 2 else right
        rows = [
            {
                "k": rng.randrange(4),
                "v": rng.randrange(10),
                "t": (START + timedelta(hours=rng.randrange(-48, 2))).isoformat(),
            }
            for _ in range(6)
        ]
        strata.ingest(stream, ndjson(rows))
        same(
            strata,
            f"SELECT k, s FROM per_k_{n}",
            f"SELECT k, sum(v * 2) FROM {left} WHERE v > 3 GROUP BY k",
        )
        same(
            strata,
            f"SELECT k, n FROM pairs_{n}",
            f"SELECT l.k, count(*) FROM {left} l JOIN {right} r ON l.k = r.k GROUP BY l.k",
        )
    described = strata.client.get(f"/streams/per_k_{n}").json()
    assert described["window"].startswith("none")

    def refused(select: str) -> str:
        response = strata.client.post(
            "/streams", json={"sql": f"CREATE STREAM bad_{next(_names)} AS {select}"}
        )
        assert response.status_code == 400, response.text
        return str(response.json()["error"])

    assert "reads no window" in refused(
        f"SELECT k, count(*) AS n FROM {left} GROUP BY k, window_start"
    )
    assert "needs a window" in refused(f"SELECT DISTINCT count(*) AS n FROM {left} GROUP BY k")
    assert "no window column" in refused(
        f"SELECT sum(s) AS s, window_start FROM TUMBLE(per_k_{n}, INTERVAL '1 hour') "
        "GROUP BY window_start"
    )


def test_a_reader_sees_running_totals_sessions_and_top_n_exact_in_every_snapshot(
    strata: Strata,
) -> None:
    """Runs posted concurrently (hours late or on time) while a reader compares, in one
    REPEATABLE READ snapshot each time, running totals with their GROUP BY, sessions with
    sessions formed in Python from the raw rows, a top-N with its ranking query, and
    queries over subqueries (a max over windowed counts; the top key of each window)."""
    from tests.test_sessions import sessions

    rng = random.Random(31)
    strata.create("CREATE STREAM taps (k text, v integer, t timestamptz) WITH (event_time = 't')")
    strata.create(
        "CREATE STREAM tap_totals AS SELECT k, count(*) AS n, sum(v) AS s FROM taps GROUP BY k"
    )
    strata.create(
        "CREATE STREAM tap_sessions AS SELECT k, count(*) AS n, sum(v) AS s, window_start, "
        "window_end FROM SESSION(taps, t, INTERVAL '10 seconds') GROUP BY k, window_start"
    )
    top = (
        "SELECT k, v, t FROM (SELECT k, v, t, ROW_NUMBER() OVER (PARTITION BY k ORDER BY v "
        "DESC, t) AS rn FROM taps) x WHERE rn <= 2"
    )
    strata.create(f"CREATE STREAM tap_top AS {top}")
    counts = (
        "SELECT k, count(*) AS n, window_start FROM TUMBLE(taps, t, INTERVAL '5 minutes') "
        "GROUP BY k, window_start"
    )
    batch_counts = (
        "SELECT k, count(*) AS n, date_bin('5 minutes', t, timestamptz 'epoch') AS "
        "window_start FROM taps GROUP BY 1, 3"
    )
    busiest = "SELECT max(n) AS top, count(*) AS windows FROM ({}) c"
    leaders = (
        "SELECT k, n, window_start FROM (SELECT k, n, window_start, RANK() OVER (PARTITION BY "
        "window_start ORDER BY n DESC) AS r FROM ({}) c) x WHERE r = 1"
    )
    strata.create(f"CREATE STREAM tap_busiest AS {busiest.format(counts)}")
    strata.create(f"CREATE STREAM tap_leaders AS {leaders.format(counts)}")
    checks = {
        "SELECT k, n, s FROM tap_totals": "SELECT k, count(*), sum(v) FROM taps GROUP BY k",
        "SELECT * FROM tap_top": top,
        "SELECT * FROM tap_busiest": busiest.format(batch_counts),
        "SELECT * FROM tap_leaders": leaders.format(batch_counts),
    }

    def check(connection: psycopg.Connection) -> None:
        for view, oracle in checks.items():
            got = canonical(connection.execute(view).fetchall())  # type: ignore[arg-type]
            want = canonical(connection.execute(oracle).fetchall())  # type: ignore[arg-type]
            assert got == want, f"{view}: {got}, its oracle {want}"
        raw = connection.execute("SELECT k, t, v FROM taps").fetchall()
        got = connection.execute(
            "SELECT k, n, s, window_start, window_end FROM tap_sessions"
        ).fetchall()
        received = [(k, int((t - START).total_seconds()), v) for k, t, v in raw]
        assert sorted(got, key=repr) == sessions(received), "tap_sessions"

    with SnapshotReader(strata.database_url, check, min_snapshots=10):
        posted = []
        for _ in range(30):
            base = rng.choice([0, 0, -3600, 600])
            rows = [
                {
                    "k": rng.choice("ab"),
                    "v": rng.randrange(20),
                    "t": (START + timedelta(seconds=base + rng.randrange(0, 600))).isoformat(),
                }
                for _ in range(rng.randrange(1, 6))
            ]
            response = strata.post_run("taps", ndjson(rows), wait=False)
            assert response.status_code == 202, response.text
            posted.append(response.json()["run_id"])
        for run_id in posted:
            run = strata.service.wait(strata.service.run(run_id), 120)  # type: ignore[arg-type]
            assert run.status == "committed", run
    # And once more after the last run: every row is in, and some came hours late.
    with psycopg.connect(strata.database_url) as connection:
        connection.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        check(connection)
    assert late_runs(strata, "taps") > 0
