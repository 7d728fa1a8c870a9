"""Subqueries as join inputs (rewriter/split_join_inputs.py), as Nexmark writes q5 and q7:
each subquery is a stream made with the stream (``<name>__in<k>``, a query over a further
subquery with its own ``__inner``), the join is read on read over their views. The four
proofs: equal to plain PostgreSQL over the raw rows after every run of shuffled runs with
an hours-late one (hypothesis); every snapshot exact while runs commit; refused shapes
refused by name; the kill -9 during a commit is in tests/test_crash_nexmark_shapes.py.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from datetime import datetime

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rewriter import rewrite
from rewriter.errors import StrataError, UnsupportedSQL
from rewriter.rewrite import companions, planned_with_companions
from tests.conftest import Strata, examples
from tests.oracle import SnapshotReader, at, cut, late, late_runs, ndjson, same, with_a_late_run

_names = itertools.count()

# Nexmark q5 and q7 as nexmark/nexmark writes them for Flink (nexmark-flink's queries/),
# with Strata's window calls (HOP(stream, time, slide, size)) and windows of an hour.
_COUNTS = (
    "SELECT auction, count(*) AS num, window_start AS starttime, window_end AS endtime "
    "FROM HOP({bid}, date_time, INTERVAL '20 minutes', INTERVAL '1 hour') "
    "GROUP BY auction, window_start, window_end"
)
Q5 = (
    "SELECT AuctionBids.auction, AuctionBids.num FROM ({counts}) AS AuctionBids JOIN ("
    "SELECT max(CountBids.num) AS maxn, CountBids.starttime, CountBids.endtime FROM ("
    "SELECT count(*) AS num, window_start AS starttime, window_end AS endtime "
    "FROM HOP({bid}, date_time, INTERVAL '20 minutes', INTERVAL '1 hour') "
    "GROUP BY auction, window_start, window_end) AS CountBids "
    "GROUP BY CountBids.starttime, CountBids.endtime) AS MaxBids "
    "ON AuctionBids.starttime = MaxBids.starttime AND AuctionBids.endtime = MaxBids.endtime "
    "AND AuctionBids.num >= MaxBids.maxn"
)
Q7 = (
    "SELECT B.auction, B.price, B.bidder, B.date_time, B.extra FROM {bid} B JOIN ("
    "SELECT MAX(price) AS maxprice, window_end AS date_time "
    "FROM TUMBLE({bid}, date_time, INTERVAL '1 hour') GROUP BY window_start, window_end) B1 "
    "ON B.price = B1.maxprice "
    "WHERE B.date_time BETWEEN B1.date_time - INTERVAL '1 hour' AND B1.date_time"
)
# An aggregate over the join of two windowed aggregates: hot auctions per window, and
# the bids of the window they are hot in.
HOT = (
    "SELECT h.starttime, count(*) AS hot, sum(t.bids) AS bids FROM ({counts}) h "
    "JOIN (SELECT count(*) AS bids, window_start FROM HOP({bid}, date_time, "
    "INTERVAL '20 minutes', INTERVAL '1 hour') GROUP BY window_start) t "
    "ON h.starttime = t.window_start AND h.num * 3 >= t.bids GROUP BY h.starttime"
)
# The same q5 as other engines' docs write it, with WITH: the counts read twice, the
# maximum over the counts (so its companion reads a further subquery).
Q5_WITH = (
    "WITH AuctionBids AS ({counts}), MaxBids AS (SELECT max(num) AS maxn, starttime, "
    "endtime FROM AuctionBids GROUP BY starttime, endtime) "
    "SELECT AuctionBids.auction, AuctionBids.num FROM AuctionBids JOIN MaxBids "
    "ON AuctionBids.starttime = MaxBids.starttime AND AuctionBids.endtime = MaxBids.endtime "
    "AND AuctionBids.num >= MaxBids.maxn"
)
# Common table expressions in a chain, one naming its columns: the hours with bidders who
# spent 10 or more, and how many.
BIG_WITH = (
    "WITH per_bidder (who, spent, hour) AS (SELECT bidder, sum(price), window_start "
    "FROM TUMBLE({bid}, date_time, INTERVAL '1 hour') GROUP BY bidder, window_start), "
    "big AS (SELECT who, hour FROM per_bidder WHERE spent >= 10) "
    "SELECT hour, count(*) AS big_bidders FROM big GROUP BY hour"
)
# A window call reading a common table expression: the expression is a stream made with
# this one (``__with1``), aggregated per run like any stream.
TUMBLE_WITH = (
    "WITH dear AS (SELECT auction, price, date_time FROM {bid} WHERE price > 5) "
    "SELECT auction, count(*) AS n, sum(price) AS s, window_start "
    "FROM TUMBLE(dear, date_time, INTERVAL '1 hour') GROUP BY auction, window_start"
)


def _hops(bid: str) -> str:
    """The bids with each of their hopping windows, as plain PostgreSQL."""
    return (
        f"(SELECT b.*, w AS window_start, w + INTERVAL '1 hour' AS window_end FROM {bid} b, "
        "generate_series(date_bin('20 minutes', b.date_time, timestamptz 'epoch') - "
        "INTERVAL '40 minutes', date_bin('20 minutes', b.date_time, timestamptz 'epoch'), "
        "INTERVAL '20 minutes') w)"
    )


def _oracles(bid: str) -> dict[str, str]:
    """Each query as a batch over the raw rows, in plain PostgreSQL."""
    counts = (
        f"SELECT auction, count(*) AS num, window_start AS starttime, window_end AS endtime "
        f"FROM {_hops(bid)} h GROUP BY auction, window_start, window_end"
    )
    q5 = (
        f"SELECT ab.auction, ab.num FROM ({counts}) ab JOIN (SELECT max(num) AS maxn, "
        f"starttime, endtime FROM ({counts}) c GROUP BY starttime, endtime) mb "
        "ON ab.starttime = mb.starttime AND ab.endtime = mb.endtime AND ab.num >= mb.maxn"
    )
    q7 = (
        f"SELECT b.auction, b.price, b.bidder, b.date_time, b.extra FROM {bid} b JOIN ("
        "SELECT max(price) AS maxprice, date_bin('1 hour', date_time, timestamptz 'epoch') "
        f"+ INTERVAL '1 hour' AS date_time FROM {bid} GROUP BY 2) b1 "
        "ON b.price = b1.maxprice "
        "WHERE b.date_time BETWEEN b1.date_time - INTERVAL '1 hour' AND b1.date_time"
    )
    hot = (
        f"SELECT h.starttime, count(*) AS hot, sum(t.bids) AS bids FROM ({counts}) h JOIN ("
        f"SELECT count(*) AS bids, window_start FROM {_hops(bid)} x GROUP BY window_start) t "
        "ON h.starttime = t.window_start AND h.num * 3 >= t.bids GROUP BY h.starttime"
    )
    big = (
        "SELECT hour, count(*) AS big_bidders FROM (SELECT bidder AS who, sum(price) AS spent, "
        "date_bin('1 hour', date_time, timestamptz 'epoch') AS hour "
        f"FROM {bid} GROUP BY 1, 3) p WHERE spent >= 10 GROUP BY hour"
    )
    tumw = (
        "SELECT auction, count(*), sum(price), date_bin('1 hour', date_time, timestamptz "
        f"'epoch') FROM {bid} WHERE price > 5 GROUP BY 1, 4"
    )
    return {"q5": q5, "q7": q7, "hot": hot, "q5w": q5, "bigw": big, "tumw": tumw}


def _streams(strata: Strata, n: int) -> tuple[str, dict[str, str]]:
    """A stream of bids and q5, q7 and the hot count over it, and q5 and a chain written
    with WITH: the raw stream's name, and each view with the batch query it equals."""
    bid = f"jbid_{n}"
    strata.create(
        f"CREATE STREAM {bid} (auction bigint, bidder bigint, price bigint, extra text, "
        "date_time timestamptz) WITH (event_time = 'date_time')"
    )
    counts = _COUNTS.format(bid=bid)
    for query, text in (
        ("q5", Q5),
        ("q7", Q7),
        ("hot", HOT),
        ("q5w", Q5_WITH),
        ("bigw", BIG_WITH),
        ("tumw", TUMBLE_WITH),
    ):
        strata.create(f"CREATE STREAM {query}_{n} AS {text.format(bid=bid, counts=counts)}")
    return bid, {f"SELECT * FROM {q}_{n}": oracle for q, oracle in _oracles(bid).items()}


def bid_streams(
    strata: Strata, bid: str, queries: dict[str, str], oracles: dict[str, str]
) -> dict[str, str]:
    """The stream of bids ``bid`` and each of ``queries`` (``{bid}`` standing for it) as the
    stream ``<query>_<bid>``: each view with the batch query it equals (its oracle in
    ``oracles``, else its own text, which PostgreSQL runs over the raw rows)."""
    strata.create(
        f"CREATE STREAM {bid} (auction bigint, bidder bigint, price bigint, extra text, "
        "date_time timestamptz) WITH (event_time = 'date_time')"
    )
    views = {}
    for query, text in queries.items():
        strata.create(f"CREATE STREAM {query}_{bid} AS {text.format(bid=bid)}")
        views[f"SELECT * FROM {query}_{bid}"] = oracles.get(query, text).format(bid=bid)
    return views


def equal_after_every_run(
    strata: Strata, bid: str, views: dict[str, str], runs: list[list[dict]]
) -> dict[str, int]:
    """Each run ingested, each view equal to its batch query after it; the rows each view
    had at the end. One run of ``runs`` at least is late, and is taken as late."""
    compared: dict[str, int] = {}
    for run in runs:
        strata.ingest(bid, ndjson(run))
        for view, oracle in views.items():
            compared[view] = same(strata, view, oracle)
    assert late(runs, bid_time) and late_runs(strata, bid) > 0
    return compared


def bid_time(row: dict) -> datetime:
    return datetime.fromisoformat(row["date_time"])


# Bids (auction, bidder, price, second) at two instants at least, the sizes of the runs they
# are cut into, and the order they arrive in.
BIDS = st.lists(
    st.tuples(st.integers(0, 5), st.integers(0, 4), st.integers(1, 20), st.integers(0, 5 * 3600)),
    min_size=2,
    max_size=24,
).filter(lambda bids: len({t for *_, t in bids}) > 1)
CUTS = st.lists(st.integers(2, 8), min_size=1, max_size=5)


def bid_runs(
    bids: list[tuple[int, int, int, int]], cuts: list[int], order: random.Random
) -> list[list[dict]]:
    """The bids as rows, shuffled and cut into two runs at least, one of them hours late."""
    rows = [
        {"auction": a, "bidder": b, "price": p, "extra": f"x{k}", "date_time": at(t)}
        for k, (a, b, p, t) in enumerate(bids)
    ]
    order.shuffle(rows)
    runs = list(cut(rows, cuts))
    if len(runs) == 1:  # two runs at least: one behind the other
        runs = [rows[: len(rows) // 2], rows[len(rows) // 2 :]]
    return with_a_late_run(runs, bid_time)


@given(bids=BIDS, cuts=CUTS, order=st.randoms(use_true_random=False))
@settings(
    max_examples=examples(8),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_joined_subqueries_equal_their_batch_after_every_run(
    module_strata: Strata,
    bids: list[tuple[int, int, int, int]],
    cuts: list[int],
    order: random.Random,
) -> None:
    """Random bids cut into shuffled runs, one of them late: q5, q7, an aggregate over a
    join of two windowed aggregates, and q5 and a chain of common table expressions
    written with WITH, each as written, equal their batch after every run."""
    strata = module_strata
    n = next(_names)
    bid, oracles = _streams(strata, n)
    compared = equal_after_every_run(strata, bid, oracles, bid_runs(bids, cuts, order))
    # q5 and q7 always have rows (each window has a top); the hot auctions, the hours of
    # big bidders and the dear bids may have none (the snapshot test reads them with rows).
    assert all(rows for view, rows in compared.items() if "q5" in view or "q7" in view), compared


def test_a_reader_sees_every_snapshot_exact_while_runs_arrive(module_strata: Strata) -> None:
    """While runs of bids (two of them hours late) commit and the reducer folds, a reader
    comparing q5, q7 and the hot count with their batch queries, in one snapshot after
    another, never sees them differ."""
    strata = module_strata
    n = next(_names)
    bid, oracles = _streams(strata, n)
    rng = random.Random(5)
    read_while_late_runs_arrive(strata, bid, oracles, rng, 30, lambda i: f"r{i}")


def read_while_late_runs_arrive(
    strata: Strata,
    bid: str,
    oracles: dict[str, str],
    rng: random.Random,
    prices: int,
    extra: Callable[[int], str],
) -> None:
    """Eight runs of 25 bids (prices below ``prices``, run i's extra ``extra(i)``), an hour
    apart but runs 2 and 6 hours late, ingested while a reader compares every view with its
    batch query in one snapshot after another; each view has rows by the end."""
    runs = []
    for i in range(8):
        hours = i if i not in (2, 6) else i - 2  # runs 2 and 6 come hours late
        runs.append(
            [
                {
                    "auction": rng.randrange(6),
                    "bidder": rng.randrange(5),
                    "price": rng.randrange(1, prices),
                    "extra": extra(i),
                    "date_time": at((hours + 5) * 3600 + rng.randrange(3600)),
                }
                for _ in range(25)
            ]
        )
    with SnapshotReader.of(strata.database_url, oracles, min_snapshots=5):
        for run in runs:
            strata.ingest(bid, ndjson(run))
    assert late_runs(strata, bid) > 0
    for view in oracles:
        assert strata.query(view.replace("*", "count(*)", 1))[0][0] > 0, view


def test_the_companions_are_shown_and_go_with_the_stream(module_strata: Strata) -> None:
    """q5's companions (the counts, the maximum and the counts it reads) are streams of
    their own, named after q5, shown by GET /streams and EXPLAIN STREAM, and dropped with
    q5 in one transaction; a name taken refuses the whole statement."""
    strata = module_strata
    n = next(_names)
    bid, _ = _streams(strata, n)
    q5 = f"q5_{n}"
    described = strata.client.get(f"/streams/{q5}").json()
    assert described["sources"] == [f"{q5}__in1", f"{q5}__in2"]
    assert described["raw_sources"] == [bid]
    assert described["parallelism"] == "on read"
    assert f'"public"."{q5}__in1" AS auctionbids' in described["rewrite"]["view_sql"]
    inner = strata.client.get(f"/streams/{q5}__in2").json()
    assert inner["source"] == f"{q5}__in2__inner"
    assert strata.client.get(f"/streams/{q5}__in1").json()["parallelism"] == "PP"
    assert strata.client.get(f"/streams/{q5}__in1").json()["dependents"] == [q5]
    with psycopg.connect(strata.psql_url, autocommit=True) as connection:
        lines = [r[0] for r in connection.execute(f"EXPLAIN STREAM {q5}").fetchall()]
    assert any(f"{q5}__in2" in line for line in lines), lines
    assert lines[0].startswith(f"Derived stream {q5} (on read)")
    # A companion's name taken: nothing of the statement is made.
    strata.create(f"CREATE STREAM taken_{n}__in2 AS SELECT auction FROM {bid}")
    refused = strata.client.post(
        "/streams",
        json={
            "sql": f"CREATE STREAM taken_{n} AS "
            + Q5.format(bid=bid, counts=_COUNTS.format(bid=bid))
        },
    )
    assert refused.status_code == 409, refused.text
    assert f"taken_{n}__in2" in refused.json()["error"]
    assert strata.client.get(f"/streams/taken_{n}__in1").status_code == 404
    # A companion is part of its stream: it is dropped with it, not alone.
    alone = strata.client.delete(f"/streams/{q5}__in1")
    assert alone.status_code == 409 and q5 in alone.json()["error"]
    dropped = strata.client.delete(f"/streams/{q5}")
    assert dropped.status_code == 200
    for made_with in (q5, f"{q5}__in1", f"{q5}__in2", f"{q5}__in2__inner"):
        assert strata.client.get(f"/streams/{made_with}").status_code == 404
    assert strata.query("SELECT relname FROM pg_class WHERE relname LIKE %s", f"q5\\_{n}%") == []
    assert strata.client.get(f"/streams/q7_{n}").status_code == 200  # not made with it


def test_a_window_call_over_a_cte_reads_a_stream_made_with_it(module_strata: Strata) -> None:
    """``FROM TUMBLE(dear, ...)`` over ``WITH dear AS (...)``: the expression is the stream
    ``<name>__with1``, shown as the stream's source, dropped with it and not alone."""
    strata = module_strata
    n = next(_names)
    bid, _ = _streams(strata, n)
    tumw = f"tumw_{n}"
    described = strata.client.get(f"/streams/{tumw}").json()
    assert described["source"] == f"{tumw}__with1", described
    assert described["parallelism"] == "PP"
    made = strata.client.get(f"/streams/{tumw}__with1").json()
    assert made["dependents"] == [tumw] and "price > 5" in made["sql"], made
    alone = strata.client.delete(f"/streams/{tumw}__with1")
    assert alone.status_code == 409 and tumw in alone.json()["error"]
    assert strata.client.delete(f"/streams/{tumw}").status_code == 200
    for made_with in (tumw, f"{tumw}__with1"):
        assert strata.client.get(f"/streams/{made_with}").status_code == 404
    assert strata.client.get(f"/streams/{bid}").status_code == 200


BID = (
    "CREATE STREAM bid (auction bigint, bidder bigint, price bigint, extra text, "
    "date_time timestamptz) WITH (event_time = 'date_time')"
)
_WINDOWED = (
    "(SELECT max(price) AS top, window_end FROM TUMBLE(bid, date_time, INTERVAL '1 hour') "
    "GROUP BY window_end)"
)
REFUSED = [
    (
        f"SELECT b.auction FROM TUMBLE(bid, date_time, INTERVAL '1 hour') b JOIN {_WINDOWED} m "
        "ON b.price = m.top",
        "TUMBLE(...) as a join input beside a subquery is not supported: write the input as "
        "a subquery",
    ),
    (
        f"SELECT b.auction FROM bid b JOIN {_WINDOWED} m ON b.price = m.top ORDER BY b.auction",
        "in a join of subqueries: ORDER BY is not supported",
    ),
    (
        f"SELECT b.auction, rank() OVER (ORDER BY b.price) AS r FROM bid b JOIN {_WINDOWED} m "
        "ON b.price = m.top",
        "in a join of subqueries: the window function",
    ),
    (
        f"SELECT b.auction FROM bid b JOIN {_WINDOWED} m ON b.price = m.top "
        "WHERE b.auction NOT IN (SELECT c.auction FROM bid c WHERE c.bidder < b.bidder)",
        "NOT IN (subquery) is not supported here",
    ),
    (
        f"SELECT * FROM bid b JOIN {_WINDOWED} m ON b.price = m.top JOIN {_WINDOWED} k "
        "ON k.top = m.top",
        "the join selects two columns named 'top': name one of them with AS",
    ),
    (
        f"SELECT b.auction FROM bid b JOIN {_WINDOWED} b ON b.price = b.top",
        "'b' names two inputs of the join",
    ),
    (
        f"SELECT s.auction FROM prices s JOIN {_WINDOWED} m ON s.price = m.top",
        "'prices AS s' is not a stream",
    ),
    (  # q9's shape over a join with a subquery: the ranked rows' columns must be named
        "SELECT * FROM (SELECT b.*, ROW_NUMBER() OVER (PARTITION BY b.auction ORDER BY b.price "
        f"DESC) AS rn FROM bid b JOIN {_WINDOWED} m ON b.price = m.top) t WHERE rn <= 1",
        "names the columns it ranks: SELECT * is not supported there; list them, as in SELECT",
    ),
]


def plan_select(sql: str) -> None:
    """Plan ``sql`` (a SELECT) as the server would: its companions first."""
    planned_with_companions([BID, f"CREATE STREAM s AS {sql}"], {})


@pytest.mark.parametrize("sql,fragment", REFUSED)
def test_refused_shapes_are_refused_by_name(sql: str, fragment: str) -> None:
    with pytest.raises(StrataError) as caught:
        plan_select(sql)
    assert fragment in str(caught.value)


def test_nexmark_q5_and_q7_plan_into_companions() -> None:
    """Planned without a server: each subquery is a companion, q5's maximum one with its own."""
    streams = {"bid": rewrite(BID, {})}
    counts = _COUNTS.format(bid="bid")
    made = companions(f"CREATE STREAM q5 AS {Q5.format(bid='bid', counts=counts)}", streams)
    assert made is not None and [c for c, _ in made[1]] == ["q5__in1", "q5__in2"]
    nested = companions(made[1][1][1], streams)
    assert nested is not None and [c for c, _ in nested[1]] == ["q5__in2__inner"]
    made = companions(f"CREATE STREAM q7 AS {Q7.format(bid='bid')}", streams)
    assert made is not None and [c for c, _ in made[1]] == ["q7__in2"]
    with pytest.raises(UnsupportedSQL, match="choose a shorter name"):
        rewrite("CREATE STREAM " + "x" * 47 + f" AS {Q7.format(bid='bid')}", streams)


def test_flinks_window_join_as_written_equals_its_batch(module_strata: Strata) -> None:
    """Flink's window join as its documentation writes it (each side ``SELECT * FROM
    TABLE(TUMBLE(TABLE s, DESCRIPTOR(t), INTERVAL '5' MINUTES))`` in parentheses, joined on
    the key and the window), inner and left, equals its batch after every run, one late.
    (A FULL window join is refused: its padded rows would have no event time.)"""
    strata = module_strata
    n = next(_names)
    left, right = f"wl_{n}", f"wr_{n}"
    for name in (left, right):
        strata.create(
            f"CREATE STREAM {name} (num bigint, id text, row_time timestamptz) "
            "WITH (event_time = 'row_time')"
        )
    side = "(SELECT * FROM TABLE(TUMBLE(TABLE {}, DESCRIPTOR(row_time), INTERVAL '5' MINUTES)))"
    on = "ON L.num = R.num AND L.window_start = R.window_start AND L.window_end = R.window_end"
    batch_side = (
        "(SELECT *, date_bin('5 minutes', row_time, timestamptz 'epoch') AS window_start, "
        "date_bin('5 minutes', row_time, timestamptz 'epoch') + INTERVAL '5 minutes' AS "
        "window_end FROM {})"
    )
    oracles = {}
    for kind in ("JOIN", "LEFT JOIN"):
        query = (
            "SELECT L.num AS l_num, L.id AS l_id, R.num AS r_num, R.id AS r_id, "
            "L.window_start FROM {} L " + kind + " {} R " + on
        )
        stream = f"wj_{n}_{'left' if kind != 'JOIN' else 'inner'}"
        strata.create(
            f"CREATE STREAM {stream} AS " + query.format(side.format(left), side.format(right))
        )
        oracles[f"SELECT * FROM {stream}"] = query.format(
            batch_side.format(left), batch_side.format(right)
        )
    rng = random.Random(8)
    runs = []
    for i in range(6):
        minutes = i * 4 if i != 4 else 1  # run 4 comes late
        runs.append(
            (
                left if i % 2 == 0 else right,
                [
                    {
                        "num": rng.randrange(4),
                        "id": f"{i}-{k}",
                        "row_time": at(minutes * 60 + rng.randrange(240)),
                    }
                    for k in range(6)
                ],
            )
        )
    for stream, rows in runs:
        strata.ingest(stream, ndjson(rows))
        for view, oracle in oracles.items():
            same(strata, view, oracle)
    assert late_runs(strata, left) > 0
    assert all(strata.query(v.replace("*", "count(*)", 1))[0][0] > 0 for v in oracles)


def test_select_distinct_is_a_stream_of_groups_equal_to_its_batch(module_strata: Strata) -> None:
    """SELECT DISTINCT without aggregates (the rows once each, over all time or per window)
    is the same query grouped by its columns: equal to PostgreSQL's SELECT DISTINCT over the
    raw rows after every run, one of them late."""
    strata = module_strata
    n = next(_names)
    bid, _ = _streams(strata, n)
    queries = {
        f"pairs_{n}": f"SELECT DISTINCT auction, bidder FROM {bid}",
        f"hourly_{n}": f"SELECT DISTINCT bidder, window_start FROM TUMBLE({bid}, date_time, "
        "INTERVAL '1 hour')",
    }
    for name, query in queries.items():
        strata.create(f"CREATE STREAM {name} AS {query}")
    oracles = {
        f"SELECT * FROM pairs_{n}": f"SELECT DISTINCT auction, bidder FROM {bid}",
        f"SELECT * FROM hourly_{n}": "SELECT DISTINCT bidder, date_bin('1 hour', date_time, "
        f"timestamptz 'epoch') FROM {bid}",
    }
    rng = random.Random(2)
    for i in range(5):
        hours = i if i != 3 else 0  # run 3 comes late
        rows = [
            {
                "auction": rng.randrange(4),
                "bidder": rng.randrange(3),
                "price": 1,
                "extra": "d",
                "date_time": at(hours * 3600 + rng.randrange(3600)),
            }
            for _ in range(8)
        ]
        strata.ingest(bid, ndjson(rows))
        for view, oracle in oracles.items():
            same(strata, view, oracle)
    assert late_runs(strata, bid) > 0
