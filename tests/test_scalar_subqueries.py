"""Scalar subqueries that are one aggregate (rewriter/scalar_subqueries.py): the value a
one-row stream made with the stream, cross-joined on read. The four proofs: equal to
PostgreSQL's own scalar subqueries over the raw rows after every run of shuffled runs with
an hours-late one (hypothesis); every snapshot exact while runs commit; the shapes left
refused refused by name; the kill -9 during a commit is in
tests/test_crash_nexmark_shapes.py.
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
    # the bids above the average price
    "above": "SELECT auction, bidder, price FROM {bid} WHERE price > "
    "(SELECT avg(price) FROM {bid})",
    # per bidder, the count and the total count beside it, bidders with a quarter or more
    "share": "SELECT bidder, count(*) AS n, (SELECT count(*) FROM {bid}) AS total FROM {bid} "
    "GROUP BY bidder HAVING count(*) * 4 >= (SELECT count(*) FROM {bid})",
    # an aggregate over all bids of a distance to a filtered minimum, under OR
    "spread": "SELECT count(*) AS n, sum(price - (SELECT min(price) FROM {bid} WHERE price > "
    "10)) AS s FROM {bid} b WHERE b.bidder = 1 OR b.price < (SELECT max(price) FROM {bid}) - 3",
    # EXISTS not correlated, under OR, and NOT EXISTS: the count of its rows above 0, or not
    "any_dear": "SELECT auction, price FROM {bid} b WHERE EXISTS (SELECT 1 FROM {bid} c WHERE "
    "c.price > 19) OR b.bidder = 0",
    "no_top_4": "SELECT auction, bidder FROM {bid} b WHERE NOT EXISTS (SELECT 1 FROM {bid} c "
    "WHERE c.price > 18 AND c.bidder = 4) AND b.price < 15",
    # correlated by an equality: the bids above their own auction's average
    "above_own": "SELECT auction, bidder, price FROM {bid} b WHERE price > "
    "(SELECT avg(c.price) FROM {bid} c WHERE c.auction = b.auction)",
    # a count (0 over no rows) correlated with NULL keys on both sides (auction 0 is NULL,
    # which equals nothing), beside a filter of the subquery's own
    "rivals": "SELECT auction, bidder, price, (SELECT count(*) + 1 FROM {bid} c WHERE "
    "nullif(c.auction, 0) = nullif(b.auction, 0) AND c.bidder <> 2) AS others, (SELECT "
    "count(*) FILTER (WHERE c.price > 10) FROM {bid} c WHERE c.bidder = b.bidder + 1) AS "
    "dear_next FROM {bid} b",
    # in a grouped query, outside its aggregate calls, and correlated by two equalities
    "top_other": "SELECT bidder, auction, count(*) AS n, (SELECT max(c.price) FROM {bid} c "
    "WHERE c.bidder = b.bidder AND b.auction = c.auction AND c.price < 15) AS top "
    "FROM {bid} b GROUP BY bidder, auction",
}


@given(bids=BIDS, cuts=CUTS, order=st.randoms(use_true_random=False))
@settings(
    max_examples=examples(8),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_scalar_subqueries_equal_postgres_after_every_run(
    module_strata: Strata,
    bids: list[tuple[int, int, int, int]],
    cuts: list[int],
    order: random.Random,
) -> None:
    """Random bids cut into shuffled runs, one of them late: each query equals PostgreSQL's
    own scalar subqueries over the raw rows after every run."""
    bid = f"cbid_{next(_names)}"
    views = bid_streams(module_strata, bid, QUERIES, {})
    equal_after_every_run(module_strata, bid, views, bid_runs(bids, cuts, order))


def test_a_reader_sees_every_snapshot_exact_while_runs_arrive(module_strata: Strata) -> None:
    """While runs of bids (two of them hours late) commit and the reducer folds, a reader
    comparing each view with PostgreSQL's scalar subqueries, one snapshot after another,
    never sees them differ; each view has rows by the end."""
    strata = module_strata
    bid = f"cbid_{next(_names)}"
    oracles = bid_streams(strata, bid, QUERIES, {})
    rng = random.Random(13)
    read_while_late_runs_arrive(strata, bid, oracles, rng, 21, lambda _: f"x{rng.randrange(3)}")


REFUSED = [
    (  # correlated by other than equalities
        "SELECT auction FROM bid b WHERE price > (SELECT avg(c.price) FROM bid c "
        "WHERE c.auction = b.auction AND c.date_time < b.date_time)",
        "correlated only by equalities of its WHERE",
    ),
    (  # its aggregate reads the query's row
        "SELECT auction FROM bid b WHERE price > (SELECT avg(c.price - b.price) FROM bid c "
        "WHERE c.auction = b.auction)",
        "correlated only by equalities of its WHERE",
    ),
    (  # several rows or none
        "SELECT auction FROM bid WHERE price > (SELECT price FROM bid ORDER BY price LIMIT 1)",
        "a scalar subquery is one aggregate without GROUP BY, HAVING or LIMIT",
    ),
    (  # beside the query's own aggregate without GROUP BY, outside its aggregate calls
        "SELECT count(*) AS n, (SELECT max(price) FROM bid) AS top FROM bid",
        "in a query that aggregates without GROUP BY it stands inside an aggregate call",
    ),
    (  # a window call beside it
        "SELECT count(*) AS n, window_start FROM TUMBLE(bid, date_time, INTERVAL '1 hour') "
        "WHERE price > (SELECT avg(price) FROM bid) GROUP BY window_start",
        "a subquery inside an expression is not supported here",
    ),
]


@pytest.mark.parametrize("sql,fragment", REFUSED)
def test_shapes_that_are_not_one_row_stay_refused(sql: str, fragment: str) -> None:
    with pytest.raises(StrataError) as caught:
        plan_select(sql)
    assert fragment in str(caught.value)


def test_the_value_is_a_stream_made_with_the_stream() -> None:
    """Planned without a server: the subquery is ``s__in2``, one aggregate column."""
    made = companions(
        "CREATE STREAM s AS SELECT * FROM bid WHERE price > (SELECT avg(price) FROM bid)",
        {"bid": rewrite(BID, {})},
    )
    assert made is not None
    assert made[1] == [
        ("s__in2", "CREATE STREAM s__in2 AS SELECT AVG(price) AS strata_scalar_value FROM bid")
    ]


def test_a_correlated_value_is_a_stream_grouped_by_its_keys() -> None:
    """Planned without a server: the subquery correlated by an equality is ``s__in2``,
    grouped by its side of the equality, which the stream LEFT JOINs on read."""
    made = companions(
        "CREATE STREAM s AS SELECT b.auction, b.price FROM bid b WHERE price > "
        "(SELECT avg(c.price) FROM bid c WHERE c.auction = b.auction AND c.bidder > 1)",
        {"bid": rewrite(BID, {})},
    )
    assert made is not None
    assert made[1] == [
        (
            "s__in2",
            "CREATE STREAM s__in2 AS SELECT c.auction AS strata_scalar_key_1, AVG(c.price) AS "
            "strata_scalar_value FROM bid AS c WHERE c.bidder > 1 GROUP BY c.auction",
        )
    ]
