"""The change feed of a stream that joins a PostgreSQL table on read: a subscriber applying
the events ends with the view after every step - runs in any order and lateness, rows of
the table inserted, updated, deleted or truncated by the user's own SQL - and with a Python
model of the query over the rows sent and the table's rows (not Strata's SQL); changes a
table made say ``cause: table``, a run's ``cause: run``, each position once, in order."""

from __future__ import annotations

import itertools
import time
from collections import defaultdict
from collections.abc import Iterator
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import httpx
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

from rewriter.naming import CATALOG_SCHEMA
from server.workers.reducer import Reducer
from tests.conftest import Strata, examples
from tests.oracle import execute
from tests.test_feed import START, Subscriber, assert_caught_up, latest, run_body, serving

KEYS = ("w", "owner")
NAMES = itertools.count()
KEYS_SENT = "abcde"
OWNERS = ("o1", "o2", "o3")


@pytest.fixture(scope="module")
def served(module_strata: Strata) -> Iterator[str]:
    with serving(module_strata.client.app) as url:  # type: ignore[arg-type]
        yield url


class Shop:
    """A raw stream ``ev`` (k, v, t), the user's table ``dim`` (k -> owner) and the stream
    ``agg`` of count and sum per owner and 10 minutes, joined on read; the rows sent and the
    table's rows as the test keeps them."""

    def __init__(self, strata: Strata) -> None:
        n = next(NAMES)
        self.strata = strata
        self.ev, self.dim, self.agg = f"tev_{n}", f"tdim_{n}", f"tagg_{n}"
        strata.create(
            f"CREATE STREAM {self.ev} (k text, v bigint, t timestamptz) WITH (event_time = 't')"
        )
        execute(strata, f"CREATE TABLE {self.dim} (k text PRIMARY KEY, owner text)")
        self.owners: dict[str, str | None] = {}
        for i, k in enumerate(KEYS_SENT[:3]):
            self.upsert(k, OWNERS[i % 2])
        strata.create(
            f"CREATE STREAM {self.agg} AS SELECT d.owner, count(*) AS n, sum(e.v) AS s, "
            f"window_end AS w FROM TUMBLE({self.ev}, t, INTERVAL '10 minutes') e "
            f"JOIN {self.dim} d ON d.k = e.k GROUP BY d.owner, window_end"
        )
        self.sent: list[tuple[str, int, int]] = []  # k, v, seconds after START

    def upsert(self, k: str, owner: str | None) -> None:
        execute(
            self.strata,
            f"INSERT INTO {self.dim} VALUES (%s, %s) "
            "ON CONFLICT (k) DO UPDATE SET owner = excluded.owner",
            k,
            owner,
        )
        self.owners[k] = owner

    def delete(self, k: str) -> None:
        execute(self.strata, f"DELETE FROM {self.dim} WHERE k = %s", k)
        self.owners.pop(k, None)

    def truncate(self) -> None:
        execute(self.strata, f"TRUNCATE {self.dim}")
        self.owners.clear()

    def post(self, rows: list[tuple[str, int, int]], run_id: str) -> None:
        self.strata.ingest(self.ev, run_body(rows), run_id=run_id)
        self.sent += rows

    def model(self) -> set[tuple[object, ...]]:
        """The query over the rows sent and the table's rows, in Python."""
        groups: dict[tuple[str | None, int], list[int]] = defaultdict(list)
        for k, v, s in self.sent:
            if k in self.owners:
                groups[self.owners[k], s - s % 600 + 600].append(v)
        return {
            (owner, len(vs), Decimal(sum(vs)), START + timedelta(seconds=end))
            for (owner, end), vs in groups.items()
        }


def applied(subscriber: Subscriber) -> set[tuple[object, ...]]:
    """The subscriber's rows, as the model's tuples."""
    return {
        (r["owner"], int(r["n"]), Decimal(r["s"]), datetime.fromisoformat(r["w"]))
        for r in subscriber.rows.values()
    }


def announced(strata: Strata, stream: str) -> bool:
    """Whether the feed holds every change of the tables ``stream`` joins."""
    with psycopg.connect(strata.database_url) as connection:
        row = connection.execute(
            sql.SQL(
                "SELECT f.tables_version = (SELECT sum(v.version) FROM {} v "
                "WHERE v.relation = ANY(f.tables)) FROM {} f WHERE f.stream = %s"
            ).format(
                sql.Identifier(CATALOG_SCHEMA, "table_versions"),
                sql.Identifier(CATALOG_SCHEMA, "feeds"),
            ),
            (stream,),
        ).fetchone()
    assert row is not None, f"{stream} is not followed"
    return bool(row[0])


def settle(strata: Strata, shop: Shop, subscriber: Subscriber, timeout: float = 20) -> int:
    """Wait until the feed announced every table change (a subscriber's poll does, about
    once a second), then: the subscriber holds the view, and the model; the position."""
    deadline = time.monotonic() + timeout
    while not announced(strata, shop.agg):
        assert time.monotonic() < deadline, "a table change was never announced"
        time.sleep(0.1)
    position = assert_caught_up(strata, subscriber, KEYS)
    assert applied(subscriber) == shop.model()
    return position


def causes(changes: list[dict[str, Any]]) -> set[str]:
    return {c["cause"] for c in changes}


RUN = st.lists(
    st.tuples(st.sampled_from(KEYS_SENT), st.integers(0, 9), st.integers(0, 8 * 3600)),
    min_size=1,
    max_size=6,
)
TABLE = st.one_of(
    st.tuples(st.just("upsert"), st.sampled_from(KEYS_SENT), st.sampled_from((*OWNERS, None))),
    st.tuples(st.just("delete"), st.sampled_from(KEYS_SENT)),
    st.just(("truncate",)),
)
STEP = st.one_of(RUN, TABLE, st.just("reduce"))


@settings(
    max_examples=examples(4),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=st.lists(STEP, min_size=2, max_size=10), seed=st.integers(0, 2**16))
def test_a_subscriber_follows_runs_and_the_tables_changes(
    module_strata: Strata, served: str, steps: list[Any], seed: int
) -> None:
    """Hypothesis: runs hours apart in any order, the table changed by the user's SQL and
    the reducer's folds interleaved; after every step the subscriber (and one that drops
    its connection every few events and resumes) holds the view and the model, and the
    step's changes carry its cause."""
    strata = module_strata
    shop = Shop(strata)
    shop.post([("a", 1, 60), ("b", 2, 4 * 3600)], f"{shop.ev}-first")
    follower = Subscriber(served, shop.agg)
    dropping = Subscriber(served, shop.agg, drop_every=(1, 3), seed=seed)
    reducer = Reducer(strata.service.engine, strata.service.plans, min_rows=0, max_groups=100)
    try:
        settle(strata, shop, follower)
        # Its snapshot whole (one it dropped half-way is taken again, at a later position
        # once changes come): from here on it owes every change, as the follower does.
        dropping.wait_for(0)
        for i, step in enumerate(steps):
            seen = len(follower.changes)
            if step == "reduce":
                reducer.run_once()
            elif isinstance(step, list):
                shop.post(step, f"{shop.ev}-{i}")
            elif step[0] == "upsert":
                shop.upsert(step[1], step[2])
            elif step[0] == "delete":
                shop.delete(step[1])
            else:
                shop.truncate()
            settle(strata, shop, follower)
            made = follower.changes[seen:]
            if step == "reduce":
                assert not made, made
            elif isinstance(step, list):
                assert causes(made) <= {"run"}, made
                assert all(c["runs"] == [f"{shop.ev}-{i}"] for c in made), made
            else:
                assert causes(made) <= {"table"}, made
                assert not any(c["late"] or c["runs"] for c in made), made
        position = latest(strata.database_url, shop.agg)
        assert [c["position"] for c in follower.changes] == list(range(1, position + 1))
        dropping.wait_for(position)
        assert [c["position"] for c in dropping.changes] == list(range(1, position + 1))
        assert dropping.rows == follower.rows
    finally:
        follower.close()
        dropping.close()


def test_a_run_right_after_a_table_change_names_itself_alone(
    module_strata: Strata, served: str
) -> None:
    """A run committed right after a table change, before any subscriber polled: the
    table's changes come first with cause ``table`` (the commit announces them in a
    transaction before its own), then the run's, with cause ``run`` - also in the window
    both changed."""
    strata = module_strata
    shop = Shop(strata)
    shop.post([("a", 1, 60), ("c", 5, 3 * 3600)], "before")
    follower = Subscriber(served, shop.agg)
    try:
        settle(strata, shop, follower)
        seen = len(follower.changes)
        shop.upsert("a", "o3")  # a's window moves from o1's row to o3's
        shop.post([("a", 2, 90)], "right-after")  # and gains a row there
        settle(strata, shop, follower)
        made = [(c["cause"], c["op"], c["key"]["owner"]) for c in follower.changes[seen:]]
        assert made == [
            ("table", "delete", "o1"),
            ("table", "insert", "o3"),
            ("run", "update", "o3"),
        ], made
        assert follower.changes[-1]["new"]["n"] == 2 and follower.changes[-1]["old"]["n"] == 1
    finally:
        follower.close()


def test_a_table_change_reaches_an_idle_subscriber_promptly(
    module_strata: Strata, served: str
) -> None:
    """No run comes: a subscriber's own poll announces the table's change."""
    strata = module_strata
    shop = Shop(strata)
    shop.post([("a", 1, 60), ("b", 2, 60)], "only")
    follower = Subscriber(served, shop.agg)
    try:
        position = settle(strata, shop, follower)
        changed = time.monotonic()
        shop.upsert("b", "o1")  # b joins a's owner: two rows become one
        follower.wait_for(position + 1, timeout=10)
        assert time.monotonic() - changed < 5
        settle(strata, shop, follower)
        assert causes(follower.changes) == {"table"}
    finally:
        follower.close()


def test_a_view_joined_on_read_is_refused_by_name(module_strata: Strata, served: str) -> None:
    strata = module_strata
    n = next(NAMES)
    execute(strata, f"CREATE TABLE vbase_{n} (k text PRIMARY KEY, owner text)")
    execute(strata, f"CREATE VIEW vdim_{n} AS SELECT k, owner FROM vbase_{n}")
    strata.create(
        f"CREATE STREAM vev_{n} (k text, v bigint, t timestamptz) WITH (event_time = 't')"
    )
    strata.create(
        f"CREATE STREAM vagg_{n} AS SELECT d.owner, count(*) AS n, window_end AS w "
        f"FROM TUMBLE(vev_{n}, t, INTERVAL '10 minutes') e JOIN vdim_{n} d ON d.k = e.k "
        "GROUP BY d.owner, window_end"
    )
    with httpx.Client(base_url=served, timeout=30) as client:
        refused = client.get(f"/streams/vagg_{n}/changes")
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert f"joins the view 'vdim_{n}'" in error and "no trigger sees" in error, error
