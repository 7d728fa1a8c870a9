"""Stream-table joins follow the table's current content (invariant 6): every view of a
stream joined with a user's PostgreSQL table equals the same query run as a batch over all
rows received and the table as it is now - whatever the split into runs, their order and
lateness, whatever rows of the table were inserted, updated or deleted meanwhile, and at
every instant (real PostgreSQL, real Spark).

The oracle of each view is its query run by PostgreSQL over the raw view and the table,
in the same snapshot as the view.
"""

from __future__ import annotations

import itertools
import random
import threading
from datetime import timedelta

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server.workers.reducer import Reducer
from tests.conftest import Strata
from tests.oracle import START, at, canonical, execute, ndjson, same
from tests.test_pgwire import psql

_names = itertools.count()


class Shop:
    """A fresh impressions stream and campaigns table (owned by the user, made with SQL)."""

    def __init__(self, strata: Strata, rng: random.Random) -> None:
        n = next(_names)
        self.strata, self.rng = strata, rng
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

    def delete(self, campaign: str) -> None:
        execute(self.strata, f"DELETE FROM {self.campaigns} WHERE campaign = %s", campaign)

    def run(self, rows: int, hours_late: float = 0) -> str:
        base = 86_400 - hours_late * 3600
        return ndjson(
            [
                {
                    "campaign": self.rng.choice([f"c{k}" for k in range(7)] + [None]),
                    "price": round(self.rng.uniform(0, 50), 2),
                    "t": at(base + self.rng.uniform(0, 3600)),
                }
                for _ in range(rows)
            ]
        )


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
    for k in range(5):
        execute(strata, f"INSERT INTO {rates} VALUES (%s, %s, %s)", f"c{k}", START, k + 1)
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
    shop.upsert("c3", "o7")
    same(
        strata,
        f"SELECT campaign, price, t, owner FROM {enriched}",
        f"SELECT i.campaign, i.price, i.t, c.owner FROM {shop.imp} i "
        f"LEFT JOIN {shop.campaigns} c ON c.campaign = i.campaign WHERE i.price >= 1",
    )
    rows = same(
        strata,
        f"SELECT campaign, usd, valid_from, t FROM {priced}",
        f"SELECT i.campaign, i.price * r.rate, r.valid_from, i.t FROM {shop.imp} i "
        f"JOIN {rates} r ON r.campaign = i.campaign AND r.valid_from = (SELECT max(valid_from) "
        f"FROM {rates} v WHERE v.campaign = i.campaign AND v.valid_from <= i.t)",
    )
    assert rows > 50
    assert strata.query(f"SELECT count(*) FROM {priced} WHERE usd >= 100 * 1")[0][0] > 0


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
    stop = threading.Event()
    reads: list[bool] = []

    def reader() -> None:
        with psycopg.connect(strata.database_url, autocommit=True) as connection:
            while not stop.is_set():
                with connection.transaction():
                    connection.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                    got = canonical(connection.execute(view).fetchall())
                    want = canonical(connection.execute(spend_oracle(shop)).fetchall())
                reads.append(got == want)

    checker = threading.Thread(target=reader)
    checker.start()
    try:
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
    finally:
        stop.set()
        checker.join()
    assert reads and all(reads), f"{reads.count(False)} of {len(reads)} snapshots differed"
    same(strata, view, spend_oracle(shop))


@given(
    steps=st.lists(
        st.one_of(
            st.tuples(
                st.just("run"),
                st.lists(st.tuples(st.integers(0, 5), st.integers(0, 600)), min_size=1, max_size=8),
            ),
            st.tuples(st.just("upsert"), st.tuples(st.integers(0, 5), st.integers(0, 2))),
            st.tuples(st.just("delete"), st.integers(0, 5)),
        ),
        min_size=1,
        max_size=14,
    ),
    order=st.randoms(use_true_random=False),
)
@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_any_runs_and_table_changes_give_the_batch_query(
    module_strata: Strata, steps: list[tuple[str, object]], order: random.Random
) -> None:
    """Hypothesis: runs (cut and ordered at random, minutes to days late) interleaved with
    inserts, updates and deletes of the table: the aggregate and the row views equal the
    batch queries after every step."""
    strata = module_strata
    n = next(_names)
    imp, dim, agg, rows = f"himp_{n}", f"hdim_{n}", f"hagg_{n}", f"hrows_{n}"
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
        f"CREATE STREAM {rows} AS SELECT i.k, i.v, i.t, d.g FROM {imp} i "
        f"LEFT JOIN {dim} d ON d.k = i.k"
    )
    runs = [s for s in steps if s[0] == "run"]
    order.shuffle(runs)
    shuffled = iter(runs)
    serial = itertools.count()
    for kind, payload in steps:
        if kind == "run":
            _, body = next(shuffled)
            assert isinstance(body, list)
            strata.ingest(
                imp,
                ndjson([{"k": k, "v": next(serial), "t": at(minute * 600)} for k, minute in body]),
            )
        elif kind == "upsert":
            assert isinstance(payload, tuple)
            execute(
                strata,
                f"INSERT INTO {dim} VALUES (%s, %s) ON CONFLICT (k) DO UPDATE SET g = excluded.g",
                *payload,
            )
        else:
            execute(strata, f"DELETE FROM {dim} WHERE k = %s", payload)
        same(
            strata,
            f"SELECT g, s, n, lo, window_start FROM {agg}",
            f"SELECT d.g, sum(i.v), count(*), min(i.v), date_bin('1 hour', i.t, "
            f"timestamptz 'epoch') FROM {imp} i JOIN {dim} d ON d.k = i.k GROUP BY 1, 5",
        )
        same(
            strata,
            f"SELECT k, v, t, g FROM {rows}",
            f"SELECT i.k, i.v, i.t, d.g FROM {imp} i LEFT JOIN {dim} d ON d.k = i.k",
        )


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


@given(
    rows=st.lists(
        st.tuples(st.sampled_from("abc"), st.integers(0, 3), st.integers(0, 300)),
        min_size=1,
        max_size=30,
    ),
    changes=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2) | st.none()), max_size=6),
    order=st.randoms(use_true_random=False),
)
@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_three_streams_and_a_table(
    module_strata: Strata,
    rows: list[tuple[str, int, int]],
    changes: list[tuple[int, int | None]],
    order: random.Random,
) -> None:
    """Hypothesis: a three-way band join of streams, and an aggregate over it joined with a
    table; runs of the three streams in random order (hours apart) interleaved with table
    changes (None deletes): both views equal the batch queries after every step."""
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
        (streams[s], ndjson([{"k": k, "v": i, "t": at(minute * 60)}]))
        for i, (s, k, minute) in enumerate(rows)
    ]
    order.shuffle(runs)
    steps: list[tuple[str, str] | tuple[int, int | None]] = [*runs, *changes]
    order.shuffle(steps)
    oracle = f"SELECT x.k, x.v, y.v, z.v, x.t {join}"
    for step in steps:
        if isinstance(step[0], str):
            strata.ingest(step[0], str(step[1]))
        elif step[1] is None:
            execute(strata, f"DELETE FROM {dim} WHERE k = %s", step[0])
        else:
            execute(
                strata,
                f"INSERT INTO {dim} VALUES (%s, %s) ON CONFLICT (k) DO UPDATE SET g = excluded.g",
                *step,
            )
        same(strata, f"SELECT k, xv, yv, zv, t FROM {joined}", oracle)
        same(
            strata,
            f"SELECT g, n, s, window_start FROM {agg}",
            f"SELECT d.g, count(*), sum(j.zv), date_bin('1 hour', j.t, timestamptz 'epoch') "
            f"FROM ({oracle}) j (k, xv, yv, zv, t) JOIN {dim} d ON d.k = j.k GROUP BY 1, 4",
        )
