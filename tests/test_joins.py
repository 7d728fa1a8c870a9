"""Joins are exact (invariant 6): every join view equals the same join run as a batch over
all rows received, whatever the split into runs, their order and lateness, and at every
instant (real PostgreSQL, real Spark).

The oracle of a join of two or three streams (kept in an archive of pairs, outer rows
padded on read with NOT EXISTS) is its query run by PostgreSQL over the raw views; of a
stream built on a join, its GROUP BY over that oracle. A join computed on read (an outer
join of three streams, a join with a table) is a view whose text is its own query, so its
oracle is a Python model over the rows the test sent and the table's contents.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server import faults
from server.workers.serial import Materializer, Repairer
from tests.conftest import Strata, examples
from tests.oracle import SnapshotReader, at, cut, late, ndjson, same, with_a_late_run

_names = itertools.count()

PERSON = (
    "CREATE STREAM {p} (id bigint, name text, city text, date_time timestamptz) "
    "WITH (event_time = 'date_time')"
)
AUCTION = (
    "CREATE STREAM {a} (id bigint, seller bigint, category integer, item_name text, "
    "date_time timestamptz, expires timestamptz) WITH (event_time = 'date_time')"
)
BID = (
    "CREATE STREAM {b} (auction bigint, bidder bigint, price bigint, date_time timestamptz) "
    "WITH (event_time = 'date_time')"
)


class Nexmark:
    """Fresh person, auction and bid streams, and random rows for them."""

    def __init__(self, strata: Strata, rng: random.Random) -> None:
        n = next(_names)
        self.p, self.a, self.b = f"person_{n}", f"auction_{n}", f"bid_{n}"
        self.strata, self.rng = strata, rng
        for statement in (PERSON, AUCTION, BID):
            strata.create(statement.format(p=self.p, a=self.a, b=self.b))
        self.people = 12

    def person(self, key: int) -> dict[str, object]:
        return {
            "id": key,
            "name": f"name{key}",
            "city": self.rng.choice(["Oslo", "Lima", None]),
            "date_time": at(self.rng.uniform(0, 7200)),
        }

    def auction(self, key: int) -> dict[str, object]:
        opened = self.rng.uniform(0, 7200)
        return {
            "id": key,
            "seller": self.rng.choice([*range(self.people), None]),
            "category": self.rng.choice([10, 10, 11]),
            "item_name": f"item{key}",
            "date_time": at(opened),
            "expires": at(opened + self.rng.uniform(0, 1800)),
        }

    def bid(self, auctions: int) -> dict[str, object]:
        return {
            "auction": self.rng.randrange(auctions + 2),
            "bidder": self.rng.randrange(self.people + 3),
            "price": self.rng.randrange(1, 500),
            "date_time": at(self.rng.uniform(0, 9000)),
        }

    def runs(self, people: int, auctions: int, bids: int, size: int) -> list[tuple[str, str]]:
        """Every row in runs of up to ``size`` rows, all three streams shuffled together
        (so a run of one side may come hours after the rows it joins)."""
        rows = (
            [(self.p, self.person(k)) for k in range(people)]
            + [(self.a, self.auction(k)) for k in range(auctions)]
            + [(self.b, self.bid(auctions)) for _ in range(bids)]
        )
        self.rng.shuffle(rows)
        runs: list[tuple[str, str]] = []
        for stream in (self.p, self.a, self.b):
            mine = [r for s, r in rows if s == stream]
            for start in range(0, len(mine), size):
                runs.append((stream, ndjson(mine[start : start + size])))
        self.rng.shuffle(runs)
        return runs

    def ingest(self, runs: list[tuple[str, str]]) -> None:
        for stream, body in runs:
            self.strata.ingest(stream, body)


Row = dict[str, Any]
R = TypeVar("R")


def two_sided_runs(
    rows: list[tuple[str, int, int]], cuts: list[int], left: str, right: str
) -> list[tuple[str, list[Row]]]:
    """Rows ("l" or "r", key, minute) cut into runs of the sizes ``cuts`` in turn, each run
    posted as one run of ``left`` and one of ``right``; v numbers the rows."""
    runs: list[tuple[str, list[Row]]] = []
    for chunk in cut(list(enumerate(rows)), cuts):
        for side, stream in (("l", left), ("r", right)):
            mine = [
                {"k": k, "v": i, "t": at(minute * 60)} for i, (s, k, minute) in chunk if s == side
            ]
            if mine:
                runs.append((stream, mine))
    return runs


@st.composite
def two_sided_rows(
    draw: st.DrawFn, keys: int, minutes: int, size: int, within: int
) -> list[tuple[str, int, int]]:
    """Rows ("l" or "r", key, minute) of two streams, among them a right row and a left row
    of one key, the left 1 to ``within`` minutes after the right (a pair of the band joins
    here, and two distinct times, so that some order of the runs makes one late), at drawn
    places."""
    rows = draw(
        st.lists(
            st.tuples(st.sampled_from(["l", "r"]), st.integers(0, keys), st.integers(0, minutes)),
            max_size=size - 2,
        )
    )
    key, minute = draw(st.integers(0, keys)), draw(st.integers(0, minutes - within))
    after = draw(st.integers(1, within))
    for row in (("r", key, minute), ("l", key, minute + after)):
        rows.insert(draw(st.integers(0, len(rows))), row)
    return rows


def another(draw: st.DrawFn, value: int, top: int) -> int:
    """A number of 0..top other than ``value`` (a time other than a row's)."""
    other = draw(st.integers(0, top - 1))
    return other + (other >= value)


def when(value: object) -> datetime:
    """A time as a run carries it (at()'s ISO text), as PostgreSQL reads it."""
    return datetime.fromisoformat(str(value))


def _normal(value: object) -> object:
    return value.astimezone(UTC) if isinstance(value, datetime) else value


def equals_model(strata: Strata, wants: Mapping[str, Iterable[Sequence[object]]]) -> None:
    """Each view query returns its model's rows (as multisets), all read in one snapshot."""
    with psycopg.connect(strata.database_url) as connection:
        connection.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        for view, want in wants.items():
            rows = connection.execute(view).fetchall()  # type: ignore[arg-type]
            got = Counter(tuple(map(_normal, row)) for row in rows)
            expected = Counter(tuple(map(_normal, row)) for row in want)
            assert got == expected, (
                f"{view}: {got.total()} rows, the model {expected.total()}; only in the view "
                f"{list((got - expected).elements())[:3]}, only in the model "
                f"{list((expected - got).elements())[:3]}"
            )


@pytest.fixture
def nexmark(module_strata: Strata) -> Nexmark:
    return Nexmark(module_strata, random.Random(7))


def test_unbounded_join_and_an_aggregate_over_it(nexmark: Nexmark) -> None:
    strata, p, a = nexmark.strata, nexmark.p, nexmark.a
    q3 = f"q3_{next(_names)}"
    described = strata.create(
        f"CREATE STREAM {q3} AS SELECT p.name, p.city, a.id, a.date_time "
        f"FROM {a} a JOIN {p} p ON a.seller = p.id WHERE a.category = 10"
    )
    assert described["parallelism"] == "PP"
    assert described["join"]["probes"][0]["kind"] == "equal"
    per_city = f"per_city_{next(_names)}"
    strata.create(
        f"CREATE STREAM {per_city} AS SELECT city, count(*) AS n, max(id) AS top, "
        f"window_start FROM TUMBLE({q3}, date_time, INTERVAL '30 minutes') "
        "GROUP BY city, window_start"
    )
    nexmark.ingest(nexmark.runs(people=12, auctions=40, bids=0, size=5))
    oracle = (
        f"SELECT p.name, p.city, a.id, a.date_time FROM {a} a JOIN {p} p "
        "ON a.seller = p.id WHERE a.category = 10"
    )
    same(strata, f"SELECT name, city, id, date_time FROM {q3}", oracle)
    same(
        strata,
        f"SELECT city, n, top, window_start FROM {per_city}",
        f"SELECT city, count(*), max(id), date_bin('30 minutes', date_time, "
        f"timestamptz 'epoch') FROM ({oracle}) j GROUP BY 1, 4",
    )
    assert strata.query(f"SELECT count(*) FROM {q3}")[0][0] > 5  # the test joins something


def test_window_join_and_band_join(nexmark: Nexmark) -> None:
    strata, p, a, b = nexmark.strata, nexmark.p, nexmark.a, nexmark.b
    q8, q20 = f"q8_{next(_names)}", f"q20_{next(_names)}"
    strata.create(
        f"CREATE STREAM {q8} AS SELECT p.id, p.name, p.window_start "
        f"FROM TUMBLE({p}, date_time, INTERVAL '10 minutes') p "
        f"JOIN TUMBLE({a}, date_time, INTERVAL '10 minutes') a "
        "ON p.id = a.seller AND p.window_start = a.window_start"
    )
    strata.create(
        f"CREATE STREAM {q20} AS SELECT b.auction, b.price, a.item_name, b.date_time "
        f"FROM {b} b JOIN {a} a ON a.id = b.auction "
        "AND b.date_time BETWEEN a.date_time AND a.expires"
    )
    nexmark.ingest(nexmark.runs(people=12, auctions=30, bids=120, size=7))

    def tumble(stream: str) -> str:
        return (
            f"(SELECT *, date_bin('10 minutes', date_time, timestamptz 'epoch') AS "
            f"window_start FROM {stream})"
        )

    same(
        strata,
        f"SELECT id, name, window_start FROM {q8}",
        f"SELECT p.id, p.name, p.window_start FROM {tumble(p)} p JOIN {tumble(a)} a "
        "ON p.id = a.seller AND p.window_start = a.window_start",
    )
    same(
        strata,
        f"SELECT auction, price, item_name, date_time FROM {q20}",
        f"SELECT b.auction, b.price, a.item_name, b.date_time FROM {b} b JOIN {a} a "
        "ON a.id = b.auction AND b.date_time BETWEEN a.date_time AND a.expires",
    )
    assert strata.query(f"SELECT count(*) FROM {q20}")[0][0] > 0


def test_three_way_join_self_join_and_arbitrary_predicates(nexmark: Nexmark) -> None:
    strata, p, a, b = nexmark.strata, nexmark.p, nexmark.a, nexmark.b
    q23, pairs = f"q23_{next(_names)}", f"pairs_{next(_names)}"
    strata.create(
        f"CREATE STREAM {q23} AS SELECT b.auction, b.price, p.name, a.item_name, b.date_time "
        f"FROM {b} b JOIN {p} p ON p.id = b.bidder JOIN {a} a ON a.seller = b.bidder"
    )
    # A stream joined with itself, a band with an interval and an inequality on numbers.
    strata.create(
        f"CREATE STREAM {pairs} AS SELECT x.auction, x.price AS first, y.price AS second, "
        f"y.date_time FROM {b} x JOIN {b} y ON x.auction = y.auction AND x.price < y.price "
        "AND y.date_time BETWEEN x.date_time - INTERVAL '20 minutes' AND x.date_time "
        "AND abs(x.price - y.price) < 400"
    )
    nexmark.ingest(nexmark.runs(people=12, auctions=20, bids=90, size=9))
    same(
        strata,
        f"SELECT auction, price, name, item_name, date_time FROM {q23}",
        f"SELECT b.auction, b.price, p.name, a.item_name, b.date_time FROM {b} b "
        f"JOIN {p} p ON p.id = b.bidder JOIN {a} a ON a.seller = b.bidder",
    )
    same(
        strata,
        f"SELECT auction, first, second, date_time FROM {pairs}",
        f"SELECT x.auction, x.price, y.price, y.date_time FROM {b} x JOIN {b} y "
        "ON x.auction = y.auction AND x.price < y.price AND y.date_time BETWEEN "
        "x.date_time - INTERVAL '20 minutes' AND x.date_time AND abs(x.price - y.price) < 400",
    )
    assert strata.query(f"SELECT count(*) FROM {pairs}")[0][0] > 0


def test_join_and_aggregate_created_over_history(nexmark: Nexmark) -> None:
    """A join created after its sources hold rows joins their history at once; a stream
    created on the join later back-fills from the join's archive; runs after both count
    once."""
    strata, p, a = nexmark.strata, nexmark.p, nexmark.a
    runs = nexmark.runs(people=12, auctions=40, bids=0, size=6)
    nexmark.ingest(runs[: len(runs) // 2])
    sellers = f"sellers_{next(_names)}"
    strata.create(
        f"CREATE STREAM {sellers} AS SELECT a.id, a.category, p.city, a.date_time "
        f"FROM {a} a, {p} p WHERE a.seller = p.id"
    )
    nexmark.ingest(runs[len(runs) // 2 : -3])
    counts = f"counts_{next(_names)}"
    strata.create(
        f"CREATE STREAM {counts} AS SELECT category, count(*) AS n, sum(id) AS ids, "
        f"window_end FROM TUMBLE({sellers}, date_time, INTERVAL '1 hour') "
        "GROUP BY category, window_end"
    )
    nexmark.ingest(runs[-3:])
    oracle = f"SELECT a.id, a.category, p.city, a.date_time FROM {a} a, {p} p WHERE a.seller = p.id"
    same(strata, f"SELECT id, category, city, date_time FROM {sellers}", oracle)
    same(
        strata,
        f"SELECT category, n, ids, window_end FROM {counts}",
        "SELECT category, count(*), sum(id), date_bin('1 hour', date_time, timestamptz "
        f"'epoch') + interval '1 hour' FROM ({oracle}) j GROUP BY 1, 4",
    )


def test_aggregates_over_a_join_in_one_statement(nexmark: Nexmark) -> None:
    """An aggregate over a band join and one over a window join, each in one statement
    (created over history, then fed shuffled runs hours late), equal the batch queries;
    the join each keeps as <name>__rows is a stream of its own, dropped with it."""
    strata, p, a, b = nexmark.strata, nexmark.p, nexmark.a, nexmark.b
    nexmark.ingest(nexmark.runs(people=6, auctions=10, bids=40, size=6))  # history
    bids, sellers = f"bids_{next(_names)}", f"sellers_{next(_names)}"
    described = strata.create(
        f"CREATE STREAM {bids} AS SELECT a.seller, count(*) AS n, max(b.price) AS top, "
        f"window_end AS t FROM TUMBLE({b}, date_time, INTERVAL '10 minutes') b "
        f"JOIN {a} a ON a.id = b.auction AND b.date_time BETWEEN a.date_time AND a.expires "
        "WHERE a.category = 10 GROUP BY a.seller, window_end HAVING count(*) > 0"
    )
    assert described["source"] == f"{bids}__rows"
    strata.create(
        f"CREATE STREAM {sellers} AS SELECT p.city, count(*) AS auctions, window_start "
        f"FROM TUMBLE({p}, date_time, INTERVAL '30 minutes') p "
        f"JOIN TUMBLE({a}, date_time, INTERVAL '30 minutes') x "
        "ON p.id = x.seller AND p.window_start = x.window_start GROUP BY 1, window_start"
    )
    nexmark.ingest(nexmark.runs(people=12, auctions=30, bids=150, size=7))
    same(
        strata,
        f"SELECT seller, n, top, t FROM {bids}",
        f"SELECT a.seller, count(*), max(b.price), date_bin('10 minutes', b.date_time, "
        f"timestamptz 'epoch') + interval '10 minutes' FROM {b} b JOIN {a} a "
        "ON a.id = b.auction AND b.date_time BETWEEN a.date_time AND a.expires "
        "WHERE a.category = 10 GROUP BY 1, 4",
    )
    window = "date_bin('30 minutes', {0}.date_time, timestamptz 'epoch')"
    same(
        strata,
        f"SELECT city, auctions, window_start FROM {sellers}",
        f"SELECT p.city, count(*), {window.format('p')} FROM {p} p JOIN {a} x "
        f"ON p.id = x.seller AND {window.format('p')} = {window.format('x')} GROUP BY 1, 3",
    )
    assert strata.query(f"SELECT sum(n) FROM {bids}")[0][0] > 0
    assert strata.client.delete(f"/streams/{bids}").status_code in (200, 204)
    assert strata.client.get(f"/streams/{bids}__rows").status_code == 404


def test_null_and_duplicate_keys_an_empty_side_and_many_matches(module_strata: Strata) -> None:
    strata = module_strata
    n = next(_names)
    left, right, joined = f"left_{n}", f"right_{n}", f"joined_{n}"
    for name in (left, right):
        strata.create(
            f"CREATE STREAM {name} (k text, v integer, t timestamptz) WITH (event_time = 't')"
        )
    strata.create(
        f"CREATE STREAM {joined} AS SELECT l.k, l.v AS lv, r.v AS rv, l.t "
        f"FROM {left} l JOIN {right} r ON l.k = r.k"
    )
    strata.ingest(left, ndjson([{"k": None, "v": 1, "t": at(1)}, {"k": "a", "v": 2, "t": at(2)}]))
    assert strata.query(f"SELECT count(*) FROM {joined}") == [(0,)]  # the other side is empty
    # A key with many matches on both sides, NULL keys on both sides.
    strata.ingest(right, ndjson([{"k": "a", "v": i, "t": at(i)} for i in range(50_000)]))
    strata.ingest(right, ndjson([{"k": None, "v": -1, "t": at(5)}]))
    strata.ingest(left, ndjson([{"k": "a", "v": 3, "t": at(3)}, {"k": "a", "v": 4, "t": at(4)}]))
    assert strata.query(f"SELECT count(*) FROM {joined}") == [(150_000,)]
    same(
        strata,
        f"SELECT k, lv, rv, t FROM {joined}",
        f"SELECT l.k, l.v, r.v, l.t FROM {left} l JOIN {right} r ON l.k = r.k",
    )


def test_concurrent_runs_on_both_sides_while_a_reader_checks_every_snapshot(
    strata: Strata,
) -> None:
    """Runs of both sides are posted at once and committed by a pipelined server (a batch
    of one side is computed while one of the other commits, unless the compute stage waits
    for that commit: the test below forces that window, with and without the wait): without
    the version check, a pair whose rows commit in that window would be missed. A reader
    compares the join with its batch oracle in one snapshot, over and over, meanwhile."""
    rng = random.Random(11)
    strata.create("CREATE STREAM ls (k integer, v integer, t timestamptz) WITH (event_time = 't')")
    strata.create("CREATE STREAM rs (k integer, w integer, t timestamptz) WITH (event_time = 't')")
    strata.create("CREATE STREAM lr AS SELECT l.k, l.v, r.w, r.t FROM ls l JOIN rs r ON l.k = r.k")
    view = "SELECT k, v, w, t FROM lr"
    oracle = "SELECT l.k, l.v, r.w, r.t FROM ls l JOIN rs r ON l.k = r.k"
    sent: dict[str, list[Row]] = {"ls": [], "rs": []}

    def body(stream: str, column: str) -> str:
        rows = [
            {"k": rng.randrange(8), column: rng.randrange(100), "t": at(rng.uniform(0, 3600))}
            for _ in range(rng.randrange(1, 6))
        ]
        sent[stream] += rows
        return ndjson(rows)

    with SnapshotReader.of(strata.database_url, {view: oracle}, min_snapshots=5):
        posted = []
        for i in range(60):
            stream, column = ("ls", "v") if i % 2 == 0 else ("rs", "w")
            response = strata.post_run(stream, body(stream, column), wait=False, run_id=f"run-{i}")
            assert response.status_code == 202, response.text
            posted.append(response.json()["run_id"])
        for run_id in posted:
            strata.service.wait(strata.service.run(run_id), 120)  # type: ignore[arg-type]
    pairs = [
        (x["k"], x["v"], y["w"], when(y["t"]))
        for x in sent["ls"]
        for y in sent["rs"]
        if x["k"] == y["k"]
    ]
    equals_model(strata, {view: pairs})
    assert len(pairs) > 50


@pytest.mark.parametrize("awaits_commits", [True, False], ids=["pipelined", "check_only"])
def test_a_batch_probes_only_once_the_other_sides_batch_in_flight_is_committed(
    strata: Strata, monkeypatch: pytest.MonkeyPatch, awaits_commits: bool
) -> None:
    """A run of rs is posted while a batch of ls is held inside its commit transaction. The
    compute stage waits for that commit before it probes ls: the rs batch is computed once
    and pairs with the ls row. With that wait switched off, it probes without the ls row,
    its commit finds ls's version moved (server/ingest/joins.py) and it is computed again:
    exact either way, the wait only saves the second Spark job."""
    strata.create("CREATE STREAM ls (k integer, v integer, t timestamptz) WITH (event_time = 't')")
    strata.create("CREATE STREAM rs (k integer, w integer, t timestamptz) WITH (event_time = 't')")
    strata.create("CREATE STREAM lr AS SELECT l.k, l.v, r.w, r.t FROM ls l JOIN rs r ON l.k = r.k")
    pipeline = strata.service.pipeline
    computed: Counter[str] = Counter()
    partials = pipeline.backend.partials

    def counted(*args: Any, source: str, **kwargs: Any) -> Any:
        computed[source] += 1
        return partials(*args, source=source, **kwargs)

    monkeypatch.setattr(pipeline.backend, "partials", counted)
    if not awaits_commits:
        monkeypatch.setattr(pipeline, "_await_sources", lambda stream, dependents: None)
    left, right = {"k": 1, "v": 2, "t": at(60)}, {"k": 1, "w": 3, "t": at(120)}
    with (
        faults.hold("in_pg_write", "left") as committing,
        faults.hold("in_spark", "right") as computing,
    ):
        assert strata.post_run("ls", ndjson([left]), wait=False, run_id="left").status_code == 202
        assert committing.reached.wait(120), "the ls batch never reached its commit"
        assert strata.post_run("rs", ndjson([right]), wait=False, run_id="right").status_code == 202
        # Probed (and about to run Spark) with the ls batch uncommitted, or waiting for it.
        assert computing.reached.wait(5) is not awaits_commits
    for run_id in ("left", "right"):
        record = strata.service.run(run_id)
        assert record is not None
        assert strata.service.wait(record, 120).status == "committed"
    assert computed == {"ls": 1, "rs": 1 if awaits_commits else 2}
    equals_model(strata, {"SELECT k, v, w, t FROM lr": [(1, 2, 3, when(right["t"]))]})


def test_refusals_name_the_construct(module_strata: Strata) -> None:
    strata = module_strata
    n = next(_names)
    strata.create(
        f"CREATE STREAM s1_{n} (k text, x double precision, t timestamptz) WITH (event_time = 't')"
    )
    strata.create(
        f"CREATE STREAM s2_{n} (k text, x double precision, t timestamptz) WITH (event_time = 't')"
    )

    def refused(select: str) -> str:
        response = strata.client.post(
            "/streams", json={"sql": f"CREATE STREAM bad_{next(_names)} AS {select}"}
        )
        assert response.status_code == 400, response.text
        return str(response.json()["error"])

    both = f"FROM s1_{n} a {{}} JOIN s2_{n} b ON a.k = b.k"
    three = f"{both.format('LEFT')} JOIN s1_{n} c ON c.k = a.k"
    strata.create(f"CREATE STREAM three_{n} AS SELECT a.k, a.t {three}")  # computed on read
    assert "computed on read" in refused(
        f"SELECT count(*) AS c, window_start FROM TUMBLE(three_{n}, t, INTERVAL '1 hour') "
        "GROUP BY window_start"
    )
    strata.create(f"CREATE STREAM outer_{n} AS SELECT a.k, a.t {both.format('LEFT')}")
    over = strata.create(
        f"CREATE STREAM over_{n} AS SELECT k, count(*) AS c, window_start "
        f"FROM TUMBLE(outer_{n}, t, INTERVAL '1 hour') GROUP BY k, window_start"
    )
    assert over["parallelism"] == "SP"  # a late match retracts a padded row
    strata.create(f"CREATE STREAM full_{n} AS SELECT a.k, a.t {both.format('FULL')}")
    assert "a FULL join pads both" in refused(
        f"SELECT count(*) AS c, window_start FROM TUMBLE(full_{n}, t, INTERVAL '1 hour') "
        "GROUP BY window_start"
    )
    assert "USING" in refused(f"SELECT a.k, a.t FROM s1_{n} a JOIN s2_{n} b USING (k)")
    assert "ambiguous" in refused(f"SELECT k, a.t {both.format('')}")
    # An inner join keeps its first input's event time unshown when it selects none (q3);
    # an outer join must select its preserved input's.
    quiet = strata.create(f"CREATE STREAM quiet_{n} AS SELECT a.k, b.x {both.format('')}")
    assert [c["name"] for c in quiet["columns"]] == ["k", "x"]  # type: ignore[index]
    assert "event time" in refused(f"SELECT a.k, b.x {both.format('LEFT')}")
    assert "does not select" in refused(
        f"SELECT k, count(*) AS n, window_start FROM SESSION(quiet_{n}, t, "
        "INTERVAL '1 hour') GROUP BY k, window_start"
    )
    running = strata.create(
        f"CREATE STREAM running_{n} AS SELECT a.k, count(*) {both.format('')} GROUP BY a.k"
    )
    assert running["window"].startswith("none")  # running totals over the join
    assert "two columns named" in refused(f"SELECT a.k, b.k, a.t {both.format('')}")


@pytest.fixture
def shared() -> Iterator[None]:
    yield


@given(
    rows=two_sided_rows(keys=4, minutes=240, size=40, within=60),
    cuts=st.lists(st.integers(1, 6), min_size=1, max_size=12),
    order=st.randoms(use_true_random=False),
)
@settings(
    max_examples=examples(12),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_any_split_and_order_gives_the_batch_join(
    module_strata: Strata,
    rows: list[tuple[str, int, int]],
    cuts: list[int],
    order: random.Random,
) -> None:
    """Hypothesis: rows of two streams, cut into runs, in any order (minutes or hours
    apart; one run at least late), with a band join and an aggregate over it: equal to the
    batch queries, the join holding one pair at least."""
    strata = module_strata
    n = next(_names)
    left, right, band, agg = f"hl_{n}", f"hr_{n}", f"hband_{n}", f"hagg_{n}"
    for name in (left, right):
        strata.create(
            f"CREATE STREAM {name} (k integer, v integer, t timestamptz) WITH (event_time = 't')"
        )
    strata.create(
        f"CREATE STREAM {band} AS SELECT l.k, l.v AS lv, r.v AS rv, r.t FROM {left} l "
        f"JOIN {right} r ON l.k = r.k AND r.t BETWEEN l.t - INTERVAL '1 hour' AND l.t"
    )
    strata.create(
        f"CREATE STREAM {agg} AS SELECT k, count(*) AS n, sum(lv) AS s, window_start "
        f"FROM TUMBLE({band}, t, INTERVAL '1 hour') GROUP BY k, window_start"
    )
    runs = two_sided_runs(rows, cuts, left, right)
    order.shuffle(runs)
    for stream, run in with_a_late_run(runs, lambda r: when(r["t"]), rows=lambda run: run[1]):
        strata.ingest(stream, ndjson(run))
    oracle = (
        f"SELECT l.k, l.v, r.v, r.t FROM {left} l JOIN {right} r ON l.k = r.k "
        "AND r.t BETWEEN l.t - INTERVAL '1 hour' AND l.t"
    )
    assert same(strata, f"SELECT k, lv, rv, t FROM {band}", oracle) > 0
    same(
        strata,
        f"SELECT k, n, s, window_start FROM {agg}",
        "SELECT k, count(*), sum(v), date_bin('1 hour', t, timestamptz 'epoch') "
        f"FROM ({oracle}) j (k, v, rv, t) GROUP BY 1, 4",
    )


@pytest.mark.parametrize("side", ["LEFT", "RIGHT", "FULL"])
def test_outer_joins_pad_what_nothing_matches_until_a_late_match_arrives(
    module_strata: Strata, side: str
) -> None:
    """An outer join's NULL-padded rows are exact at every instant: a late match replaces
    the padded row in the same commit that archives the match (a reader compares the join
    with its batch query in one snapshot after every run)."""
    strata = module_strata
    n = next(_names)
    auction, bid, joined = f"oa_{n}", f"ob_{n}", f"oj_{n}"
    strata.create(
        f"CREATE STREAM {auction} (id bigint, category integer, date_time timestamptz, "
        "expires timestamptz) WITH (event_time = 'date_time')"
    )
    strata.create(
        f"CREATE STREAM {bid} (auction bigint, price bigint, date_time timestamptz) "
        "WITH (event_time = 'date_time')"
    )
    condition = (
        "ON b.auction = a.id AND b.date_time BETWEEN a.date_time AND a.expires "
        "WHERE coalesce(a.category, 0) <> 11"
    )
    strata.create(
        f"CREATE STREAM {joined} AS SELECT a.id, a.category, b.price, "
        f"coalesce(b.price, 0) AS paid, a.date_time FROM {auction} a {side} JOIN {bid} b "
        f"{condition}"
    )
    oracle = (
        f"SELECT a.id, a.category, b.price, coalesce(b.price, 0), a.date_time "
        f"FROM {auction} a {side} JOIN {bid} b {condition}"
    )
    view = f"SELECT id, category, price, paid, date_time FROM {joined}"
    rng = random.Random(3)
    runs: list[tuple[str, str]] = []
    for start in range(0, 30, 5):
        rows = []
        for key in range(start, start + 5):
            opened = rng.uniform(0, 3600)
            rows.append(
                {
                    "id": key,
                    "category": rng.choice([10, 11, None]),
                    "date_time": at(opened),
                    "expires": at(opened + 600),
                }
            )
        runs.append((auction, ndjson(rows)))
    for _ in range(8):
        rows = [
            {
                "auction": rng.randrange(-2, 32),
                "price": rng.randrange(100),
                "date_time": at(rng.uniform(0, 4200)),
            }
            for _ in range(6)
        ]
        runs.append((bid, ndjson(rows)))
    rng.shuffle(runs)
    for stream, body in runs:
        strata.ingest(stream, body)
        same(strata, view, oracle)
    both = "id IS NOT NULL AND price IS NOT NULL"  # ids and prices are never NULL
    padded = strata.query(f"SELECT count(*) FROM {joined} WHERE NOT ({both})")[0][0]
    matched = strata.query(f"SELECT count(*) FROM {joined} WHERE {both}")[0][0]
    assert padded > 0 and matched > 0


def test_keys_of_different_types_match_as_in_postgresql(module_strata: Strata) -> None:
    """bigint keys beyond integer's range probe an integer column (and numeric keys an
    integer one) without an overflow: they simply match nothing."""
    strata = module_strata
    n = next(_names)
    wide, narrow, joined = f"wide_{n}", f"narrow_{n}", f"typed_{n}"
    strata.create(
        f"CREATE STREAM {wide} (k bigint, d numeric(6,2), t timestamptz) WITH (event_time = 't')"
    )
    strata.create(f"CREATE STREAM {narrow} (k integer, t timestamptz) WITH (event_time = 't')")
    strata.create(
        f"CREATE STREAM {joined} AS SELECT w.k, w.d, n.t FROM {wide} w JOIN {narrow} n "
        "ON n.k = w.k OR n.k = w.d"
    )
    strata.create(
        f"CREATE STREAM {joined}_eq AS SELECT w.k, n.t FROM {wide} w JOIN {narrow} n ON n.k = w.k"
    )
    strata.ingest(narrow, ndjson([{"k": 7, "t": at(1)}, {"k": 2, "t": at(2)}]))
    strata.ingest(
        wide,
        ndjson(
            [
                {"k": 2**40, "d": "7.00", "t": at(3)},
                {"k": 7, "d": "2.50", "t": at(4)},
                {"k": -(2**35), "d": None, "t": at(5)},
            ]
        ),
    )
    same(
        strata,
        f"SELECT k, d, t FROM {joined}",
        f"SELECT w.k, w.d, n.t FROM {wide} w JOIN {narrow} n ON n.k = w.k OR n.k = w.d",
    )
    same(
        strata,
        f"SELECT k, t FROM {joined}_eq",
        f"SELECT w.k, n.t FROM {wide} w JOIN {narrow} n ON n.k = w.k",
    )
    assert strata.query(f"SELECT count(*) FROM {joined}_eq") == [(1,)]


@given(
    rows=two_sided_rows(keys=3, minutes=180, size=30, within=30),
    cuts=st.lists(st.integers(1, 5), min_size=1, max_size=8),
    side=st.sampled_from(["LEFT", "RIGHT", "FULL"]),
    order=st.randoms(use_true_random=False),
)
@settings(
    max_examples=examples(10),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_outer_joins_equal_the_batch_join_after_every_run_of_any_split_and_order(
    module_strata: Strata,
    rows: list[tuple[str, int, int]],
    cuts: list[int],
    side: str,
    order: random.Random,
) -> None:
    """Hypothesis: an outer band join of two streams, runs cut and ordered at random (a
    match may come hours after the row it un-pads; one run at least late, one pair at least
    matched): the view equals the batch outer join after every run."""
    strata = module_strata
    n = next(_names)
    left, right, joined = f"ol_{n}", f"or_{n}", f"oj_{n}"
    for name in (left, right):
        strata.create(
            f"CREATE STREAM {name} (k integer, v integer, t timestamptz) WITH (event_time = 't')"
        )
    condition = "ON l.k = r.k AND r.t BETWEEN l.t - INTERVAL '30 minutes' AND l.t"
    strata.create(
        f"CREATE STREAM {joined} AS SELECT l.k, l.v AS lv, r.v AS rv, l.t AS lt, r.t AS rt "
        f"FROM {left} l {side} JOIN {right} r {condition}"
    )
    runs = two_sided_runs(rows, cuts, left, right)
    order.shuffle(runs)
    oracle = f"SELECT l.k, l.v, r.v, l.t, r.t FROM {left} l {side} JOIN {right} r {condition}"
    for stream, run in with_a_late_run(runs, lambda r: when(r["t"]), rows=lambda run: run[1]):
        strata.ingest(stream, ndjson(run))
        same(strata, f"SELECT k, lv, rv, lt, rt FROM {joined}", oracle)
    matched = f"SELECT count(*) FROM {left} l JOIN {right} r {condition}"
    assert strata.query(matched)[0][0] > 0


def test_streams_over_outer_joins_and_gather_points_over_joins_stay_exact(
    module_strata: Strata,
) -> None:
    """An aggregate over a LEFT join (a late match retracts a NULL-padded row) and a MAX over
    COUNT over an inner join are serial: closed windows are archived, and a late run
    records the windows it changes through the join in its own commit. With the
    materializer and the repairer stepping between runs, every view equals its batch query
    after every run, and at the end windows were both archived and repaired."""
    strata = module_strata
    n = next(_names)
    auction, bid = f"sa_{n}", f"sb_{n}"
    outer, inner, per_auction = f"so_{n}", f"si_{n}", f"spa_{n}"
    padded, top, onestep = f"spad_{n}", f"stop_{n}", f"sone_{n}"
    strata.create(
        f"CREATE STREAM {auction} (id bigint, date_time timestamptz, expires timestamptz) "
        "WITH (event_time = 'date_time')"
    )
    strata.create(
        f"CREATE STREAM {bid} (auction bigint, price bigint, date_time timestamptz) "
        "WITH (event_time = 'date_time')"
    )
    band = "ON b.auction = a.id AND b.date_time BETWEEN a.date_time AND a.expires"
    strata.create(
        f"CREATE STREAM {outer} AS SELECT a.id, b.price, a.date_time "
        f"FROM {auction} a LEFT JOIN {bid} b {band}"
    )
    strata.create(
        f"CREATE STREAM {inner} AS SELECT b.auction, b.price, b.date_time "
        f"FROM {bid} b JOIN {auction} a {band}"
    )
    described = strata.create(
        f"CREATE STREAM {padded} AS SELECT count(*) AS n, count(price) AS matched, "
        f"sum(coalesce(price, 0)) AS paid, window_start "
        f"FROM TUMBLE({outer}, date_time, INTERVAL '10 minutes') GROUP BY window_start"
    )
    assert described["parallelism"] == "SP"
    strata.create(
        f"CREATE STREAM {per_auction} AS SELECT auction, count(*) AS bids, window_start "
        f"FROM TUMBLE({inner}, date_time, INTERVAL '10 minutes') GROUP BY auction, window_start"
    )
    strata.create(
        f"CREATE STREAM {top} AS SELECT max(bids) AS top, window_start "
        f"FROM TUMBLE({per_auction}, window_start, INTERVAL '30 minutes') GROUP BY window_start"
    )
    strata.create(
        f"CREATE STREAM {onestep} AS SELECT count(b.price) AS matched, window_end "
        f"FROM TUMBLE({auction}, date_time, INTERVAL '10 minutes') a "
        f"LEFT JOIN {bid} b {band} GROUP BY window_end"
    )
    left = f"SELECT a.id, b.price, a.date_time FROM {auction} a LEFT JOIN {bid} b {band}"
    window = "date_bin('{0}', date_time, timestamptz 'epoch')"
    pairs = f"SELECT b.auction, b.date_time FROM {bid} b JOIN {auction} a {band}"
    oracles = {
        f"SELECT n, matched, paid, window_start FROM {padded}": (
            "SELECT count(*), count(price), sum(coalesce(price, 0)), "
            f"{window.format('10 minutes')} FROM ({left}) j GROUP BY 4"
        ),
        f"SELECT top, window_start FROM {top}": (
            f"SELECT max(bids), {window.format('30 minutes')} FROM (SELECT auction, count(*) "
            f"AS bids, {window.format('10 minutes')} AS date_time FROM ({pairs}) p "
            "GROUP BY 1, 3) c GROUP BY 2"
        ),
        f"SELECT matched, window_end FROM {onestep}": (
            f"SELECT count(price), {window.format('10 minutes')} + interval '10 minutes' "
            f"FROM ({left}) j GROUP BY 2"
        ),
    }
    rng = random.Random(17)
    runs: list[tuple[str, str]] = []
    for start in range(0, 40, 4):
        rows = []
        for key in range(start, start + 4):
            opened = rng.uniform(0, 6 * 3600)
            rows.append({"id": key, "date_time": at(opened), "expires": at(opened + 1200)})
        runs.append((auction, ndjson(rows)))
    for _ in range(14):
        rows = [
            {
                "auction": rng.randrange(-1, 41),
                "price": rng.randrange(1, 100),
                "date_time": at(rng.uniform(0, 6.5 * 3600)),
            }
            for _ in range(8)
        ]
        runs.append((bid, ndjson(rows)))
    rng.shuffle(runs)
    engine, plans = strata.service.engine, strata.service.plans
    materializer = Materializer(engine, plans, batch=50)
    repairer = Repairer(engine, plans, batch=50)
    for stream, body in runs:
        strata.ingest(stream, body)
        for view, oracle in oracles.items():
            same(strata, view, oracle)
        materializer.run_once()
        if rng.random() < 0.5:
            repairer.run_once()
        for view, oracle in oracles.items():
            same(strata, view, oracle)
    while any(repairer.run_once().values()):
        pass
    for view, oracle in oracles.items():
        same(strata, view, oracle)
    archived = strata.query(f"SELECT count(*) FROM strata_internal.{padded}__serial")[0][0]
    repaired = strata.query(
        "SELECT count(*) FROM strata_catalog.window_revisions WHERE stream IN (%s, %s, %s)",
        padded,
        top,
        onestep,
    )[0][0]
    assert archived > 0 and repaired > 0, (archived, repaired)


def test_outer_joins_of_three_streams_and_joins_of_streams_and_a_table_read_exact(
    module_strata: Strata,
) -> None:
    """Joined on read: an outer join of three streams (a late row of any input can complete
    a combination and retract padded rows) and a join of two streams and a table; each
    equals a Python model of its join over the rows sent and the table's rows after every
    run, the table changed between runs."""
    strata = module_strata
    n = next(_names)
    names = [f"x{i}_{n}" for i in range(3)]
    for name in names:
        strata.create(
            f"CREATE STREAM {name} (k integer, v integer, t timestamptz) WITH (event_time = 't')"
        )
    a, b, c = names
    dim = f"dim_{n}"
    groups = {k: f"g{k % 2}" for k in range(5)}  # the table's rows, as the test keeps them
    with psycopg.connect(strata.database_url, autocommit=True) as connection:
        connection.execute(f"CREATE TABLE {dim} (k integer PRIMARY KEY, g text)")
        connection.execute(f"INSERT INTO {dim} SELECT k, 'g' || k % 2 FROM generate_series(0, 4) k")
    chain = (
        f"FROM {a} a LEFT JOIN {b} b ON b.k = a.k AND b.t BETWEEN a.t - INTERVAL '1 hour' AND a.t "
        f"FULL JOIN {c} c ON c.k = coalesce(b.k, a.k) AND c.v > 10"
    )
    with_table = f"FROM {a} a JOIN {b} b ON b.k = a.k JOIN {dim} d ON d.k = b.k WHERE d.g = 'g1'"
    outer, mixed = f"outer3_{n}", f"mixed_{n}"
    described = strata.create(
        f"CREATE STREAM {outer} AS SELECT a.k, a.v AS av, b.v AS bv, c.v AS cv, a.t {chain}"
    )
    assert described["parallelism"] == "on read"
    strata.create(f"CREATE STREAM {mixed} AS SELECT a.k, a.v, b.v AS bv, d.g, b.t {with_table}")
    sent: dict[str, list[Row]] = {name: [] for name in names}

    def chained() -> list[tuple[object, ...]]:
        """a LEFT JOIN b (same key, b within the hour before a), then FULL JOIN c (c's key
        that of b, or of a if b is padded, and c.v > 10): a row per match, NULLs for a row
        of a or of c that nothing matches."""
        hour = timedelta(hours=1)
        left: list[tuple[Row, Row | None]] = []
        for x in sent[a]:
            ys = [
                y
                for y in sent[b]
                if y["k"] == x["k"] and when(x["t"]) - hour <= when(y["t"]) <= when(x["t"])
            ]
            left += [(x, y) for y in ys] or [(x, None)]
        rows: list[tuple[object, ...]] = []
        matched: set[int] = set()
        for x, y in left:
            key = x["k"] if y is None else y["k"]
            zs = [(i, z) for i, z in enumerate(sent[c]) if z["k"] == key and z["v"] > 10]
            matched |= {i for i, _ in zs}
            bv = None if y is None else y["v"]
            rows += [(x["k"], x["v"], bv, z["v"], when(x["t"])) for _, z in zs] or [
                (x["k"], x["v"], bv, None, when(x["t"]))
            ]
        rows += [
            (None, None, None, z["v"], None) for i, z in enumerate(sent[c]) if i not in matched
        ]
        return rows

    def joined_with_table() -> list[tuple[object, ...]]:
        return [
            (x["k"], x["v"], y["v"], groups[y["k"]], when(y["t"]))
            for x in sent[a]
            for y in sent[b]
            if x["k"] == y["k"] and groups.get(y["k"]) == "g1"
        ]

    rng = random.Random(23)
    runs = []
    for stream in names:
        for _ in range(4):
            rows = [
                {"k": rng.randrange(6), "v": rng.randrange(30), "t": at(rng.uniform(0, 7200))}
                for _ in range(rng.randrange(1, 6))
            ]
            runs.append((stream, rows))
    rng.shuffle(runs)
    assert late(runs, lambda r: when(r["t"]), rows=lambda run: run[1])
    table_pairs = 0
    for step, (stream, rows) in enumerate(runs):
        strata.ingest(stream, ndjson(rows))
        sent[stream] += rows
        if step % 4 == 0:
            key = rng.randrange(5)
            groups[key] = "g0" if groups[key] == "g1" else "g1"
            with psycopg.connect(strata.database_url, autocommit=True) as connection:
                connection.execute(
                    f"UPDATE {dim} SET g = CASE g WHEN 'g1' THEN 'g0' ELSE 'g1' END WHERE k = %s",
                    (key,),
                )
        model = chained()
        equals_model(
            strata,
            {
                f"SELECT k, av, bv, cv, t FROM {outer}": model,
                f"SELECT k, v, bv, g, t FROM {mixed}": joined_with_table(),
            },
        )
        table_pairs += len(joined_with_table())
    # Rows of c that nothing matches, rows of a padded, and pairs joined with the table.
    assert any(av is None for _, av, *_ in model)
    assert any(av is not None and None in (bv, cv) for _, av, bv, cv, _ in model)
    assert table_pairs > 0
