"""An aggregate joined with a table on read keeps its view's rows of reduced windows joined
(rewriter/build_joined.py), and reads them like a plain table while the table is unchanged:
every read still equals the same query run as a batch over all rows received and the table
as it is now (real PostgreSQL, real Spark).

The oracle is the stream's query run by PostgreSQL over the raw view and the table, in the
same snapshot as the view (tests/test_table_joins.py's spend_oracle); the table's rows are
changed by the test with plain SQL. Each state of the joined rows is reached and checked:
current with nothing waiting, current with late windows waiting for the reducer, stale
after a table change (joined on read until the reducer's next pass writes them anew), and
after migrating down to the release before them and up again.
"""

from __future__ import annotations

import random

import psycopg
import pytest

from rewriter import naming
from rewriter.plan import ParallelAggregatePlan
from server.catalog import migrate
from server.security import READER_ROLE
from server.workers.reducer import Reducer
from tests.conftest import Strata
from tests.oracle import SnapshotReader, execute, same
from tests.test_table_joins import SPEND, Shop, spend_oracle
from tests.test_upgrade import downgrade_to

_SPEND_COLUMNS = "owner, revenue, n, t"


def _spend(strata: Strata, shop: Shop, name: str) -> ParallelAggregatePlan:
    strata.create(SPEND.format(name=name, imp=shop.imp, campaigns=shop.campaigns))
    plan = strata.service.stream(name).plan
    assert isinstance(plan, ParallelAggregatePlan) and plan.joined is not None
    return plan


def _current(strata: Strata, plan: ParallelAggregatePlan) -> bool:
    assert plan.joined is not None
    return bool(strata.query(plan.joined.current_query)[0][0])


def _joined(plan: ParallelAggregatePlan) -> str:
    """The joined rows as they are kept, in the view's columns."""
    return f"SELECT {_SPEND_COLUMNS} FROM {naming.INTERNAL_SCHEMA}.{naming.joined_table(plan.name)}"


def _waiting(strata: Strata, plan: ParallelAggregatePlan) -> int:
    table = f"{naming.INTERNAL_SCHEMA}.{naming.partial_archive_table(plan.name)}"
    return int(strata.query(f"SELECT count(*) FROM {table}")[0][0])


def test_the_view_reads_the_joined_rows_and_follows_every_table_change(
    module_strata: Strata,
) -> None:
    strata = module_strata
    shop = Shop(strata, random.Random(21))
    plan = _spend(strata, shop, "joined_spend")
    view = f"SELECT {_SPEND_COLUMNS} FROM {plan.name}"
    reducer = Reducer(strata.service.engine, strata.service.plans, min_rows=0)
    for late in (0, 5, 48, 1):
        strata.ingest(shop.imp, shop.run(150, hours_late=late))
    assert not _current(strata, plan)  # never written: joined on read
    assert same(strata, view, spend_oracle(shop)) > 5
    reducer.run_once()
    assert _current(strata, plan) and _waiting(strata, plan) == 0
    assert same(strata, view, spend_oracle(shop)) > 5
    assert same(strata, view, _joined(plan)) > 5  # every row kept joined

    # As dashboards read it: the role strata_reader reads the view, the check included.
    with psycopg.connect(strata.database_url, autocommit=True) as reader:
        reader.execute(f"SET ROLE {READER_ROLE}")
        got = sorted(reader.execute(view).fetchall())  # type: ignore[arg-type]
    assert got == sorted(strata.query(spend_oracle(shop)))

    # The view reads them: a kept row changed by hand shows in it (and is put back).
    kept = f"{naming.INTERNAL_SCHEMA}.{naming.joined_table(plan.name)}"
    execute(strata, f"UPDATE {kept} SET n = n + 1000")
    with pytest.raises(AssertionError):
        same(strata, view, spend_oracle(shop))
    execute(strata, f"UPDATE {kept} SET n = n - 1000")

    # A table change: joined on read from its commit on, written anew by the next pass.
    shop.upsert("c1", "o9")
    shop.upsert("c5", "o5")
    shop.delete("c0")
    assert not _current(strata, plan)
    same(strata, view, spend_oracle(shop))
    reducer.run_once()
    assert _current(strata, plan)
    same(strata, view, spend_oracle(shop))
    same(strata, view, _joined(plan))

    # Late runs into windows kept joined: those windows joined on read while they wait,
    # folded and kept joined by the fold's own statement (no rewrite of every row).
    for late in (5, 48):
        strata.ingest(shop.imp, shop.run(100, hours_late=late))
    assert _waiting(strata, plan) > 0 and _current(strata, plan)
    same(strata, view, spend_oracle(shop))
    reducer.run_once()
    assert _waiting(strata, plan) == 0 and _current(strata, plan)
    same(strata, view, spend_oracle(shop))
    same(strata, view, _joined(plan))

    # A late run and a table change both before the pass; then a truncated table.
    strata.ingest(shop.imp, shop.run(80, hours_late=1))
    shop.upsert("c2", "o1")
    assert _waiting(strata, plan) > 0 and not _current(strata, plan)
    same(strata, view, spend_oracle(shop))
    reducer.run_once()
    same(strata, view, spend_oracle(shop))
    same(strata, view, _joined(plan))
    execute(strata, f"TRUNCATE {shop.campaigns}")
    shop.owners.clear()
    assert not _current(strata, plan)
    assert same(strata, view, spend_oracle(shop)) == 0
    reducer.run_once()
    assert _current(strata, plan) and same(strata, view, spend_oracle(shop)) == 0


def test_changes_the_trigger_cannot_count_leave_the_view_joined_on_read(
    module_strata: Strata,
) -> None:
    """The joined rows are read only while the trigger counting the table's changes is on
    it and enabled: fired ALWAYS, it counts a replica session's changes (a logical
    replication subscription's apply); disabled or dropped, the view joins on read."""
    strata = module_strata
    shop = Shop(strata, random.Random(89))
    plan = _spend(strata, shop, "joined_trigger")
    view = f"SELECT {_SPEND_COLUMNS} FROM {plan.name}"
    for late in (0, 3, 1):
        strata.ingest(shop.imp, shop.run(100, hours_late=late))
    Reducer(strata.service.engine, strata.service.plans, min_rows=0).run_once()
    assert _current(strata, plan)
    trigger = naming.FEED_TABLE_TRIGGER
    enabled = f"SELECT tgenabled FROM pg_trigger WHERE tgrelid = '{shop.campaigns}'::regclass"
    assert strata.query(enabled) == [("A",)]

    with psycopg.connect(strata.database_url, autocommit=True) as replica:
        replica.execute("SET session_replication_role = replica")
        replica.execute(f"UPDATE {shop.campaigns} SET owner = 'o7' WHERE campaign = 'c2'")
    shop.owners["c2"] = "o7"
    assert not _current(strata, plan)
    same(strata, view, spend_oracle(shop))

    reducer = Reducer(strata.service.engine, strata.service.plans, min_rows=0)
    reducer.run_once()
    assert _current(strata, plan)
    execute(strata, f"ALTER TABLE {shop.campaigns} DISABLE TRIGGER {trigger}")
    assert not _current(strata, plan)
    shop.upsert("c1", "o6")  # not counted
    same(strata, view, spend_oracle(shop))
    reducer.run_once()  # left as the user made it: joined on read
    assert not _current(strata, plan) and strata.query(enabled) == [("D",)]
    same(strata, view, spend_oracle(shop))

    execute(strata, f"DROP TRIGGER {trigger} ON {shop.campaigns}")
    shop.upsert("c3", "o5")
    same(strata, view, spend_oracle(shop))
    Reducer(strata.service.engine, strata.service.plans, min_rows=0).run_once()  # a restart
    assert _current(strata, plan) and strata.query(enabled) == [("A",)]
    same(strata, view, spend_oracle(shop))
    same(strata, view, _joined(plan))


def test_a_reader_sees_every_snapshot_exact_while_runs_folds_and_table_changes_interleave(
    strata: Strata,
) -> None:
    """A reader in REPEATABLE READ snapshots while late and on-time runs commit, the table
    changes, and a reducer folds and writes the joined rows anew on a short interval: every
    snapshot equals the batch query, in every state of the joined rows, each seen."""
    shop = Shop(strata, random.Random(34))
    plan = _spend(strata, shop, "joined_reader")
    assert plan.joined is not None
    view = f"SELECT {_SPEND_COLUMNS} FROM {plan.name}"
    partials = f"{naming.INTERNAL_SCHEMA}.{naming.partial_archive_table(plan.name)}"
    states: set[tuple[bool, bool]] = set()  # (current, late rows waiting) per snapshot
    current_query = plan.joined.current_query

    def check(connection: psycopg.Connection) -> None:
        row = connection.execute(current_query).fetchone()  # type: ignore[arg-type]
        waiting = connection.execute(f"SELECT EXISTS (SELECT FROM {partials})").fetchone()  # type: ignore[arg-type]
        assert row is not None and waiting is not None
        states.add((bool(row[0]), bool(waiting[0])))
        got = sorted(map(repr, connection.execute(view).fetchall()))  # type: ignore[arg-type]
        want = sorted(map(repr, connection.execute(spend_oracle(shop)).fetchall()))  # type: ignore[arg-type]
        assert got == want, f"{view}: {len(got)} rows, the batch query {len(want)}"

    reducer = Reducer(strata.service.engine, strata.service.plans, min_rows=0, interval=0.05)
    reducer.start()
    try:
        with SnapshotReader(strata.database_url, check, min_snapshots=20) as reader:
            for i in range(24):
                run = shop.run(40, hours_late=shop.rng.choice([0, 0, 3, 30]))
                strata.ingest(shop.imp, run)
                if i % 3 == 1:
                    shop.upsert(f"c{shop.rng.randrange(7)}", f"o{shop.rng.randrange(4)}")
                if i % 8 == 5:
                    shop.delete(f"c{shop.rng.randrange(7)}")
    finally:
        reducer.stop()
    assert reader.snapshots >= 20
    # Joined rows read while current, joined on read after a change; late rows waiting.
    assert (True, False) in states and any(not current for current, _ in states), states
    assert any(waiting for _, waiting in states), states
    Reducer(strata.service.engine, strata.service.plans, min_rows=0).run_once()
    assert _current(strata, plan)
    same(strata, view, spend_oracle(shop))
    same(strata, view, _joined(plan))


def test_the_upgrade_keeps_joined_views_exact(strata: Strata) -> None:
    """0029 gives each aggregate joined with tables its joined rows, written by the next
    pass; its downgrade puts back the view joining every window on read and drops them.
    Exact throughout, with windows reduced, waiting, and a table changed in between."""
    shop = Shop(strata, random.Random(55))
    plan = _spend(strata, shop, "joined_upgrade")
    view = f"SELECT {_SPEND_COLUMNS} FROM {plan.name}"
    reducer = Reducer(strata.service.engine, strata.service.plans, min_rows=0)
    for late in (0, 6, 30):
        strata.ingest(shop.imp, shop.run(120, hours_late=late))
    reducer.run_once()
    strata.ingest(shop.imp, shop.run(60, hours_late=6))  # waiting for the reducer
    assert _current(strata, plan) and _waiting(strata, plan) > 0
    same(strata, view, spend_oracle(shop))

    def made() -> list[bool]:
        """The joined table, the seen table and the check function exist."""
        internal = naming.INTERNAL_SCHEMA
        return [
            strata.query(f"SELECT {probe}(%s) IS NOT NULL", f"{internal}.{name}")[0][0]
            for probe, name in (
                ("to_regclass", naming.joined_table(plan.name)),
                ("to_regclass", naming.joined_seen_table(plan.name)),
                ("to_regprocedure", f"{naming.joined_current_function(plan.name)}()"),
            )
        ]

    def reads_joined_rows() -> bool:
        definition = strata.query("SELECT pg_get_viewdef(%s::regclass)", plan.name)[0][0]
        return naming.joined_table(plan.name) in definition

    assert reads_joined_rows()
    downgrade_to(strata.service.engine, "0028")
    assert made() == [False, False, False] and not reads_joined_rows()
    same(strata, view, spend_oracle(shop))
    shop.upsert("c3", "o8")  # the previous release joins on read: nothing to follow
    same(strata, view, spend_oracle(shop))

    migrate(strata.service.engine)
    assert made() == [True, True, True] and reads_joined_rows() and not _current(strata, plan)
    same(strata, view, spend_oracle(shop))
    reducer.run_once()
    assert _current(strata, plan) and _waiting(strata, plan) == 0
    same(strata, view, spend_oracle(shop))
    same(strata, view, _joined(plan))
    strata.ingest(shop.imp, shop.run(60, hours_late=40))
    shop.upsert("c4", "o1")
    same(strata, view, spend_oracle(shop))
