"""Session windows are exact under any lateness: a late row that extends a session or
merges two is counted at once. The oracle forms the sessions in Python, independently of
the view's SQL (real PostgreSQL, real Spark ingest)."""

from __future__ import annotations

import itertools
import json
import random
from datetime import timedelta

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import Strata, examples
from tests.oracle import START, at, cut, late, late_runs, ndjson, with_a_late_run

GAP = timedelta(seconds=10)
_names = itertools.count()


def sessions(rows: list[tuple[str | None, int, int]]) -> list[tuple]:
    """(key, count, sum, start, end) per session: rows of a key less than GAP apart."""
    result = []
    for key in {k for k, _, _ in rows}:
        mine = sorted((s, v) for k, s, v in rows if k == key)
        current: list[tuple[int, int]] = []
        for second, value in mine:
            if current and second - current[-1][0] >= GAP.total_seconds():
                result.append(_session(key, current))
                current = []
            current.append((second, value))
        if current:
            result.append(_session(key, current))
    return sorted(result, key=repr)


def _session(key: str | None, rows: list[tuple[int, int]]) -> tuple:
    first, last = rows[0][0], rows[-1][0]
    return (
        key,
        len(rows),
        sum(v for _, v in rows),
        START + timedelta(seconds=first),
        START + timedelta(seconds=last) + GAP,
    )


# The same sessions in Strata's spelling and in Flink's (a session per PARTITION BY key).
SPELLINGS = {
    "strata": "SESSION({raw}, t, INTERVAL '10 seconds') GROUP BY k, window_start",
    "flink": "TABLE(SESSION(TABLE {raw} PARTITION BY k, DESCRIPTOR(t), INTERVAL '10' SECOND)) "
    "GROUP BY k, window_start, window_end",
}


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
@given(
    rows=st.lists(
        st.tuples(st.sampled_from(["a", "b", None]), st.integers(0, 120), st.integers(0, 9)),
        min_size=2,
        max_size=40,
    ).filter(lambda rows: len({s for _, s, _ in rows}) > 1),  # a late run needs two times
    cuts=st.lists(st.integers(1, 6), min_size=1, max_size=8),
    order=st.randoms(use_true_random=False),
)
@settings(
    max_examples=examples(12),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_sessions_equal_the_batch_sessions_after_every_run(
    module_strata: Strata,
    spelling: str,
    rows: list[tuple[str | None, int, int]],
    cuts: list[int],
    order: random.Random,
) -> None:
    strata = module_strata
    n = next(_names)
    raw, view = f"clicks_{n}", f"sessions_{n}"
    strata.create(f"CREATE STREAM {raw} (k text, v integer, t timestamptz) WITH (event_time = 't')")
    described = strata.create(
        f"CREATE STREAM {view} AS SELECT k, count(*) AS n, sum(v) AS s, window_start, "
        f"window_end FROM {SPELLINGS[spelling].format(raw=raw)}"
    )
    assert described["parallelism"] == "on read"
    # Two runs at least (no run holds every row), shuffled, one at least arriving late.
    runs = list(cut(rows, [min(size, len(rows) - 1) for size in cuts]))
    order.shuffle(runs)
    runs = with_a_late_run(runs, lambda row: row[1])
    received: list[tuple[str | None, int, int]] = []
    for chunk in runs:
        body = ndjson([{"k": k, "v": v, "t": at(s)} for k, s, v in chunk])
        strata.ingest(raw, body)
        received += chunk
        with psycopg.connect(strata.database_url) as connection:
            got = connection.execute(
                f"SELECT k, n, s, window_start, window_end FROM {view}"
            ).fetchall()
        assert sorted(got, key=repr) == sessions(received)
    # The example proved something: sessions to compare, and a run that came late.
    assert received and late(runs, lambda row: row[1]) and late_runs(strata, raw) > 0


def test_session_refusals_and_a_filter(module_strata: Strata) -> None:
    strata = module_strata
    n = next(_names)
    raw = f"taps_{n}"
    strata.create(f"CREATE STREAM {raw} (k text, v integer, t timestamptz) WITH (event_time = 't')")
    strata.create(
        f"CREATE STREAM big_{n} AS SELECT k, count(*) AS n, window_end FROM SESSION({raw}, t, "
        "INTERVAL '1 minute') WHERE v > 5 GROUP BY k, window_end HAVING count(*) > 1"
    )
    rows = [("a", 0, 9), ("a", 30, 1), ("a", 50, 7), ("a", 200, 8), ("b", 5, 6), ("b", 20, 6)]
    body = "".join(
        json.dumps({"k": k, "v": v, "t": (START + timedelta(seconds=s)).isoformat()}) + "\n"
        for k, s, v in rows
    )
    strata.ingest(raw, body)
    # WHERE filters before sessions form: a's rows at 0 and 50 (v > 5) are one session.
    got = strata.query(f"SELECT k, n, window_end FROM big_{n} ORDER BY k")
    assert got == [
        ("a", 2, START + timedelta(seconds=110)),
        ("b", 2, START + timedelta(seconds=80)),
    ]

    def refused(select: str) -> str:
        response = strata.client.post(
            "/streams", json={"sql": f"CREATE STREAM bad_{next(_names)} AS {select}"}
        )
        assert response.status_code in (400, 404), response.text
        return str(response.json()["error"])

    assert "event-time column" in refused(
        f"SELECT k, count(*) AS n, window_start FROM SESSION({raw}, v, INTERVAL '1 minute') "
        "GROUP BY k, window_start"
    )
    assert "not built on it" in refused(
        f"SELECT count(*) AS n, window_start FROM TUMBLE(big_{n}, window_end, "
        "INTERVAL '1 hour') GROUP BY window_start"
    )


def test_a_filter_on_a_key_reads_that_keys_raw_rows_by_index(module_strata: Strata) -> None:
    """A session stream over a raw stream indexes the raw archive on its keys and event
    time: a dashboard's filter on a key (one campaign's sessions) is an index condition
    there, where every raw row was scanned; the rows are the Python model's. Keys that are
    expressions get no index (the sessions are the same, read by a scan)."""
    strata = module_strata
    n = next(_names)
    raw, view, folded = f"visits_{n}", f"by_key_{n}", f"by_lower_{n}"
    strata.create(f"CREATE STREAM {raw} (k text, v integer, t timestamptz) WITH (event_time = 't')")
    strata.create(
        f"CREATE STREAM {view} AS SELECT k, count(*) AS n, sum(v) AS s, window_start, "
        f"window_end FROM SESSION({raw}, t, INTERVAL '10 seconds') GROUP BY k, window_start"
    )
    made = strata.create(
        f"CREATE STREAM {folded} AS SELECT lower(k) AS lk, count(*) AS n, window_start "
        f"FROM SESSION({raw}, t, INTERVAL '10 seconds') GROUP BY lower(k), window_start"
    )
    ddl = made["rewrite"]["ddl"]  # type: ignore[index]
    assert not any("CREATE INDEX" in s for s in ddl), ddl
    rng = random.Random(5)
    rows = [(f"k{rng.randrange(40)}", rng.randrange(3600), rng.randrange(10)) for _ in range(3000)]
    for start in range(0, len(rows), 1000):
        chunk = rows[start : start + 1000]
        strata.ingest(raw, ndjson([{"k": k, "v": v, "t": at(s)} for k, s, v in chunk]))
    query = f"SELECT k, n, s, window_start, window_end FROM {view} WHERE k = 'k7'"
    with psycopg.connect(strata.database_url, autocommit=True) as connection:
        connection.execute(f"ANALYZE strata_internal.{raw}__raw")
        got = connection.execute(query).fetchall()
        explained = "\n".join(r[0] for r in connection.execute("EXPLAIN " + query).fetchall())
        lowered = connection.execute(f"SELECT lk, n FROM {folded} WHERE lk = 'k7'").fetchall()
    assert sorted(got, key=repr) == [s for s in sessions(rows) if s[0] == "k7"]
    assert got
    index = f"{raw}__raw_k_t_sessions"
    assert index in explained, explained
    assert "k = 'k7'" in explained.split(index)[1].split("Cond:")[1].splitlines()[0], explained
    assert sorted(lowered) == sorted((s[0], s[1]) for s in sessions(rows) if s[0] == "k7")
