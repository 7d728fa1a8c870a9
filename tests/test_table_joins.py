"""Stream-table joins follow the table's current content (invariant 6): every view of a
stream joined with a user's PostgreSQL table equals the same query run as a batch over all
rows received and the table as it is now - whatever the split into runs, their order and
lateness, whatever rows of the table were inserted, updated or deleted meanwhile, and at
every instant (real PostgreSQL, real Spark).

The oracle of an aggregate (partials per window and join columns, kept by Spark) is its
query run by PostgreSQL over the raw view and the table, in the same snapshot as the view.
A stream of rows joined with a table is a view whose text is its own query, so its oracle
is a Python model over the rows the test sent and the table's rows, which the test keeps.
"""

from __future__ import annotations

import itertools
import random
from collections import defaultdict
from datetime import datetime, timedelta
from decimal import Decimal

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server.workers.reducer import Reducer
from tests.conftest import Strata, examples
from tests.oracle import START, SnapshotReader, at, execute, ndjson, same, with_a_late_run
from tests.test_joins import Row, another, equals_model, when
from tests.test_pgwire import psql

_names = itertools.count()


class Shop:
    """A fresh impressions stream and campaigns table (owned by the user, made with SQL);
    the rows of the runs made, and the table's rows, as the test keeps them."""

    def __init__(self, strata: Strata, rng: random.Random) -> None:
        n = next(_names)
        self.strata, self.rng = strata, rng
        self.sent: list[Row] = []
        self.owners: dict[str, str | None] = {}
        self.imp, self.campaigns = f"imp_{n}", f"campaigns_{n}"
        strata.create(
            f"CREATE STREAM {self.imp} (campaign text, price numeric(12,2), t timestamptz) "
            "WITH (event_time = 't')"
        )
        execute(strata, f"CREATE TABLE {self.campaigns} (campaign text PRIMARY KEY, owner text)")
        for k in range(5):
            self.upsert(f"c{k}", f"o{k % 3}")

    def upsert(self, campaign: str, owner: str | None) -> None:
        execute(
            self.strata,
            f"INSERT INTO {self.campaigns} VALUES (%s, %s) "
            "ON CONFLICT (campaign) DO UPDATE SET owner = excluded.owner",
            campaign,
            owner,
        )
        self.owners[campaign] = owner

    def delete(self, campaign: str) -> None:
        execute(self.strata, f"DELETE FROM {self.campaigns} WHERE campaign = %s", campaign)
        self.owners.pop(campaign, None)

    def run(self, rows: int, hours_late: float = 0) -> str:
        base = 86_400 - hours_late * 3600
        made: list[Row] = [
            {
                "campaign": self.rng.choice([f"c{k}" for k in range(7)] + [None]),
                "price": round(self.rng.uniform(0, 50), 2),
                "t": at(base + self.rng.uniform(0, 3600)),
            }
            for _ in range(rows)
        ]
        self.sent += made
        return ndjson(made)


def price(row: Row) -> Decimal:
    """A row's price as its numeric column holds it (JSON writes a float's repr)."""
    return Decimal(repr(row["price"]))


SPEND = (
    "CREATE STREAM {name} AS SELECT c.owner, sum(i.price) AS revenue, count(*) AS n, "
    "window_end AS t FROM TUMBLE({imp}, t, INTERVAL '10 minutes') i "
    "JOIN {campaigns} c ON c.campaign = i.campaign GROUP BY c.owner, window_end"
)


def spend_oracle(shop: Shop) -> str:
    return (
        f"SELECT c.owner, sum(i.price), count(*), date_bin('10 minutes', i.t, "
        f"timestamptz 'epoch') + interval '10 minutes' FROM {shop.imp} i "
        f"JOIN {shop.campaigns} c ON c.campaign = i.campaign GROUP BY 1, 4"
    )


def test_aggregates_over_a_table_join_follow_the_tables_changes(module_strata: Strata) -> None:
    """The `spend` example: partials per window and campaign, the owner joined on read; an
    owner changed, a campaign added or deleted changes every window it is in at once,
    late runs included, and the reducer's folds change nothing."""
    shop = Shop(module_strata, random.Random(3))
    strata = module_strata
    strata.ingest(shop.imp, shop.run(200, hours_late=30))  # history, before the stream
    spend = f"spend_{next(_names)}"
    described = strata.create(SPEND.format(name=spend, imp=shop.imp, campaigns=shop.campaigns))
    assert described["parallelism"] == "PP"
    assert described["rewrite"]["tables"] == [shop.campaigns]  # type: ignore[index]
    view = f"SELECT owner, revenue, n, t FROM {spend}"
    for late in (0, 5, 48, 1):
        strata.ingest(shop.imp, shop.run(150, hours_late=late))
    assert same(strata, view, spend_oracle(shop)) > 5
    shop.upsert("c1", "o9")  # an owner changes
    shop.upsert("c5", "o5")  # a campaign the rows already named is added
    shop.delete("c0")
    same(strata, view, spend_oracle(shop))
    strata.ingest(shop.imp, shop.run(100, hours_late=72))
    Reducer(strata.service.engine, strata.service.plans, min_rows=1).run_once()
    same(strata, view, spend_oracle(shop))
    revenue = strata.query(f"SELECT sum(revenue) FROM {spend} WHERE owner = 'o9'")[0][0]
    assert revenue is not None and revenue > 0


def test_a_sketch_over_a_table_join_is_within_its_bound_on_read_and_after_folds(
    module_strata: Strata,
) -> None:
    """approx_percentile over a stream joined with a table: its final is a subquery per
    group whose own aliases the join's qualifying of the states (the stream's alias here is
    c) must leave alone. Every window and owner and count exact, every median within alpha
    of percentile_disc over the raw rows, on read, after folds, after an owner changes."""
    shop = Shop(module_strata, random.Random(11))
    strata = module_strata
    name = f"median_{next(_names)}"
    strata.create(
        f"CREATE STREAM {name} AS SELECT o.owner, approx_percentile(c.price, 0.5) AS median, "
        f"count(*) AS n, window_end AS t FROM TUMBLE({shop.imp}, t, INTERVAL '10 minutes') c "
        f"JOIN {shop.campaigns} o ON o.campaign = c.campaign GROUP BY o.owner, window_end"
    )
    oracle = (
        "SELECT o.owner, percentile_disc(0.5) WITHIN GROUP (ORDER BY i.price)::float8, "
        "count(*), date_bin('10 minutes', i.t, timestamptz 'epoch') + interval '10 minutes' "
        f"FROM {shop.imp} i JOIN {shop.campaigns} o ON o.campaign = i.campaign GROUP BY 1, 4"
    )

    def within_alpha() -> int:
        with psycopg.connect(strata.database_url) as connection:
            connection.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            got = connection.execute(f"SELECT owner, median, n, t FROM {name}").fetchall()
            want = connection.execute(oracle).fetchall()  # type: ignore[arg-type]
        got_by = {(r[0], r[3]): r for r in got}
        want_by = {(r[0], r[3]): r for r in want}
        assert got_by.keys() == want_by.keys()
        for key, (_, median, n, _) in got_by.items():
            _, exact, count, _ = want_by[key]
            assert n == count, key
            assert abs(median - exact) <= 0.01 * abs(exact) + 1e-9, (key, median, exact)
        return len(got)

    for late in (0, 5, 48, 1):
        strata.ingest(shop.imp, shop.run(150, hours_late=late))
    assert within_alpha() > 5
    Reducer(strata.service.engine, strata.service.plans, min_rows=0).run_once()
    strata.ingest(shop.imp, shop.run(100, hours_late=5))  # late rows on folded windows
    within_alpha()
    Reducer(strata.service.engine, strata.service.plans, min_rows=0).run_once()
    shop.upsert("c1", "o9")
    within_alpha()


def test_hop_left_join_filters_on_both_sides_and_having(module_strata: Strata) -> None:
    shop = Shop(module_strata, random.Random(5))
    strata = module_strata
    name = f"hop_{next(_names)}"
    strata.create(
        f"CREATE STREAM {name} AS SELECT c.owner, i.campaign, max(i.price) AS top, "
        "avg(i.price) AS mean, count(DISTINCT i.price) AS prices, window_start "
        f"FROM HOP({shop.imp}, t, INTERVAL '10 minutes', INTERVAL '30 minutes') AS i "
        f"LEFT JOIN {shop.campaigns} c ON c.campaign = i.campaign "
        "WHERE i.price > 5 AND (c.owner IS NULL OR c.owner <> 'o2') "
        "GROUP BY c.owner, i.campaign, window_start HAVING count(*) > 1"
    )
    for late in (0, 20, 2, 0):
        strata.ingest(shop.imp, shop.run(120, hours_late=late))
    shop.upsert("c2", None)
    shop.upsert("c4", "o2")
    hop = (
        f"(SELECT i.*, w.window_start FROM {shop.imp} i, LATERAL (SELECT date_bin('10 minutes', "
        "i.t, timestamptz 'epoch') - k * interval '10 minutes' AS window_start "
        "FROM generate_series(0, 2) k) w)"
    )
    oracle = (
        f"SELECT c.owner, i.campaign, max(i.price), avg(i.price), count(DISTINCT i.price), "
        f"i.window_start FROM {hop} i LEFT JOIN {shop.campaigns} c ON c.campaign = i.campaign "
        "WHERE i.price > 5 AND (c.owner IS NULL OR c.owner <> 'o2') "
        "GROUP BY 1, 2, 6 HAVING count(*) > 1"
    )
    view = f"SELECT owner, campaign, top, round(mean, 10), prices, window_start FROM {name}"
    assert same(strata, view, oracle.replace("avg(i.price)", "round(avg(i.price), 10)")) > 5


def test_rows_joined_on_read_and_versions_as_of_event_time(module_strata: Strata) -> None:
    """A stream of rows joined with a table (LEFT: rows without a campaign stay) and with
    the version of a rate valid at each row's time, a version arriving late included."""
    shop = Shop(module_strata, random.Random(9))
    strata = module_strata
    rates = f"rates_{next(_names)}"
    execute(
        strata,
        f"CREATE TABLE {rates} (campaign text, valid_from timestamptz, rate numeric, "
        "PRIMARY KEY (campaign, valid_from))",
    )
    versions: dict[tuple[str, datetime], Decimal] = {}  # (campaign, valid from): rate
    for k in range(5):
        execute(strata, f"INSERT INTO {rates} VALUES (%s, %s, %s)", f"c{k}", START, k + 1)
        versions[f"c{k}", START] = Decimal(k + 1)
    enriched, priced = f"enriched_{next(_names)}", f"priced_{next(_names)}"
    described = strata.create(
        f"CREATE STREAM {enriched} AS SELECT i.*, c.owner FROM {shop.imp} i "
        f"LEFT JOIN {shop.campaigns} c ON c.campaign = i.campaign WHERE i.price >= 1"
    )
    assert described["parallelism"] == "on read"
    assert described["event_time"] == "t"
    strata.create(
        f"CREATE STREAM {priced} AS SELECT i.campaign, i.price * r.rate AS usd, "
        f"r.valid_from, i.t FROM {shop.imp} i "
        f"JOIN {rates} FOR SYSTEM_TIME AS OF i.t AS r ON r.campaign = i.campaign"
    )
    for late in (0, 3, 0):
        strata.ingest(shop.imp, shop.run(60, hours_late=late))
    # A new rate valid from the middle of the day, arriving after the rows it prices.
    execute(strata, f"INSERT INTO {rates} VALUES ('c1', %s, 100)", START + timedelta(hours=24.5))
    versions["c1", START + timedelta(hours=24.5)] = Decimal(100)
    shop.upsert("c3", "o7")
    # LEFT JOIN: every row of price 1 or more, with its campaign's owner now or NULL.
    left = [
        (r["campaign"], price(r), when(r["t"]), shop.owners.get(r["campaign"]))
        for r in shop.sent
        if price(r) >= 1
    ]
    # Per row, the version of its campaign's rate with the latest validity not after it.
    priced_rows = []
    for r in shop.sent:
        valid = [v for c, v in versions if c == r["campaign"] and v <= when(r["t"])]
        if valid:
            rate = versions[r["campaign"], max(valid)]
            priced_rows.append((r["campaign"], price(r) * rate, max(valid), when(r["t"])))
    equals_model(
        strata,
        {
            f"SELECT campaign, price, t, owner FROM {enriched}": left,
            f"SELECT campaign, usd, valid_from, t FROM {priced}": priced_rows,
        },
    )
    assert any(owner is None for *_, owner in left) and any(owner for *_, owner in left)
    assert len(priced_rows) > 50
    assert any(usd >= 100 for _, usd, _, _ in priced_rows)  # the version that came late


def test_refusals_name_the_construct(module_strata: Strata) -> None:
    shop = Shop(module_strata, random.Random(1))
    strata = module_strata
    plain = f"plain_{next(_names)}"
    execute(strata, f"CREATE TABLE {plain} (campaign text, rate numeric)")

    def refused(select: str) -> str:
        response = strata.client.post(
            "/streams", json={"sql": f"CREATE STREAM bad_{next(_names)} AS {select}"}
        )
        assert response.status_code in (400, 404), response.text
        return str(response.json()["error"])

    imp, campaigns = shop.imp, shop.campaigns
    window = f"TUMBLE({imp}, t, INTERVAL '1 hour') i"
    assert "stream's columns" in refused(
        f"SELECT count(c.owner) AS n, window_start FROM {window} "
        f"JOIN {campaigns} c ON c.campaign = i.campaign GROUP BY window_start"
    )
    assert "keeps rows of the stream" in refused(
        f"SELECT count(*) AS n, window_start FROM {window} RIGHT JOIN {campaigns} c "
        "ON c.campaign = i.campaign GROUP BY window_start"
    )
    assert "FROM stream LEFT JOIN table" in refused(
        f"SELECT count(*) AS n, window_start FROM {campaigns} c LEFT JOIN {window} "
        "ON c.campaign = i.campaign GROUP BY window_start"
    )
    assert "PRIMARY KEY" in refused(
        f"SELECT i.t FROM {imp} i JOIN {plain} FOR SYSTEM_TIME AS OF i.t AS r "
        "ON r.campaign = i.campaign"
    )
    assert "ambiguous" in refused(
        f"SELECT campaign, i.t FROM {imp} i JOIN {campaigns} c ON c.campaign = i.campaign"
    )
    assert "window of the stream" in refused(
        f"SELECT c.owner, count(*) AS n FROM {imp} i JOIN {campaigns} c "
        "ON c.campaign = i.campaign GROUP BY c.owner"
    )
    assert "neither a stream nor a table" in refused(
        f"SELECT i.t FROM {imp} i JOIN no_such_table c ON c.campaign = i.campaign"
    )
    enriched = f"enriched_{next(_names)}"
    strata.create(
        f"CREATE STREAM {enriched} AS SELECT i.t, c.owner FROM {imp} i "
        f"JOIN {campaigns} c ON c.campaign = i.campaign"
    )
    assert "in one statement" in refused(
        f"SELECT owner, count(*) AS n, window_start FROM TUMBLE({enriched}, t, "
        "INTERVAL '1 hour') GROUP BY owner, window_start"
    )
    # PostgreSQL keeps the table a stream reads from being dropped under it.
    with pytest.raises(psycopg.errors.DependentObjectsStillExist):
        execute(strata, f"DROP TABLE {campaigns}")


def test_a_reader_sees_every_snapshot_exact_while_runs_and_table_changes_arrive(
    strata: Strata,
) -> None:
    shop = Shop(strata, random.Random(13))
    spend = f"spend_{next(_names)}"
    strata.create(SPEND.format(name=spend, imp=shop.imp, campaigns=shop.campaigns))
    view = f"SELECT owner, revenue, n, t FROM {spend}"
    with SnapshotReader.of(strata.database_url, {view: spend_oracle(shop)}, min_snapshots=5):
        posted = []
        for i in range(30):
            response = strata.post_run(
                shop.imp, shop.run(20, hours_late=shop.rng.choice([0, 0, 6, 30])), wait=False
            )
            assert response.status_code == 202, response.text
            posted.append(response.json()["run_id"])
            if i % 3 == 0:
                shop.upsert(f"c{shop.rng.randrange(7)}", f"o{shop.rng.randrange(4)}")
            if i % 7 == 0:
                shop.delete(f"c{shop.rng.randrange(7)}")
        for run_id in posted:
            strata.service.wait(strata.service.run(run_id), 120)  # type: ignore[arg-type]
    assert same(strata, view, spend_oracle(shop)) > 0


Change = tuple[str, tuple[int, int] | int]  # ("upsert", (k, g)) or ("delete", k)


@st.composite
def keyed_runs(draw: st.DrawFn) -> list[list[tuple[int, int]]]:
    """Two to six runs of rows (key, ten-minute step), at two distinct times at least (so
    that some order of the runs makes one late)."""
    runs = draw(
        st.lists(
            st.lists(st.tuples(st.integers(0, 5), st.integers(0, 600)), min_size=1, max_size=8),
            min_size=2,
            max_size=6,
        )
    )
    run = runs[draw(st.integers(0, len(runs) - 1))]
    run.insert(
        draw(st.integers(0, len(run))), (draw(st.integers(0, 5)), another(draw, runs[0][0][1], 600))
    )
    return runs


@given(
    runs=keyed_runs(),
    changes=st.lists(
        st.one_of(
            st.tuples(st.just("upsert"), st.tuples(st.integers(0, 5), st.integers(0, 2))),
            st.tuples(st.just("delete"), st.integers(0, 5)),
        ),
        max_size=7,
    ),
    order=st.randoms(use_true_random=False),
)
@settings(
    max_examples=examples(10),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_any_runs_and_table_changes_give_the_model_query(
    module_strata: Strata,
    runs: list[list[tuple[int, int]]],
    changes: list[Change],
    order: random.Random,
) -> None:
    """Hypothesis: runs (cut and ordered at random, minutes to days late, one at least
    late) interleaved with inserts, updates and deletes of the table, then an insert of a
    key the runs hold: the aggregate and the row views equal a Python model of their
    queries over the rows sent and the table's rows after every step."""
    strata = module_strata
    n = next(_names)
    imp, dim, agg, joined = f"himp_{n}", f"hdim_{n}", f"hagg_{n}", f"hrows_{n}"
    strata.create(
        f"CREATE STREAM {imp} (k integer, v integer, t timestamptz) WITH (event_time = 't')"
    )
    execute(strata, f"CREATE TABLE {dim} (k integer PRIMARY KEY, g integer)")
    strata.create(
        f"CREATE STREAM {agg} AS SELECT d.g, sum(i.v) AS s, count(*) AS n, min(i.v) AS lo, "
        f"window_start FROM TUMBLE({imp}, t, INTERVAL '1 hour') i JOIN {dim} d ON d.k = i.k "
        "GROUP BY d.g, window_start"
    )
    strata.create(
        f"CREATE STREAM {joined} AS SELECT i.k, i.v, i.t, d.g FROM {imp} i "
        f"LEFT JOIN {dim} d ON d.k = i.k"
    )
    order.shuffle(runs)
    runs = with_a_late_run(runs, lambda row: row[1])
    steps: list[Change] = [*[("run", 0)] * len(runs), *changes]
    order.shuffle(steps)
    steps.append(("upsert", (runs[0][0][0], 0)))  # the inner join holds a pair at the end
    sending = iter(runs)
    sent: list[tuple[int, int, int]] = []  # k, v, seconds after START
    groups: dict[int, int] = {}  # the table: k -> g
    for kind, payload in steps:
        if kind == "run":
            rows = [(k, len(sent) + i, minute * 600) for i, (k, minute) in enumerate(next(sending))]
            strata.ingest(imp, ndjson([{"k": k, "v": v, "t": at(s)} for k, v, s in rows]))
            sent += rows
        elif kind == "upsert":
            assert isinstance(payload, tuple)
            execute(
                strata,
                f"INSERT INTO {dim} VALUES (%s, %s) ON CONFLICT (k) DO UPDATE SET g = excluded.g",
                *payload,
            )
            groups[payload[0]] = payload[1]
        else:
            execute(strata, f"DELETE FROM {dim} WHERE k = %s", payload)
            groups.pop(payload, None)  # type: ignore[arg-type]
        windows: dict[tuple[int, int], list[int]] = defaultdict(list)  # (g, window) -> v's
        for k, v, s in sent:
            if k in groups:
                windows[groups[k], s - s % 3600].append(v)
        aggregated = [
            (g, sum(vs), len(vs), min(vs), START + timedelta(seconds=w))
            for (g, w), vs in windows.items()
        ]
        equals_model(
            strata,
            {
                f"SELECT g, s, n, lo, window_start FROM {agg}": aggregated,
                f"SELECT k, v, t, g FROM {joined}": [
                    (k, v, START + timedelta(seconds=s), groups.get(k)) for k, v, s in sent
                ],
            },
        )
    assert aggregated, "the join with the table is empty"


def test_a_table_made_and_changed_in_psql_is_joined_through_the_sql_port(
    module_strata: Strata,
) -> None:
    """The user's whole path with the real psql: create a table, a stream and a stream
    joining both through the SQL port, COPY rows in, change the table, read the view."""
    strata = module_strata
    n = next(_names)
    script = f"""
CREATE TABLE owners_{n} (campaign text PRIMARY KEY, owner text);
INSERT INTO owners_{n} VALUES ('a', 'ann'), ('b', 'bob');
CREATE STREAM clicks_{n} (campaign text, price numeric(8,2), t timestamptz)
  WITH (event_time = 't');
CREATE STREAM by_owner_{n} AS SELECT o.owner, sum(c.price) AS spent, window_start
  FROM TUMBLE(clicks_{n}, t, INTERVAL '1 hour') c JOIN owners_{n} o ON o.campaign = c.campaign
  GROUP BY o.owner, window_start;
COPY clicks_{n} FROM STDIN WITH (FORMAT csv);
a,1.50,2024-05-01T00:10:00Z
b,2.00,2024-05-01T00:20:00Z
a,3.00,2024-04-28T09:00:00Z
\\.
UPDATE owners_{n} SET owner = 'bob' WHERE campaign = 'a';
SELECT owner, spent, window_start FROM by_owner_{n} ORDER BY window_start;
"""
    result = psql(strata.psql_url, "-A", "-t", "-F", ",", stdin=script)
    lines = [line for line in result.stdout.splitlines() if line.startswith("bob,")]
    assert lines == ["bob,3.00,2024-04-28 09:00:00+00", "bob,3.50,2024-05-01 00:00:00+00"], (
        result.stdout
    )


@st.composite
def three_sided_rows(draw: st.DrawFn, size: int) -> tuple[list[tuple[str, int, int]], int]:
    """Rows ("a", "b" or "c", key, minute) of three streams, among them one of each stream
    of one key, c's 1 to 60 minutes after a's (a triple of the three-way join, and two
    distinct times, so that some order of the runs makes one late), at drawn places; and
    that key."""
    rows = draw(
        st.lists(
            st.tuples(st.sampled_from("abc"), st.integers(0, 3), st.integers(0, 300)),
            max_size=size - 3,
        )
    )
    key, minute = draw(st.integers(0, 3)), draw(st.integers(0, 240))
    triple = [("a", key, minute), ("b", key, draw(st.integers(0, 300)))]
    triple.append(("c", key, minute + draw(st.integers(1, 60))))
    for row in triple:
        rows.insert(draw(st.integers(0, len(rows))), row)
    return rows, key


@given(
    drawn=three_sided_rows(size=30),
    changes=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2) | st.none()), max_size=6),
    order=st.randoms(use_true_random=False),
)
@settings(
    max_examples=examples(8),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_three_streams_and_a_table(
    module_strata: Strata,
    drawn: tuple[list[tuple[str, int, int]], int],
    changes: list[tuple[int, int | None]],
    order: random.Random,
) -> None:
    """Hypothesis: a three-way band join of streams, and an aggregate over it joined with a
    table; runs of the three streams in random order (hours apart, one at least late)
    interleaved with table changes (None deletes), then an insert of the key of a joined
    triple: both views equal the batch queries after every step, and are not empty at the
    end."""
    rows, key = drawn
    strata = module_strata
    n = next(_names)
    a, b, c, dim = f"ta_{n}", f"tb_{n}", f"tc_{n}", f"tdim_{n}"
    joined, agg = f"tj_{n}", f"tagg_{n}"
    for name in (a, b, c):
        strata.create(
            f"CREATE STREAM {name} (k integer, v integer, t timestamptz) WITH (event_time = 't')"
        )
    execute(strata, f"CREATE TABLE {dim} (k integer PRIMARY KEY, g integer)")
    join = (
        f"FROM {a} x JOIN {b} y ON x.k = y.k JOIN {c} z ON z.k = y.k "
        "AND z.t BETWEEN x.t - INTERVAL '1 hour' AND x.t + INTERVAL '1 hour'"
    )
    strata.create(
        f"CREATE STREAM {joined} AS SELECT x.k, x.v AS xv, y.v AS yv, z.v AS zv, x.t {join}"
    )
    strata.create(
        f"CREATE STREAM {agg} AS SELECT d.g, count(*) AS n, sum(j.zv) AS s, window_start "
        f"FROM TUMBLE({joined}, t, INTERVAL '1 hour') j JOIN {dim} d ON d.k = j.k "
        "GROUP BY d.g, window_start"
    )
    streams = {"a": a, "b": b, "c": c}
    runs = [
        (streams[s], {"k": k, "v": i, "t": at(minute * 60)})
        for i, (s, k, minute) in enumerate(rows)
    ]
    order.shuffle(runs)
    runs = with_a_late_run(runs, lambda row: when(row["t"]), rows=lambda run: [run[1]])
    kinds = [*["run"] * len(runs), *["change"] * len(changes)]
    order.shuffle(kinds)
    sending, changing = iter(runs), iter(changes)
    steps = [next(sending) if kind == "run" else next(changing) for kind in kinds]
    steps.append((key, 0))  # the triple's key in the table: the aggregate holds a row
    oracle = f"SELECT x.k, x.v, y.v, z.v, x.t {join}"
    for step in steps:
        if isinstance(step[0], str):
            strata.ingest(step[0], ndjson([step[1]]))  # type: ignore[list-item]
        elif step[1] is None:
            execute(strata, f"DELETE FROM {dim} WHERE k = %s", step[0])
        else:
            execute(
                strata,
                f"INSERT INTO {dim} VALUES (%s, %s) ON CONFLICT (k) DO UPDATE SET g = excluded.g",
                *step,
            )
        triples = same(strata, f"SELECT k, xv, yv, zv, t FROM {joined}", oracle)
        windows = same(
            strata,
            f"SELECT g, n, s, window_start FROM {agg}",
            f"SELECT d.g, count(*), sum(j.zv), date_bin('1 hour', j.t, timestamptz 'epoch') "
            f"FROM ({oracle}) j (k, xv, yv, zv, t) JOIN {dim} d ON d.k = j.k GROUP BY 1, 4",
        )
    assert triples > 0 and windows > 0
