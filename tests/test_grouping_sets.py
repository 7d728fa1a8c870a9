"""GROUP BY GROUPING SETS, ROLLUP and CUBE (rewriter/grouping_sets.py), UNION ALL of
aggregates and UNION (rewriter/split_union.py): a stream per grouping set (per branch), the
union of their views on read. The four proofs: equal to PostgreSQL's own GROUPING SETS,
ROLLUP, CUBE and UNION over the raw rows after every run of shuffled runs with an hours-late one
(hypothesis); every snapshot exact while runs commit; refusals by name; the kill -9 during
a commit is in tests/test_crash_nexmark_shapes.py.
"""

from __future__ import annotations

import itertools
import random

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rewriter import rewrite
from rewriter.errors import StrataError
from rewriter.naming import altering_stream
from rewriter.rewrite import companions, planned_with_companions
from server.workers.backfill import wait_for
from server.workers.swapper import Swapper
from tests.conftest import Strata, examples
from tests.oracle import ndjson, same
from tests.test_join_subqueries import (
    BID,
    BIDS,
    CUTS,
    bid_runs,
    bid_streams,
    equal_after_every_run,
    plan_select,
    read_while_late_runs_arrive,
)

_names = itertools.count()

# The bids with the window TUMBLE(bid, date_time, INTERVAL '1 hour') gives them, for the
# oracles (TUMBLE is Strata's; the rest of each oracle is the query as written).
_HOURLY = (
    "(SELECT *, date_bin('1 hour', date_time, timestamptz 'epoch') + INTERVAL '1 hour' AS "
    "window_end FROM {bid}) AS b"
)
_DAILY = _HOURLY.replace("1 hour", "1 day")
# Each query as written; PostgreSQL runs the same text over the raw rows as its oracle.
QUERIES = {
    # per hour: every auction and bidder, every auction, and the hour (the GROUPING mask
    # says which)
    "roll": "SELECT auction, bidder, count(*) AS n, sum(price) AS s, GROUPING(auction, bidder) "
    "AS g, window_end FROM TUMBLE({bid}, date_time, INTERVAL '1 hour') GROUP BY window_end, "
    "ROLLUP (auction, bidder)",
    # over all time: every subset of (extra, auction % 3), a left-out key read through
    # coalesce, a HAVING
    "cube": "SELECT coalesce(extra, 'all') AS extra, auction % 3 AS a3, count(*) AS n, "
    "max(price) AS top FROM {bid} GROUP BY CUBE (extra, auction % 3) HAVING count(*) > 1",
    # listed sets, by SELECT position, with the empty set
    "sets": "SELECT bidder, auction, avg(price) AS mean, min(date_time) AS first FROM {bid} "
    "GROUP BY GROUPING SETS ((1), (2), (1, 2), ())",
    # a UNION ALL of two aggregates over different windows
    "grains": "SELECT 'hour' AS grain, count(*) AS n, sum(price) AS s, window_end FROM "
    "TUMBLE({bid}, date_time, INTERVAL '1 hour') GROUP BY window_end UNION ALL SELECT 'day', "
    "count(*), sum(price), window_end FROM TUMBLE({bid}, date_time, INTERVAL '1 day') "
    "GROUP BY window_end",
    # UNION removing duplicates (keys seen as auctions and as bidders, once), a branch
    # reading the stream a second time
    "keys": "SELECT auction AS k FROM {bid} WHERE price > 5 UNION SELECT bidder FROM {bid}",
    # the three largest counts over a UNION ALL of two aggregates and a UNION, on read
    "top": "SELECT 'a' AS kind, auction AS k, count(*) AS n FROM {bid} GROUP BY auction "
    "UNION ALL (SELECT 'b', bidder, count(*) FROM {bid} GROUP BY bidder UNION SELECT 'c', "
    "auction, max(price) FROM {bid} GROUP BY auction) ORDER BY n DESC, kind, k LIMIT 3",
    # UNION ALL of two projections of the same stream
    "twice": "SELECT auction AS k, date_time FROM {bid} UNION ALL SELECT bidder, date_time "
    "FROM {bid} WHERE price > 3",
}
ORACLES = {
    "roll": "SELECT auction, bidder, count(*) AS n, sum(price) AS s, GROUPING(auction, bidder) "
    f"AS g, window_end FROM {_HOURLY} GROUP BY window_end, ROLLUP (auction, bidder)",
    "grains": f"SELECT 'hour' AS grain, count(*) AS n, sum(price) AS s, window_end FROM {_HOURLY} "
    f"GROUP BY window_end UNION ALL SELECT 'day', count(*), sum(price), window_end FROM {_DAILY} "
    "GROUP BY window_end",
}


@given(bids=BIDS, cuts=CUTS, order=st.randoms(use_true_random=False))
@settings(
    max_examples=examples(8),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_grouping_sets_equal_postgres_after_every_run(
    module_strata: Strata,
    bids: list[tuple[int, int, int, int]],
    cuts: list[int],
    order: random.Random,
) -> None:
    """Random bids cut into shuffled runs, one of them late: each query equals PostgreSQL's
    own grouping sets (and UNION ALL) over the raw rows after every run."""
    bid = f"gbid_{next(_names)}"
    views = bid_streams(module_strata, bid, QUERIES, ORACLES)
    equal_after_every_run(module_strata, bid, views, bid_runs(bids, cuts, order))


def test_a_reader_sees_every_snapshot_exact_while_runs_arrive(module_strata: Strata) -> None:
    """While runs of bids (two of them hours late) commit and the reducer folds, a reader
    comparing each view with PostgreSQL's grouping sets, one snapshot after another, never
    sees them differ; each view has rows by the end."""
    strata = module_strata
    bid = f"gbid_{next(_names)}"
    oracles = bid_streams(strata, bid, QUERIES, ORACLES)
    rng = random.Random(11)
    read_while_late_runs_arrive(strata, bid, oracles, rng, 21, lambda _: f"x{rng.randrange(3)}")


REFUSED = [
    (
        "SELECT auction, count(*) AS n, window_end FROM TUMBLE(bid, date_time, INTERVAL "
        "'1 hour') GROUP BY ROLLUP (window_end, auction)",
        "every grouping set groups by the window: write the window beside the grouping sets",
    ),
    (
        "SELECT auction, count(*) AS n FROM bid GROUP BY ROLLUP (auction) ORDER BY n DESC LIMIT 3",
        "ORDER BY with ROLLUP is not supported",
    ),
    (
        "SELECT auction, bidder, extra, price % 7 AS p, date_time::date AS d, count(*) AS n "
        "FROM bid GROUP BY CUBE (auction, bidder, extra, price % 7, date_time::date, 6)",
        "GROUP BY makes 64 grouping sets, each kept as a stream of its own: at most 32",
    ),
    (
        "SELECT auction, count(*) AS n, rank() OVER (ORDER BY count(*)) AS r FROM bid "
        "GROUP BY GROUPING SETS ((auction), ())",
        "window functions with GROUPING SETS are not supported in one statement",
    ),
    (  # a branch that cannot be a stream is named
        "SELECT auction, count(*) AS n, window_end FROM TUMBLE(bid, date_time, INTERVAL "
        "'1 hour') GROUP BY window_end, ROLLUP (auction) UNION ALL SELECT auction, price, "
        "window_end FROM TUMBLE(bid, date_time, INTERVAL '1 hour') GROUP BY window_end",
        "each branch of the union (each grouping set) is planned as a stream of its own, "
        "'s__union3'",
    ),
    (
        "SELECT auction, count(*) AS n FROM bid GROUP BY auction UNION SELECT bidder, "
        "count(*) FROM bid GROUP BY bidder LIMIT 3",
        "LIMIT without ORDER BY keeps arbitrary rows",
    ),
]


@pytest.mark.parametrize("sql,fragment", REFUSED)
def test_refused_shapes_are_refused_by_name(sql: str, fragment: str) -> None:
    with pytest.raises(StrataError) as caught:
        plan_select(sql)
    assert fragment in str(caught.value)


def test_each_grouping_set_is_a_stream_made_with_the_stream() -> None:
    """Planned without a server: ROLLUP (auction, bidder) is three streams ``s__union<k>``,
    a key left out NULL of its type and grouped by as that, and the stream their union."""
    streams = {"bid": rewrite(BID, {})}
    text = (
        "CREATE STREAM s AS SELECT auction, bidder, count(*) AS n, window_end FROM "
        "TUMBLE(bid, date_time, INTERVAL '1 hour') GROUP BY window_end, ROLLUP (auction, bidder)"
    )
    made = companions(text, streams)
    assert made is not None and [c for c, _ in made[1]] == [f"s__union{k}" for k in (1, 2, 3)]
    assert "GROUP BY window_end, auction, CASE WHEN FALSE THEN bidder END" in made[1][1][1]
    plan = planned_with_companions([text], streams)["s"]
    assert plan.dependencies == ("s__union1", "s__union2", "s__union3")
    assert plan.view_query.count("UNION ALL") == 2


def test_alter_describe_and_drop_take_the_branches(module_strata: Strata) -> None:
    """ALTER STREAM from ROLLUP (three sets) to CUBE (four) builds the new branches and
    swaps them in, equal to PostgreSQL's CUBE; GET /streams/{name} and EXPLAIN STREAM list
    the branches; DROP
    STREAM takes every branch with it, and a branch alone cannot be dropped."""
    strata = module_strata
    n = next(_names)
    bid = f"abid_{n}"
    strata.create(
        f"CREATE STREAM {bid} (auction bigint, bidder bigint, price bigint, extra text, "
        "date_time timestamptz) WITH (event_time = 'date_time')"
    )
    rng = random.Random(5)
    rows = [
        {
            "auction": rng.randrange(4),
            "bidder": rng.randrange(3),
            "price": rng.randrange(1, 20),
            "extra": "x",
            "date_time": f"2024-09-01T0{rng.randrange(6)}:00:00+00:00",
        }
        for _ in range(60)
    ]
    strata.ingest(bid, ndjson(rows[:30]))
    query = "SELECT auction, bidder, count(*) AS n, sum(price) AS s FROM {bid} GROUP BY {by}"
    name = f"grouped_{n}"
    strata.create(f"CREATE STREAM {name} AS {query.format(bid=bid, by='ROLLUP (auction, bidder)')}")
    same(strata, f"SELECT * FROM {name}", query.format(bid=bid, by="ROLLUP (auction, bidder)"))
    cube = query.format(bid=bid, by="CUBE (auction, bidder)")
    altered = strata.client.post("/streams", json={"sql": f"ALTER STREAM {name} AS {cube}"})
    assert altered.status_code in (200, 202), altered.text
    wait_for(strata.service.engine, altering_stream(name))
    assert sum(Swapper(strata.service.engine, strata.service.plans).run_once().values()) > 0
    strata.ingest(bid, ndjson(rows[30:]))
    assert same(strata, f"SELECT * FROM {name}", cube) > 0
    described = strata.client.get(f"/streams/{name}").json()
    branches = [f"{name}__union{k}" for k in (1, 2, 3, 4)]
    assert described["sources"] == branches
    with psycopg.connect(strata.psql_url, autocommit=True) as connection:
        lines = [r[0] for r in connection.execute(f"EXPLAIN STREAM {name}").fetchall()]
    assert f"  Streams read: {', '.join(branches)}" in lines
    refused = strata.client.delete(f"/streams/{name}__union2")
    assert refused.status_code in (400, 409), refused.text
    assert strata.client.delete(f"/streams/{name}").status_code in (200, 204)
    left = strata.query(
        "SELECT table_name FROM information_schema.views WHERE table_name LIKE %s",
        f"{name}%",
    )
    assert left == []
