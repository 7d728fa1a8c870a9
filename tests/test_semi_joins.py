"""IN, NOT IN, EXISTS and NOT EXISTS (subquery) in WHERE, planned as the semi-joins and
anti-joins they are (rewriter/semi_joins.py): the subquery's distinct values (or keys) a
stream made with the stream, joined on read (NOT IN also with the subquery's counts of rows
and of values that are not NULL). The four proofs: equal to PostgreSQL's own IN, NOT IN,
EXISTS and NOT EXISTS over the raw rows after every run of shuffled runs with an hours-late
one (hypothesis); every snapshot exact while runs commit; the shapes left refused refused
by name; the kill -9 during a commit is in tests/test_crash_nexmark_shapes.py.
"""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rewriter import rewrite
from rewriter.errors import StrataError
from rewriter.rewrite import companions
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

# Each query as written; PostgreSQL runs the same text over the raw rows as its oracle.
QUERIES = {
    # the bids on auctions that drew a bid of 15 or more, but bidder 2's
    "dear": "SELECT * FROM {bid} WHERE auction IN (SELECT auction FROM {bid} WHERE price >= 15) "
    "AND bidder <> 2",
    # per bidder, the bids on auctions with three bids or more (an aggregate over the
    # semi-join, its values an aggregate themselves)
    "busy": "SELECT bidder, count(*) AS n, sum(price) AS s FROM {bid} b WHERE b.auction IN "
    "(SELECT auction FROM {bid} GROUP BY auction HAVING count(*) >= 3) GROUP BY bidder",
    # two IN conditions, one over a common table expression
    "both": "WITH hot AS (SELECT auction FROM {bid} WHERE price > 17) SELECT auction, price, "
    "date_time FROM {bid} WHERE auction IN (SELECT auction FROM hot) AND bidder IN "
    "(SELECT bidder FROM {bid} WHERE extra = 'x0' OR price = 1)",
    # beside a windowed aggregate joined as a subquery (q7's shape)
    "top": "SELECT b.auction, b.price FROM {bid} b JOIN (SELECT max(price) AS top, window_end "
    "FROM TUMBLE({bid}, date_time, INTERVAL '1 hour') GROUP BY window_end) m "
    "ON b.price = m.top AND b.date_time >= m.window_end - INTERVAL '1 hour' "
    "AND b.date_time < m.window_end WHERE b.bidder IN (SELECT bidder FROM {bid} WHERE price < 5)",
    # EXISTS correlated by two equalities, the subquery's own condition kept in it
    "seen": "SELECT * FROM {bid} b WHERE EXISTS (SELECT 1 FROM {bid} c WHERE c.auction = "
    "b.auction AND c.bidder = b.bidder AND c.price > 15) AND b.price < 10",
    # IN correlated by an equality, over an expression of the row: the EXISTS it means
    "rebid": "SELECT b.auction, b.bidder, b.price FROM {bid} b WHERE b.bidder + 1 IN "
    "(SELECT c.bidder FROM {bid} c WHERE c.auction = b.auction AND c.price > 12)",
    # an aggregate over EXISTS, correlated by an expression of the subquery's row
    "next": "SELECT b.bidder, count(*) AS n, sum(b.price) AS s FROM {bid} b WHERE EXISTS "
    "(SELECT * FROM {bid} c WHERE b.auction = c.auction + 1 AND c.extra <> 'x1') "
    "GROUP BY b.bidder",
    # NOT IN, its subquery empty until a bid above 15 comes (every row passes till then),
    # and NOT IN over an aggregate
    "not_in": "SELECT auction, price FROM {bid} WHERE bidder NOT IN (SELECT bidder + 1 FROM "
    "{bid} WHERE price > 15)",
    "not_busy": "SELECT bidder, count(*) AS n FROM {bid} b WHERE b.auction NOT IN (SELECT "
    "auction FROM {bid} GROUP BY auction HAVING min(price) > 1) GROUP BY bidder",
    # NOT IN correlated by an equality: per auction, the bidders above 18 (bidder 3 a NULL,
    # which makes the auction's every row fail), counted per auction
    "not_in_own": "SELECT b.auction, b.bidder, b.price FROM {bid} b WHERE b.bidder NOT IN "
    "(SELECT nullif(c.bidder, 3) FROM {bid} c WHERE c.auction = b.auction AND c.price > 18)",
    # NOT EXISTS: the anti-join, beside an IN
    "unseen": "SELECT b.auction, b.bidder, b.price FROM {bid} b WHERE NOT EXISTS (SELECT 1 "
    "FROM {bid} c WHERE c.auction = b.auction AND c.bidder = b.bidder AND c.price > 17) AND "
    "b.bidder IN (SELECT bidder FROM {bid} WHERE extra <> 'x2')",
}
# The oracle of a query PostgreSQL cannot run as written (TUMBLE is Strata's).
ORACLES = {
    "top": "SELECT b.auction, b.price FROM {bid} b JOIN (SELECT max(price) AS top, "
    "date_bin('1 hour', date_time, timestamptz 'epoch') + INTERVAL '1 hour' AS window_end "
    "FROM {bid} GROUP BY 2) m ON b.price = m.top AND b.date_time >= m.window_end - "
    "INTERVAL '1 hour' AND b.date_time < m.window_end WHERE b.bidder IN (SELECT bidder "
    "FROM {bid} WHERE price < 5)",
}


@given(bids=BIDS, cuts=CUTS, order=st.randoms(use_true_random=False))
@settings(
    max_examples=examples(8),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_semi_joins_equal_postgres_in_after_every_run(
    module_strata: Strata,
    bids: list[tuple[int, int, int, int]],
    cuts: list[int],
    order: random.Random,
) -> None:
    """Random bids cut into shuffled runs, one of them late: each query with IN subqueries
    equals PostgreSQL's IN over the raw rows after every run."""
    bid = f"sbid_{next(_names)}"
    views = bid_streams(module_strata, bid, QUERIES, ORACLES)
    equal_after_every_run(module_strata, bid, views, bid_runs(bids, cuts, order))


def test_a_reader_sees_every_snapshot_exact_while_runs_arrive(module_strata: Strata) -> None:
    """While runs of bids (two of them hours late) commit and the reducer folds, a reader
    comparing each view with PostgreSQL's IN, one snapshot after another, never sees them
    differ; each view has rows by the end."""
    strata = module_strata
    bid = f"sbid_{next(_names)}"
    oracles = bid_streams(strata, bid, QUERIES, ORACLES)
    rng = random.Random(7)
    read_while_late_runs_arrive(strata, bid, oracles, rng, 21, lambda _: f"x{rng.randrange(3)}")


LEFT_REFUSED = [
    (  # NOT IN correlated by an inequality: no keys to count per
        "SELECT * FROM bid b WHERE b.auction NOT IN (SELECT c.auction FROM bid c WHERE "
        "c.bidder < b.bidder)",
        "NOT IN (subquery) is not supported here: '(SELECT c.auction FROM bid AS c WHERE "
        "c.bidder < b.bidder)'; NOT IN is an anti-join",
    ),
    (  # under OR, a row may pass without a match
        "SELECT * FROM bid WHERE auction IN (SELECT auction FROM bid) OR price > 5",
        "IN (subquery) is not supported here",
    ),
    (  # correlated by an inequality: no keys to join on
        "SELECT * FROM bid b WHERE b.auction IN (SELECT c.auction FROM bid c "
        "WHERE c.bidder < b.bidder)",
        "its subquery not correlated or correlated only by equalities of its WHERE",
    ),
    (  # a window call beside it
        "SELECT count(*) AS n, window_start FROM TUMBLE(bid, date_time, INTERVAL '1 hour') "
        "WHERE auction IN (SELECT auction FROM bid) GROUP BY window_start",
        "IN (subquery) is not supported here",
    ),
    (  # NOT EXISTS correlated by an inequality: no keys to anti-join on
        "SELECT * FROM bid b WHERE NOT EXISTS (SELECT 1 FROM bid c WHERE c.price > b.price)",
        "NOT EXISTS (subquery) is not supported here: 'EXISTS(SELECT 1 FROM bid AS c WHERE "
        "c.price > b.price)'; NOT EXISTS is an anti-join",
    ),
    (  # correlated by an inequality: no keys to join on
        "SELECT * FROM bid b WHERE EXISTS (SELECT 1 FROM bid c WHERE c.price > b.price)",
        "EXISTS (subquery) is not supported here",
    ),
    (  # not correlated, over a grouped subquery
        "SELECT * FROM bid b WHERE EXISTS (SELECT c.auction FROM bid c GROUP BY c.auction "
        "HAVING count(*) > 5)",
        "EXISTS (subquery) is not supported here",
    ),
    (  # under OR
        "SELECT * FROM bid b WHERE EXISTS (SELECT 1 FROM bid c WHERE c.auction = b.auction) "
        "OR b.price > 3",
        "EXISTS (subquery) is not supported here",
    ),
]


@pytest.mark.parametrize("sql,fragment", LEFT_REFUSED)
def test_shapes_that_are_not_semi_joins_stay_refused(sql: str, fragment: str) -> None:
    with pytest.raises(StrataError) as caught:
        plan_select(sql)
    assert fragment in str(caught.value)


def test_the_values_are_a_stream_made_with_the_stream() -> None:
    """Planned without a server: the IN subquery's distinct values are ``s__in2``."""
    streams = {"bid": rewrite(BID, {})}
    made = companions(
        "CREATE STREAM s AS SELECT * FROM bid WHERE auction IN (SELECT auction FROM bid)",
        streams,
    )
    assert made is not None and [c for c, _ in made[1]] == ["s__in2"]
    assert "GROUP BY auction" in made[1][0][1]


def test_not_in_is_postgresqls_with_nulls_and_an_empty_subquery(module_strata: Strata) -> None:
    """NOT IN as PostgreSQL answers it, run after run: every row passes while its subquery
    is empty (a NULL value too); once the subquery has values, the rows whose value is none
    of them pass, and a NULL value does not; once the subquery yields a NULL (a late run
    brings it), no row passes."""
    strata = module_strata
    bid = f"nbid_{next(_names)}"
    query = (
        "SELECT auction, bidder FROM {bid} WHERE bidder NOT IN (SELECT CASE WHEN price > 18 "
        "THEN NULL ELSE bidder END FROM {bid} WHERE extra = 'sub')"
    )
    ((view, oracle),) = bid_streams(strata, bid, {"nin": query}, {}).items()
    row = {"price": 1, "extra": "x", "date_time": "2024-09-01T10:00:00+00:00"}
    runs = [
        [row | {"auction": 1, "bidder": 1}, row | {"auction": 2, "bidder": None}],
        [row | {"auction": 3, "bidder": 2, "extra": "sub"}, row | {"auction": 4, "bidder": 3}],
        [
            row
            | {
                "auction": 5,
                "bidder": 4,
                "price": 19,
                "extra": "sub",
                "date_time": "2024-09-01T07:00:00+00:00",
            }
        ],
    ]
    seen = []
    for run in runs:
        strata.ingest(bid, ndjson(run))
        seen.append(same(strata, view, oracle))
    assert seen == [2, 2, 0]  # all (a NULL too); 1 and 3 (not 2, not the NULL); none
