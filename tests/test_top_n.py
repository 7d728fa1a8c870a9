"""Top-N and dedup, and other window functions, are exact under any lateness: a late row
that pushes another out of the first N, or changes a row's neighbours, does so at once.
Each view equals its query run by PostgreSQL over the raw view, after every run of
shuffled splits (real PostgreSQL, real Spark ingest)."""

from __future__ import annotations

import itertools
import json
import random
from datetime import UTC, datetime, timedelta

import psycopg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import Strata

START = datetime(2024, 5, 1, tzinfo=UTC)
_names = itertools.count()

# name: (the stream's SELECT, the same query as a batch over the raw view); ties broken by id
QUERIES = {
    "top3": (
        "SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY auction ORDER BY price DESC, "
        "id) AS rn FROM {bid}) t WHERE rn <= 3",
    )
    * 2,
    "first_bid": (
        "SELECT auction, id, price FROM (SELECT auction, id, price, ROW_NUMBER() OVER "
        "(PARTITION BY auction ORDER BY date_time, id) AS rn FROM {bid}) t WHERE rn = 1",
    )
    * 2,
    "hottest": (
        "SELECT auction, price, window_start FROM (SELECT auction, price, window_start, "
        "RANK() OVER (PARTITION BY window_start ORDER BY price DESC) AS r FROM "
        "TUMBLE({bid}, date_time, INTERVAL '10 minutes') b) x WHERE r = 1",
        "SELECT auction, price, window_start FROM (SELECT auction, price, window_start, "
        "RANK() OVER (PARTITION BY window_start ORDER BY price DESC) AS r FROM (SELECT *, "
        "date_bin('10 minutes', date_time, timestamptz 'epoch') AS window_start FROM {bid}) b"
        ") x WHERE r = 1",
    ),
    "dear": ("SELECT id, price FROM {bid} WHERE price > 10 ORDER BY price DESC, id LIMIT 5",) * 2,
    # Other window functions, on read too: over the raw rows, and running sums over an
    # aggregate stream's windows (what a cumulating window gives).
    "previous": (
        "SELECT id, auction, lag(price) OVER (PARTITION BY auction ORDER BY date_time, id) AS "
        "previous FROM {bid}",
    )
    * 2,
    "so_far": (
        "SELECT auction, window_start, sum(n) OVER (PARTITION BY auction, date_trunc('hour', "
        "window_start AT TIME ZONE 'UTC') ORDER BY window_start) AS so_far FROM {counts}",
        "SELECT auction, window_start, sum(n) OVER (PARTITION BY auction, date_trunc('hour', "
        "window_start AT TIME ZONE 'UTC') ORDER BY window_start) FROM (SELECT auction, "
        "count(*) AS n, date_bin('10 minutes', date_time, timestamptz 'epoch') AS window_start "
        "FROM {bid} GROUP BY 1, 3) c",
    ),
}


@given(
    rows=st.lists(
        st.tuples(st.integers(0, 3), st.integers(1, 50), st.integers(0, 3600)), max_size=40
    ),
    cuts=st.lists(st.integers(1, 6), min_size=1, max_size=8),
    order=st.randoms(use_true_random=False),
)
@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_top_n_equals_the_batch_ranking_after_every_run(
    module_strata: Strata,
    rows: list[tuple[int, int, int]],
    cuts: list[int],
    order: random.Random,
) -> None:
    strata = module_strata
    n = next(_names)
    bid = f"bid_{n}"
    strata.create(
        f"CREATE STREAM {bid} (id integer, auction integer, price integer, "
        "date_time timestamptz) WITH (event_time = 'date_time')"
    )
    counts = f"counts_{n}"
    strata.create(
        f"CREATE STREAM {counts} AS SELECT auction, count(*) AS n, window_start FROM "
        f"TUMBLE({bid}, date_time, INTERVAL '10 minutes') GROUP BY auction, window_start"
    )
    for name, (query, _) in QUERIES.items():
        statement = f"CREATE STREAM {name}_{n} AS {query.format(bid=bid, counts=counts)}"
        assert strata.create(statement)["parallelism"] == "on read"
    runs, position = [], 0
    for size in itertools.cycle(cuts):
        chunk = rows[position : position + size]
        if not chunk:
            break
        runs.append(
            [
                {
                    "id": i,
                    "auction": a,
                    "price": p,
                    "date_time": (START + timedelta(seconds=s)).isoformat(),
                }
                for i, (a, p, s) in enumerate(chunk, position)
            ]
        )
        position += size
    order.shuffle(runs)
    for run in runs:
        strata.ingest(bid, "".join(json.dumps(r) + "\n" for r in run))
        with psycopg.connect(strata.database_url) as connection:
            connection.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            for name, (_, batch) in QUERIES.items():
                got = connection.execute(f"SELECT * FROM {name}_{n}").fetchall()
                want = connection.execute(batch.format(bid=bid, counts=counts)).fetchall()
                assert sorted(map(repr, got)) == sorted(map(repr, want)), name


def test_top_n_refusals_name_the_construct(module_strata: Strata) -> None:
    strata = module_strata
    n = next(_names)
    strata.create(
        f"CREATE STREAM b_{n} (auction integer, price integer, t timestamptz) "
        "WITH (event_time = 't')"
    )

    def refused(select: str) -> str:
        response = strata.client.post(
            "/streams", json={"sql": f"CREATE STREAM bad_{next(_names)} AS {select}"}
        )
        assert response.status_code == 400, response.text
        return str(response.json()["error"])

    assert "ROW_NUMBER, RANK and DENSE_RANK" in refused(
        f"SELECT * FROM (SELECT *, lag(price) OVER (ORDER BY t) AS l, ROW_NUMBER() OVER "
        f"(ORDER BY t) AS rn FROM b_{n}) x WHERE rn < 3"
    )
    assert "filter on it" in refused(
        f"SELECT * FROM (SELECT *, ROW_NUMBER() OVER (ORDER BY price) AS rn FROM b_{n}) x"
    )
    strata.create(
        f"CREATE STREAM top_{n} AS SELECT * FROM (SELECT *, ROW_NUMBER() OVER (ORDER BY price "
        f"DESC) AS rn FROM b_{n}) x WHERE rn <= 2"
    )
    assert "computed on read" in refused(
        f"SELECT count(*) AS c, window_start FROM TUMBLE(top_{n}, t, INTERVAL '1 hour') "
        "GROUP BY window_start"
    )
