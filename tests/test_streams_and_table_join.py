"""An aggregate over a join of two streams and a table, in one statement (issue 32): the
streams' join is kept as the companion join stream ``<name>__rows`` and the stream is the
aggregate over that join stream joined with the table on read. Its view equals the same
query run by PostgreSQL as a batch over the raw rows and the table as it is now, whatever
the split into runs, their order and lateness, and the table's changes (real PostgreSQL,
real Spark).
"""

from __future__ import annotations

import itertools
import random

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rewriter import ParallelAggregatePlan, StreamPlan, companion, rewrite
from rewriter.errors import StrataError
from rewriter.tables import TableColumn, TableSchema
from tests.conftest import Strata, examples
from tests.oracle import (
    SnapshotReader,
    at,
    execute,
    late_runs,
    ndjson,
    same,
    with_a_late_run,
)
from tests.test_joins import Row, another, when

_names = itertools.count()

PER_LABEL = (
    "CREATE STREAM {name} AS SELECT c.label, count(*) AS n, sum(b.price) AS s, "
    "max(a.category) AS top, window_end FROM TUMBLE({bid}, t, INTERVAL '1 minute') b "
    "JOIN {auction} a ON b.auction = a.id JOIN {dim} c ON a.category = c.id "
    "WHERE b.price > 1 AND c.label <> 'l2' GROUP BY c.label, window_end"
)


def per_label_oracle(bid: str, auction: str, dim: str) -> str:
    """The batch query of PER_LABEL written another way: bids counted per auction category and
    minute first (the minute's end by epoch arithmetic), the table joined after, so that
    neither the view's join order nor its windows are repeated."""
    return (
        "SELECT c.label, sum(x.n), sum(x.s), max(x.category), x.minute_end FROM (SELECT "
        "a.category, count(*) AS n, sum(b.price) AS s, to_timestamp(floor(extract(epoch "
        "FROM b.t) / 60) * 60 + 60) AS minute_end "
        f"FROM {bid} b, {auction} a WHERE a.id = b.auction AND b.price > 1 "
        f"GROUP BY a.category, minute_end) x, {dim} c "
        "WHERE c.id = x.category AND c.label <> 'l2' GROUP BY c.label, x.minute_end"
    )


def test_planned_as_a_join_stream_and_an_aggregate_joining_it_with_the_table() -> None:
    """The companion is the streams' join with the columns the rest reads; the stream is
    the stream-table aggregate over it, with the table's filter kept on read."""
    streams: dict[str, StreamPlan] = {}
    for statement in (
        "CREATE STREAM bid (auction integer, price integer, t timestamptz) WITH (event_time = 't')",
        "CREATE STREAM auction (id integer, category integer, t timestamptz) "
        "WITH (event_time = 't')",
    ):
        plan = rewrite(statement, streams)
        streams[plan.name] = plan
    columns = (TableColumn("id", "integer"), TableColumn("label", "text"))
    tables = {"cat": TableSchema("cat", columns, ("id",))}
    statement = PER_LABEL.format(name="per_label", bid="bid", auction="auction", dim="cat")
    made_with = companion(statement, streams, tables)
    assert made_with == (
        "per_label",
        "per_label__rows",
        'CREATE STREAM per_label__rows AS SELECT b.t AS "b__t", b.price AS "b__price", '
        "a.category AS \"a__category\" FROM TUMBLE(bid, t, INTERVAL '1 MINUTE') AS b "
        "JOIN auction AS a ON b.auction = a.id WHERE b.price > 1",
    )
    with pytest.raises(StrataError, match="per_label__rows"):
        rewrite(statement, streams, tables)  # the server makes the join stream first
    rows = rewrite(made_with[2], streams, tables)
    streams[rows.name] = rows
    plan = rewrite(statement, streams, tables)
    assert isinstance(plan, ParallelAggregatePlan)
    assert (plan.source, plan.tables) == ("per_label__rows", ("cat",))
    assert 'WHERE "c"."label" <> \'l2\'' in plan.view_query
    # One stream and a table: the stream-table aggregate itself, no companion.
    alone = (
        "CREATE STREAM s AS SELECT c.label, count(*) AS n, window_end FROM TUMBLE(bid, t, "
        "INTERVAL '1 minute') b JOIN cat c ON c.id = b.auction GROUP BY c.label, window_end"
    )
    assert companion(alone, streams, tables) is None


class Market:
    """Fresh bid and auction streams and a category table (the user's, made with SQL)."""

    def __init__(self, strata: Strata) -> None:
        n = next(_names)
        self.strata = strata
        self.bid, self.auction, self.dim = f"sbid_{n}", f"sauction_{n}", f"scat_{n}"
        self.agg = f"per_label_{n}"
        strata.create(
            f"CREATE STREAM {self.bid} (auction integer, price integer, t timestamptz) "
            "WITH (event_time = 't')"
        )
        strata.create(
            f"CREATE STREAM {self.auction} (id integer, category integer, t timestamptz) "
            "WITH (event_time = 't')"
        )
        execute(strata, f"CREATE TABLE {self.dim} (id integer PRIMARY KEY, label text)")

    def label(self, category: int, label: str | None) -> None:
        """Upsert a category's label; None deletes the category."""
        if label is None:
            execute(self.strata, f"DELETE FROM {self.dim} WHERE id = %s", category)
            return
        execute(
            self.strata,
            f"INSERT INTO {self.dim} VALUES (%s, %s) "
            "ON CONFLICT (id) DO UPDATE SET label = excluded.label",
            category,
            label,
        )

    def create(self) -> dict[str, object]:
        return self.strata.create(
            PER_LABEL.format(name=self.agg, bid=self.bid, auction=self.auction, dim=self.dim)
        )

    def same(self) -> int:
        return same(
            self.strata,
            f"SELECT label, n, s, top, window_end FROM {self.agg}",
            per_label_oracle(self.bid, self.auction, self.dim),
        )


Run = tuple[str, list[Row]]  # ("bid" or "auction", rows)


@st.composite
def market_runs(draw: st.DrawFn) -> tuple[list[Run], int]:
    """Runs of bids (auction 0..3, price 0..5) and auctions (id 0..3, category 0..2) within
    ten minutes; among them a bid and an auction of one key that match (price 2), the bid
    alone in its run, and another run of bids at another time (so that some order of the
    bid runs makes one late); and the matched auction's category."""
    key, category, second = (
        draw(st.integers(0, 3)),
        draw(st.integers(0, 2)),
        draw(st.integers(0, 600)),
    )
    bids = draw(
        st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5), st.integers(0, 600)), max_size=4)
    )
    auctions = draw(
        st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2), st.integers(0, 600)), max_size=3)
    )
    auctions.insert(draw(st.integers(0, len(auctions))), (key, category, draw(st.integers(0, 600))))
    other = (draw(st.integers(0, 3)), draw(st.integers(0, 5)), another(draw, second, 600))
    runs: list[Run] = [
        ("bid", [{"auction": key, "price": 2, "t": at(second)}]),
        ("bid", [{"auction": other[0], "price": other[1], "t": at(other[2])}]),
    ]
    for stream, rows in (
        ("bid", [{"auction": k, "price": p, "t": at(s)} for k, p, s in bids]),
        ("auction", [{"id": k, "category": c, "t": at(s)} for k, c, s in auctions]),
    ):
        while rows:
            size = draw(st.integers(1, 3))
            runs.append((stream, rows[:size]))
            rows = rows[size:]
    return runs, category


@given(
    drawn=market_runs(),
    changes=st.lists(
        st.tuples(st.integers(0, 2), st.sampled_from(["l0", "l1", "l2", None])), max_size=3
    ),
    order=st.randoms(use_true_random=False),
)
@settings(
    max_examples=examples(4),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_any_runs_and_table_changes_give_the_batch_query(
    module_strata: Strata,
    drawn: tuple[list[Run], int],
    changes: list[tuple[int, str | None]],
    order: random.Random,
) -> None:
    """Hypothesis: runs of both streams in random order (minutes apart, one at least late)
    interleaved with inserts, updates and deletes of the table, then the label of a matched
    pair's category: after every step the view equals PostgreSQL's batch query over the raw
    rows and the table as it is then; the last is not empty."""
    runs, category = drawn
    market = Market(module_strata)
    market.label(0, "l0")
    market.create()
    order.shuffle(runs)
    # One run of bids at least arrives behind the bids' watermark.
    places = [i for i, (stream, _) in enumerate(runs) if stream == "bid"]
    bids = with_a_late_run(
        [runs[i] for i in places], lambda row: when(row["t"]), rows=lambda run: run[1]
    )
    for place, run in zip(places, bids, strict=True):
        runs[place] = run
    kinds = [*["run"] * len(runs), *["change"] * len(changes)]
    order.shuffle(kinds)
    sending, changing = iter(runs), iter(changes)
    steps: list[Run | tuple[int, str | None]] = [
        next(sending) if kind == "run" else next(changing) for kind in kinds
    ]
    steps.append((category, "l1"))  # the matched pair counts at the end
    streams = {"bid": market.bid, "auction": market.auction}
    for step in steps:
        if isinstance(step[0], str):
            stream, rows = step
            module_strata.ingest(streams[stream], ndjson(rows))  # type: ignore[arg-type]
        else:
            market.label(*step)  # type: ignore[arg-type]
        windows = market.same()
    assert windows > 0
    assert late_runs(module_strata, market.bid) > 0


def test_shown_with_its_join_stream_and_dropped_with_it(module_strata: Strata) -> None:
    """Created over history: GET /streams/{name} and EXPLAIN STREAM show the join stream it
    reads and the table joined on read; dropping it drops the join stream."""
    strata = module_strata
    market = Market(strata)
    market.label(1, "l1")
    strata.ingest(market.auction, ndjson([{"id": 1, "category": 1, "t": at(30)}]))
    strata.ingest(market.bid, ndjson([{"auction": 1, "price": 3, "t": at(90)}]))
    described = market.create()
    rows = f"{market.agg}__rows"
    assert described["source"] == rows
    assert described["rewrite"]["tables"] == [market.dim]  # type: ignore[index]
    assert strata.client.get(f"/streams/{rows}").status_code == 200
    assert market.same() == 1
    with psycopg.connect(strata.psql_url, autocommit=True) as connection:
        plan = "\n".join(r[0] for r in connection.execute(f"EXPLAIN STREAM {market.agg}"))
    assert f"Tables joined on read: {market.dim}" in plan and rows in plan
    assert strata.client.delete(f"/streams/{market.agg}").status_code in (200, 204)
    assert strata.client.get(f"/streams/{rows}").status_code == 404
    assert strata.client.get(f"/streams/{market.agg}").status_code == 404


def test_a_reader_sees_every_snapshot_exact_while_runs_arrive(module_strata: Strata) -> None:
    """While runs of both streams (one late) and a table change arrive, a reader comparing
    the views (the table joined, and LEFT JOINed) with the batch queries in one snapshot
    after another never sees them differ."""
    market = Market(module_strata)
    for category in range(3):
        market.label(category, f"l{category % 2}")
    market.create()
    # LEFT JOIN the table: bids whose category has no label count under a NULL label.
    padded = f"{market.agg}_left"
    left_join = (
        f"FROM {{}} b JOIN {market.auction} a ON b.auction = a.id "
        f"LEFT JOIN {market.dim} c ON a.category = c.id"
    )
    module_strata.create(
        f"CREATE STREAM {padded} AS SELECT c.label, count(*) AS n, window_start "
        + left_join.format(f"TUMBLE({market.bid}, t, INTERVAL '1 minute')")
        + " GROUP BY c.label, window_start"
    )
    rng = random.Random(7)
    runs = [
        (
            market.bid if i % 2 else market.auction,
            [
                {"auction": rng.randrange(4), "price": rng.randrange(6), "t": at(s)}
                if i % 2
                else {"id": rng.randrange(4), "category": rng.randrange(3), "t": at(s)}
                for s in rng.sample(range(600), 3)
            ],
        )
        for i in range(6)
    ]
    runs.append((market.bid, [{"auction": 0, "price": 5, "t": at(1)}]))  # late
    oracle = per_label_oracle(market.bid, market.auction, market.dim)
    view = f"SELECT label, n, s, top, window_end FROM {market.agg}"
    pairs = {
        view: oracle,
        f"SELECT label, n, window_start FROM {padded}": (
            "SELECT c.label, count(*), date_bin('1 minute', b.t, timestamptz 'epoch') "
            + left_join.format(market.bid)
            + " GROUP BY 1, 3"
        ),
    }
    with SnapshotReader.of(module_strata.database_url, pairs):
        for i, (stream, rows) in enumerate(runs):
            module_strata.ingest(stream, ndjson(rows))
            if i == 3:
                market.label(1, None)
    assert market.same() > 0
    assert None in {r[0] for r in module_strata.query(f"SELECT label FROM {padded}")}


def test_refusals_name_the_construct(module_strata: Strata) -> None:
    strata = module_strata
    market = Market(strata)
    bid, auction, dim = market.bid, market.auction, market.dim

    def refused(select: str) -> str:
        name = f"bad_{next(_names)}"
        response = strata.client.post("/streams", json={"sql": f"CREATE STREAM {name} AS {select}"})
        assert response.status_code in (400, 404), response.text
        # Nothing of it is left behind: neither the stream nor its join stream.
        assert strata.client.get(f"/streams/{name}__rows").status_code == 404
        return str(response.json()["error"])

    window = f"TUMBLE({bid}, t, INTERVAL '1 minute') b"
    assert "here a stream follows a table" in refused(
        f"SELECT c.label, count(*) AS n, window_end FROM {window} JOIN {dim} c ON c.id = "
        f"b.auction JOIN {auction} a ON b.auction = a.id GROUP BY c.label, window_end"
    )
    assert "joined with LEFT JOIN" in refused(
        f"SELECT c.label, count(*) AS n, window_end FROM {window} LEFT JOIN {auction} a "
        f"ON b.auction = a.id JOIN {dim} c ON a.category = c.id GROUP BY c.label, window_end"
    )
    assert "stream's columns" in refused(
        f"SELECT count(c.label) AS n, window_end FROM {window} JOIN {auction} a "
        f"ON b.auction = a.id JOIN {dim} c ON a.category = c.id GROUP BY window_end"
    )
    assert "TUMBLE(stream, time_column" in refused(
        f"SELECT c.label, count(*) AS n, window_end FROM HOP({bid}, t, INTERVAL '1 minute', "
        f"INTERVAL '2 minutes') b JOIN {auction} a ON b.auction = a.id JOIN {dim} c "
        "ON a.category = c.id GROUP BY c.label, window_end"
    )
    assert "window of the stream" in refused(
        f"SELECT c.label, count(*) AS n FROM {bid} b JOIN {auction} a "
        f"ON b.auction = a.id JOIN {dim} c ON a.category = c.id GROUP BY c.label"
    )
