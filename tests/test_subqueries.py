"""A subquery in FROM is planned as a stream of its own, and the outer query reads it on
read: Nexmark q4 (the average winning bid per category: an aggregate over an aggregate
over a join) and a maximum over a windowed count equal the same queries run as a batch
over the raw views, after every run of shuffled, hours-late runs."""

from __future__ import annotations

import itertools
import json
import random
from datetime import datetime

import psycopg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import Strata, examples
from tests.oracle import SnapshotReader, at, cut, late, late_runs, ndjson, same, with_a_late_run

_names = itertools.count()


def _auctions_and_bids(strata: Strata, n: int) -> tuple[str, str]:
    """Two raw streams of Nexmark's shape, named apart by ``n``."""
    auction, bid = f"auction_{n}", f"bid_{n}"
    strata.create(
        f"CREATE STREAM {auction} (id bigint, category integer, date_time timestamptz, "
        "expires timestamptz) WITH (event_time = 'date_time')"
    )
    strata.create(
        f"CREATE STREAM {bid} (auction bigint, bidder bigint, price bigint, "
        "date_time timestamptz) WITH (event_time = 'date_time')"
    )
    return auction, bid


def test_nexmark_q4_and_a_max_over_a_windowed_count(module_strata: Strata) -> None:
    strata = module_strata
    n = next(_names)
    auction, bid = _auctions_and_bids(strata, n)
    inner = (
        f"SELECT max(b.price) AS final, a.category FROM {auction} a JOIN {bid} b "
        "ON a.id = b.auction AND b.date_time BETWEEN a.date_time AND a.expires "
        "GROUP BY a.id, a.category"
    )
    q4 = f"SELECT q.category, avg(q.final) AS avg_price FROM ({inner}) q GROUP BY q.category"
    described = strata.create(f"CREATE STREAM q4_{n} AS {q4}")
    assert described["source"] == f"q4_{n}__inner"
    counts = (
        f"SELECT bidder, count(*) AS bids, window_start FROM TUMBLE({bid}, date_time, "
        "INTERVAL '1 hour') GROUP BY bidder, window_start"
    )
    busiest = f"SELECT max(bids) AS top, window_start FROM ({counts}) c GROUP BY window_start"
    strata.create(f"CREATE STREAM busiest_{n} AS {busiest}")
    rng = random.Random(4)
    runs = []
    for start in range(0, 30, 5):
        rows = []
        for key in range(start, start + 5):
            opened = rng.uniform(0, 5 * 3600)
            rows.append(
                {
                    "id": key,
                    "category": rng.randrange(3),
                    "date_time": at(opened),
                    "expires": at(opened + 3600),
                }
            )
        runs.append((auction, rows))
    for _ in range(10):
        rows = [
            {
                "auction": rng.randrange(32),
                "bidder": rng.randrange(6),
                "price": rng.randrange(1, 1000),
                "date_time": at(rng.uniform(0, 6 * 3600)),
            }
            for _ in range(10)
        ]
        runs.append((bid, rows))
    rng.shuffle(runs)
    oracle_busiest = (
        f"SELECT max(bids), w FROM (SELECT bidder, count(*) AS bids, date_bin('1 hour', "
        f"date_time, timestamptz 'epoch') AS w FROM {bid} GROUP BY 1, 3) c GROUP BY w"
    )
    for stream, rows in runs:
        strata.ingest(stream, "".join(json.dumps(r) + "\n" for r in rows))
        with psycopg.connect(strata.database_url) as connection:
            connection.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            for view, oracle in (
                (f"SELECT category, avg_price FROM q4_{n}", q4),
                (f"SELECT top, window_start FROM busiest_{n}", oracle_busiest),
            ):
                got = sorted(map(repr, connection.execute(view).fetchall()))
                want = sorted(map(repr, connection.execute(oracle).fetchall()))
                assert got == want, view
    assert strata.query(f"SELECT count(*) FROM q4_{n}")[0][0] > 0
    # The streams made with q4 go with it, their views and archives too.
    dropped = strata.client.delete(f"/streams/q4_{n}")
    assert dropped.status_code == 200 and dropped.json() == {"name": f"q4_{n}", "dropped": True}
    for made_with in (f"q4_{n}", f"q4_{n}__inner", f"q4_{n}__inner__rows"):
        assert strata.client.get(f"/streams/{made_with}").status_code == 404
    assert strata.query("SELECT relname FROM pg_class WHERE relname LIKE %s", f"q4\\_{n}%") == []
    assert strata.client.get(f"/streams/busiest_{n}").status_code == 200  # not made with it


@st.composite
def auctions_and_bids(
    draw: st.DrawFn,
) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int, int]]]:
    """Auctions (category, opened, length) and bids (auction, bidder, price, time), one bid
    at least within its auction's time, so that the join has a row to give."""
    auctions = draw(
        st.lists(
            st.tuples(st.integers(0, 2), st.integers(0, 4 * 3600), st.integers(60, 3600)),
            min_size=1,
            max_size=10,
        )
    )
    bids = draw(
        st.lists(
            st.tuples(
                st.integers(0, 11), st.integers(0, 4), st.integers(1, 50), st.integers(0, 5 * 3600)
            ),
            min_size=1,
            max_size=30,
        )
    )
    key = draw(st.integers(0, len(auctions) - 1))
    _category, opened, length = auctions[key]
    within = draw(st.integers(opened, opened + length))
    return auctions, [*bids, (key, draw(st.integers(0, 4)), draw(st.integers(1, 50)), within)]


def _with_a_late_bid_run(
    ingests: list[tuple[str, list[dict]]], bid: str
) -> list[tuple[str, list[dict]]]:
    """``ingests`` (stream, rows) with two runs of bids at least (the only one cut in two),
    one at least arriving late (behind a bid an earlier run held)."""
    ingests = list(ingests)
    places = [k for k, (stream, _rows) in enumerate(ingests) if stream == bid]
    if len(places) == 1:
        rows = ingests[places[0]][1]
        half = len(rows) // 2
        ingests[places[0] : places[0] + 1] = [(bid, rows[:half]), (bid, rows[half:])]
        places = [places[0], places[0] + 1]
    runs = with_a_late_run([ingests[k][1] for k in places], _bid_time)
    for k, rows in zip(places, runs, strict=True):
        ingests[k] = (bid, list(rows))
    return ingests


def _bid_time(row: dict) -> datetime:
    return datetime.fromisoformat(row["date_time"])


@given(
    # Two bid times at least: a run of bids can then arrive behind another.
    data=auctions_and_bids().filter(lambda data: len({t for *_, t in data[1]}) > 1),
    cuts=st.lists(st.integers(1, 6), min_size=1, max_size=5),
    order=st.randoms(use_true_random=False),
)
@settings(
    max_examples=examples(8),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_subqueries_and_rankings_of_joins_equal_their_batch_after_every_run(
    module_strata: Strata,
    data: tuple[list[tuple[int, int, int]], list[tuple[int, int, int, int]]],
    cuts: list[int],
    order: random.Random,
) -> None:
    """Random auctions and bids, cut into runs, shuffled: an aggregate over an aggregate over
    a join (q4), a ranking of a join's rows (q9) and a ranking of windowed counts (q5) equal
    the same queries as batches after every run."""
    strata = module_strata
    auctions, bids = data
    n = next(_names)
    auction, bid = _auctions_and_bids(strata, n)
    join = (
        f"FROM {auction} a JOIN {bid} b ON a.id = b.auction AND b.date_time BETWEEN "
        "a.date_time AND a.expires"
    )
    q4 = (
        f"SELECT q.category, avg(q.final) AS mean, count(*) AS auctions FROM (SELECT "
        f"max(b.price) AS final, a.category {join} GROUP BY a.id, a.category) q "
        "GROUP BY q.category"
    )
    q9 = (
        f"SELECT id, price, bidder, bid_time FROM (SELECT a.id, b.price, b.bidder, a.date_time, "
        "b.date_time AS bid_time, ROW_NUMBER() OVER (PARTITION BY a.id ORDER BY b.price DESC, "
        f"b.date_time, b.bidder) AS rn {join}) t WHERE rn <= 2"
    )
    # q9 as Nexmark writes it: the auction's columns by a.*, the rank over all of them.
    q9_star = (
        "SELECT * FROM (SELECT a.*, b.auction, b.bidder, b.price, b.date_time AS bid_time, "
        "ROW_NUMBER() OVER (PARTITION BY a.id ORDER BY b.price DESC, b.date_time, b.bidder) "
        f"AS rn {join}) t WHERE rn <= 1"
    )
    counts = "SELECT bidder, count(*) AS num, window_start FROM {} GROUP BY bidder, window_start"
    q5 = (
        "SELECT bidder, num, window_start FROM (SELECT bidder, num, window_start, RANK() OVER "
        "(PARTITION BY window_start ORDER BY num DESC) AS r FROM ({}) c) t WHERE r = 1"
    )
    strata.create(f"CREATE STREAM hq4_{n} AS {q4}")
    strata.create(f"CREATE STREAM hq9_{n} AS {q9}")
    strata.create(f"CREATE STREAM hq9s_{n} AS {q9_star}")
    strata.create(
        f"CREATE STREAM hq5_{n} AS "
        + q5.format(counts.format(f"TUMBLE({bid}, date_time, INTERVAL '1 hour')"))
    )
    windowed = (
        f"(SELECT *, date_bin('1 hour', date_time, timestamptz 'epoch') AS window_start "
        f"FROM {bid}) w"
    )
    oracles = {
        f"SELECT * FROM hq4_{n}": q4,
        f"SELECT * FROM hq9_{n}": _highest_bids(
            auction, bid, "a.id, b.price, b.bidder, b.bid_time", 2
        ),
        f"SELECT * FROM hq9s_{n}": _highest_bids(
            auction, bid, "a.*, b.auction, b.bidder, b.price, b.bid_time, 1", 1
        ),
        f"SELECT * FROM hq5_{n}": q5.format(counts.format(windowed)),
    }
    rows = [
        (
            auction,
            {
                "id": key,
                "category": category,
                "date_time": at(opened),
                "expires": at(opened + length),
            },
        )
        for key, (category, opened, length) in enumerate(auctions)
    ] + [(bid, {"auction": a, "bidder": b, "price": p, "date_time": at(t)}) for a, b, p, t in bids]
    order.shuffle(rows)
    ingests = [
        (stream, [row for s, row in chunk if s == stream])
        for chunk in cut(rows, cuts)
        for stream in (auction, bid)
    ]
    ingests = _with_a_late_bid_run([(s, mine) for s, mine in ingests if mine], bid)
    compared: dict[str, int] = {}
    for stream, mine in ingests:
        strata.ingest(stream, ndjson(mine))
        for view, oracle in oracles.items():
            compared[view] = same(strata, view, oracle)
    # The example proved something: rows in every view, and a run of bids that came late.
    assert all(compared.values()), compared
    bid_runs = [mine for stream, mine in ingests if stream == bid]
    assert late(bid_runs, _bid_time) and late_runs(strata, bid) > 0


def _highest_bids(auction: str, bid: str, columns: str, top: int) -> str:
    """The batch query of q9's rankings written without a window function: for each auction
    row, its ``top`` highest bids within its time (price down, then time and bidder) taken
    by a LATERAL subquery's ORDER BY ... LIMIT, and the ``columns`` of each."""
    return (
        f"SELECT {columns} FROM {auction} a CROSS JOIN LATERAL (SELECT auction, bidder, price, "
        f"date_time AS bid_time FROM {bid} WHERE auction = a.id AND date_time BETWEEN "
        f"a.date_time AND a.expires ORDER BY price DESC, date_time, bidder LIMIT {top}) b"
    )


def test_a_reader_sees_q9_as_written_exact_in_every_snapshot(module_strata: Strata) -> None:
    """While runs of auctions and bids (two of the bids' hours late) commit and the reducer
    folds, a reader comparing q9 as Nexmark writes it (``a.*`` inside a ranking over the
    join) with its batch query, in one snapshot after another, never sees them differ."""
    strata = module_strata
    n = next(_names)
    auction, bid = _auctions_and_bids(strata, n)
    q9 = (
        "SELECT * FROM (SELECT a.*, b.auction, b.bidder, b.price, b.date_time AS bid_time, "
        "ROW_NUMBER() OVER (PARTITION BY a.id ORDER BY b.price DESC, b.date_time, b.bidder) "
        f"AS rownum FROM {auction} a JOIN {bid} b ON a.id = b.auction AND b.date_time "
        "BETWEEN a.date_time AND a.expires) t WHERE rownum <= 1"
    )
    strata.create(f"CREATE STREAM sq9_{n} AS {q9}")
    oracle = _highest_bids(auction, bid, "a.*, b.auction, b.bidder, b.price, b.bid_time, 1", 1)
    rng = random.Random(11)
    runs: list[tuple[str, list[dict]]] = []
    for hour in range(6):
        opened = [hour * 3600 + rng.randrange(3600) for _ in range(4)]
        runs.append(
            (
                auction,
                [
                    {
                        "id": hour * 4 + k,
                        "category": k % 3,
                        "date_time": at(t),
                        "expires": at(t + 5400),
                    }
                    for k, t in enumerate(opened)
                ],
            )
        )
        late_hours = hour - 3 if hour in (4, 5) else hour  # two runs of bids hours late
        runs.append(
            (
                bid,
                [
                    {
                        "auction": rng.randrange(24),
                        "bidder": rng.randrange(5),
                        "price": rng.randrange(1, 40),
                        "date_time": at(late_hours * 3600 + rng.randrange(3600)),
                    }
                    for _ in range(20)
                ],
            )
        )
    with SnapshotReader.of(
        strata.database_url, {f"SELECT * FROM sq9_{n}": oracle}, min_snapshots=5
    ):
        for stream, rows in runs:
            strata.ingest(stream, ndjson(rows))
    assert late_runs(strata, bid) > 0
    assert strata.query(f"SELECT count(*) FROM sq9_{n}")[0][0] > 0
