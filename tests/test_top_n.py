"""Top-N and dedup, and other window functions, are exact under any lateness: a late row
that pushes another out of the first N, or changes a row's neighbours, does so at once.
Each view equals a Python model of its query over the rows sent so far (rankings with their
ties broken as the query says, lag, LIMIT, running sums), after every run of shuffled splits
(real PostgreSQL, real Spark ingest). The views are their SELECTs over the source's view, so
the same SQL run by PostgreSQL would be no oracle."""

from __future__ import annotations

import itertools
import random
from collections import defaultdict
from datetime import datetime, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import Strata, examples
from tests.oracle import START, at, cut, ndjson
from tests.test_joins import another, equals_model, with_a_late_run

_names = itertools.count()

# name: (the stream's SELECT, the columns the test reads from its view)
QUERIES = {
    "top3": (
        "SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY auction ORDER BY price DESC, "
        "id) AS rn FROM {bid}) t WHERE rn <= 3",
        "id, auction, price, date_time, rn",
    ),
    "first_bid": (
        "SELECT auction, id, price FROM (SELECT auction, id, price, ROW_NUMBER() OVER "
        "(PARTITION BY auction ORDER BY date_time, id) AS rn FROM {bid}) t WHERE rn = 1",
        "auction, id, price",
    ),
    "hottest": (
        "SELECT auction, price, window_start FROM (SELECT auction, price, window_start, "
        "RANK() OVER (PARTITION BY window_start ORDER BY price DESC) AS r FROM "
        "TUMBLE({bid}, date_time, INTERVAL '10 minutes') b) x WHERE r = 1",
        "auction, price, window_start",
    ),
    "dear": (
        "SELECT id, price FROM {bid} WHERE price > 10 ORDER BY price DESC, id LIMIT 5",
        "id, price",
    ),
    # PostgreSQL's dedup, DISTINCT ON: the first row of each key in the ORDER BY's order,
    # over the raw rows, their TUMBLE windows (keys and order by alias and position), and an
    # aggregate stream's rows (every column, by *).
    "latest": (
        "SELECT DISTINCT ON (auction) auction, id, price FROM {bid} "
        "ORDER BY auction, date_time DESC, id DESC",
        "auction, id, price",
    ),
    "dearest_in_window": (
        "SELECT DISTINCT ON (w, auction) window_start AS w, auction, price * 2 AS p FROM "
        "TUMBLE({bid}, date_time, INTERVAL '10 minutes') b ORDER BY 1, 2, p DESC, id",
        "w, auction, p",
    ),
    "busiest": (
        "SELECT DISTINCT ON (window_start) * FROM {counts} ORDER BY window_start, n DESC, auction",
        "window_start, auction, n",
    ),
    # Other window functions, on read too: over the raw rows, and running sums over an
    # aggregate stream's windows (what a cumulating window gives).
    "previous": (
        "SELECT id, auction, lag(price) OVER (PARTITION BY auction ORDER BY date_time, id) AS "
        "previous FROM {bid}",
        "id, auction, previous",
    ),
    "so_far": (
        "SELECT auction, window_start, sum(n) OVER (PARTITION BY auction, date_trunc('hour', "
        "window_start AT TIME ZONE 'UTC') ORDER BY window_start) AS so_far FROM {counts}",
        "auction, window_start, so_far",
    ),
}

Bid = tuple[int, int, int, int]  # id, auction, price, seconds after START


def model(bids: list[Bid]) -> dict[str, list[tuple]]:
    """Each query of QUERIES computed in Python over ``bids``: name -> its rows."""
    by_auction: dict[int, list[Bid]] = defaultdict(list)
    for bid in bids:
        by_auction[bid[1]].append(bid)
    by_price = {a: sorted(rows, key=lambda b: (-b[2], b[0])) for a, rows in by_auction.items()}
    by_time = {a: sorted(rows, key=lambda b: (b[3], b[0])) for a, rows in by_auction.items()}

    def time(seconds: int) -> datetime:
        return START + timedelta(seconds=seconds)

    def window(seconds: int, size: int) -> int:  # START is a multiple of an hour since epoch
        return seconds - seconds % size

    top3 = [
        (i, a, p, time(s), rank)
        for rows in by_price.values()
        for rank, (i, a, p, s) in enumerate(rows[:3], 1)
    ]
    first_bid = [(a, rows[0][0], rows[0][2]) for a, rows in by_time.items()]
    windows: dict[int, list[Bid]] = defaultdict(list)
    for bid in bids:
        windows[window(bid[3], 600)].append(bid)
    hottest = [  # RANK() = 1: every bid at the window's highest price
        (a, p, time(w))
        for w, rows in windows.items()
        for _, a, p, _ in rows
        if p == max(b[2] for b in rows)
    ]
    dear = [(i, p) for i, _, p, _ in sorted(bids, key=lambda b: (-b[2], b[0])) if p > 10][:5]
    previous = [
        (i, a, rows[k - 1][2] if k else None)
        for rows in by_time.values()
        for k, (i, a, _, _) in enumerate(rows)
    ]
    counts: dict[tuple[int, int], int] = defaultdict(int)  # (auction, window) -> bids
    for _, a, _, s in bids:
        counts[a, window(s, 600)] += 1
    so_far = []
    for (a, w), _ in sorted(counts.items()):
        hour = window(w, 3600)
        total = sum(c for (b, v), c in counts.items() if b == a and hour <= v <= w)
        so_far.append((a, time(w), total))
    latest = [
        (a, i, p)
        for i, a, p, _ in (max(rows, key=lambda b: (b[3], b[0])) for rows in by_time.values())
    ]
    in_window: dict[tuple[int, int], list[Bid]] = defaultdict(list)
    for bid in bids:
        in_window[window(bid[3], 600), bid[1]].append(bid)
    dearest_in_window = [
        (time(w), a, 2 * min(rows, key=lambda b: (-b[2], b[0]))[2])
        for (w, a), rows in in_window.items()
    ]
    by_window: dict[int, list[tuple[int, int]]] = defaultdict(list)  # window -> (auction, bids)
    for (a, w), n in counts.items():
        by_window[w].append((a, n))
    busiest = [
        (time(w), *min(pairs, key=lambda pair: (-pair[1], pair[0])))
        for w, pairs in by_window.items()
    ]
    return {
        "latest": latest,
        "dearest_in_window": dearest_in_window,
        "busiest": busiest,
        "top3": top3,
        "first_bid": first_bid,
        "hottest": hottest,
        "dear": dear,
        "previous": previous,
        "so_far": so_far,
    }


@st.composite
def bids(draw: st.DrawFn, size: int) -> list[tuple[int, int, int]]:
    """Bids (auction, price, seconds), at least two and at two distinct times at least (so
    that some order of the runs makes one late)."""
    rows = draw(
        st.lists(
            st.tuples(st.integers(0, 3), st.integers(1, 50), st.integers(0, 3600)),
            min_size=1,
            max_size=size - 1,
        )
    )
    other = (draw(st.integers(0, 3)), draw(st.integers(1, 50)), another(draw, rows[0][2], 3600))
    rows.insert(draw(st.integers(0, len(rows))), other)
    return rows


@given(
    rows=bids(size=40),
    cuts=st.lists(st.integers(1, 6), min_size=1, max_size=8),
    order=st.randoms(use_true_random=False),
)
@settings(
    max_examples=examples(10),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_top_n_equals_the_model_ranking_after_every_run(
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
    bids = [(i, a, p, s) for i, (a, p, s) in enumerate(rows)]
    # At least two runs (no run holds every row), one of them late.
    runs = list(cut(bids, [min(size, len(bids) - 1) for size in cuts]))
    order.shuffle(runs)
    runs = with_a_late_run(runs, lambda row: row[3])
    sent: list[Bid] = []
    for run in runs:
        strata.ingest(
            bid,
            ndjson([{"id": i, "auction": a, "price": p, "date_time": at(s)} for i, a, p, s in run]),
        )
        sent += run
        want = model(sent)
        equals_model(
            strata,
            {
                f"SELECT {columns} FROM {name}_{n}": want[name]
                for name, (_, columns) in QUERIES.items()
            },
        )
    assert model(sent)["top3"], "the example ranks nothing"


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
    # Kept per window of an aggregate stream: not a source either.
    strata.create(
        f"CREATE STREAM per_{n} AS SELECT auction, count(*) AS c, window_end AS t "
        f"FROM TUMBLE(b_{n}, t, INTERVAL '1 minute') GROUP BY auction, window_end"
    )
    strata.create(
        f"CREATE STREAM lead_{n} AS SELECT auction, c, t FROM (SELECT auction, c, t, "
        f"ROW_NUMBER() OVER (PARTITION BY t ORDER BY c DESC, auction) AS rn FROM per_{n}) x "
        "WHERE rn <= 1"
    )
    assert strata.client.get(f"/streams/lead_{n}").json()["parallelism"] == "SP"
    assert "keeps the first rows of each window" in refused(
        f"SELECT count(*) AS n, window_end FROM TUMBLE(lead_{n}, t, INTERVAL '1 hour') "
        "GROUP BY window_end"
    )
    # Nor followed by the change feed, which tells an aggregate's rows apart by window and
    # key: the first N of a window have no key of their own.
    feed = strata.client.get(f"/streams/lead_{n}/changes")
    assert feed.status_code == 400 and "aggregate streams" in feed.json()["error"]
    # DISTINCT ON: which row of each key must be said, as PostgreSQL orders it.
    assert "arbitrary row per key" in refused(f"SELECT DISTINCT ON (auction) * FROM b_{n}")
    assert "must match initial ORDER BY" in refused(
        f"SELECT DISTINCT ON (auction) * FROM b_{n} ORDER BY t, auction"
    )
    assert "join or aggregate in a stream of its own first" in refused(
        f"SELECT DISTINCT ON (auction) auction, max(price) AS m FROM b_{n} GROUP BY auction "
        "ORDER BY auction"
    )
