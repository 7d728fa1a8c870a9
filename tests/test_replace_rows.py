"""A cluster node puts the rows the cluster chose for a run in conflict in place of its own
(server/replication/replace.py), in one transaction with everything computed from them:
tried here on one in-process Strata, with a reader comparing every view with its batch
query in one snapshot after another while the replacement happens, so that no reader
ever sees the new rows with the old aggregates or joins, or the reverse."""

from __future__ import annotations

import itertools
import json
import random
from datetime import UTC, datetime, timedelta

import psycopg
import pyarrow as pa
import pytest

from server.feed import open_feed
from server.replication.digest import digest
from server.replication.replace import Unreplaceable, replace_rows
from tests.conftest import Strata
from tests.oracle import SnapshotReader, canonical, ndjson

_names = itertools.count()
START = datetime(2024, 9, 1, tzinfo=UTC)


def rows(
    rng: random.Random, count: int, hours: int = 2, start: datetime = START
) -> list[dict[str, object]]:
    return [
        {
            "k": rng.randrange(6),
            "v": rng.randrange(1000),
            "t": (start + timedelta(seconds=rng.randrange(hours * 3600))).isoformat(),
        }
        for _ in range(count)
    ]


def arrow(values: list[dict[str, object]]) -> pa.Table:
    return pa.table(
        {
            "k": pa.array([r["k"] for r in values], pa.int32()),
            "v": pa.array([r["v"] for r in values], pa.int64()),
            "t": pa.array(
                [datetime.fromisoformat(str(r["t"])) for r in values], pa.timestamp("us", tz="UTC")
            ),
        }
    )


def replace(strata: Strata, run_id: str, body: pa.Table) -> bool:
    service = strata.service
    return replace_rows(
        service.engine, service.plans, service.pipeline.backend, run_id, body, digest(body)
    )


def test_a_runs_rows_are_replaced_with_everything_computed_from_them(
    module_strata: Strata,
) -> None:
    strata = module_strata
    n = next(_names)
    ev, other = f"ev_{n}", f"other_{n}"
    for name in (ev, other):
        strata.create(
            f"CREATE STREAM {name} (k integer, v bigint, t timestamptz) WITH (event_time = 't')"
        )
    statements = {
        f"per_min_{n}": f"SELECT k, count(*) AS n, sum(v) AS s, max(v) AS top, window_start "
        f"FROM TUMBLE({ev}, t, INTERVAL '1 minute') GROUP BY k, window_start",
        f"per_hour_{n}": f"SELECT k, sum(n) AS n, window_start FROM TUMBLE(per_min_{n}, "
        f"window_start, INTERVAL '1 hour') GROUP BY k, window_start",
        f"pairs_{n}": f"SELECT e.k, e.v, o.v AS w, e.t FROM {ev} e JOIN {other} o ON e.k = o.k",
        f"pair_counts_{n}": f"SELECT k, count(*) AS n, sum(w) AS w, window_start "
        f"FROM TUMBLE(pairs_{n}, t, INTERVAL '10 minutes') GROUP BY k, window_start",
        f"top_{n}": f"SELECT max(n) AS top, window_start FROM TUMBLE(per_min_{n}, window_start, "
        f"INTERVAL '30 minutes') GROUP BY window_start",
        f"totals_{n}": f"SELECT k, count(*) AS n, sum(v) AS s FROM {ev} GROUP BY k",
    }
    for name, select in statements.items():
        strata.create(f"CREATE STREAM {name} AS {select}")
    minute = "date_bin('1 minute', t, timestamptz 'epoch')"
    pairs = {
        f"SELECT k, n, s, top, window_start FROM per_min_{n}": (
            f"SELECT k, count(*), sum(v), max(v), {minute} FROM {ev} GROUP BY k, 5"
        ),
        f"SELECT k, n, window_start FROM per_hour_{n}": (
            f"SELECT k, count(*), date_bin('1 hour', t, timestamptz 'epoch') FROM {ev} "
            "GROUP BY k, 3"
        ),
        f"SELECT k, v, w, t FROM pairs_{n}": (
            f"SELECT e.k, e.v, o.v, e.t FROM {ev} e JOIN {other} o ON e.k = o.k"
        ),
        f"SELECT k, n, w, window_start FROM pair_counts_{n}": (
            f"SELECT e.k, count(*), sum(o.v), date_bin('10 minutes', e.t, timestamptz 'epoch') "
            f"FROM {ev} e JOIN {other} o ON e.k = o.k GROUP BY 1, 4"
        ),
        f"SELECT k, n, s FROM totals_{n}": f"SELECT k, count(*), sum(v) FROM {ev} GROUP BY k",
    }
    rng = random.Random(n)
    strata.ingest(other, ndjson(rows(rng, 20)), run_id=f"o-{n}")
    for i in range(4):
        strata.ingest(ev, ndjson(rows(rng, 40)), run_id=f"e{i}-{n}")
    target = f"target-{n}"
    strata.ingest(ev, ndjson(rows(rng, 30)), run_id=target)
    strata.ingest(ev, ndjson(rows(rng, 40, hours=1)), run_id=f"late-{n}")
    chosen = rows(rng, 25, hours=3)  # other rows, other windows, another count
    service = strata.service
    follower, current = open_feed(
        service.engine, service.plans, f"per_min_{n}", since=None, snapshot=True
    )
    applied = {json.dumps(json.loads(c.data)["key"], sort_keys=True): c for c in current}
    with SnapshotReader.of(strata.database_url, pairs, min_snapshots=3):
        assert replace(strata, target, arrow(chosen))
        strata.ingest(ev, ndjson(rows(rng, 40)), run_id=f"after-{n}")
    with psycopg.connect(strata.database_url) as connection:
        held = connection.execute(
            f"SELECT k, v, t FROM strata_internal.{ev}__raw WHERE strata_run = "
            "(SELECT seq FROM strata_catalog.runs WHERE run_id = %s)",
            [target],
        ).fetchall()
        assert canonical(held) == canonical(
            [(r["k"], r["v"], datetime.fromisoformat(str(r["t"]))) for r in chosen]
        )
        digest_held, count = connection.execute(
            "SELECT digest, rows FROM strata_catalog.runs WHERE run_id = %s", [target]
        ).fetchone()
        assert digest_held == digest(arrow(chosen)) and count == len(chosen)
        for view, oracle in pairs.items():
            got = canonical(connection.execute(view).fetchall())  # type: ignore[arg-type]
            assert got and got == canonical(connection.execute(oracle).fetchall()), view  # type: ignore[arg-type]
    # The change feed of the followed stream has the replacement's changes, cause replace,
    # and applied to the view as it was, they give the view as it is.
    state = {key: json.loads(c.data)["new"] for key, c in applied.items()}
    causes = set()
    for change in follower.poll():
        data = json.loads(change.data)
        causes.add(data["cause"])
        key = json.dumps(data["key"], sort_keys=True)
        if data["op"] == "delete":
            state.pop(key)
        else:
            state[key] = data["new"]
    assert "replace" in causes, causes
    view = strata.query(f"SELECT k, n, s, top FROM per_min_{n}")
    shown = [(r["k"], r["n"], r["s"], r["top"]) for r in state.values()]
    assert canonical([tuple(int(v) for v in row) for row in shown]) == canonical(
        [tuple(int(v) for v in row) for row in view]
    )
    # Done once: the same choice again changes nothing.
    assert replace(strata, target, arrow(chosen))


def test_a_stream_with_a_retention_is_not_replaced(module_strata: Strata) -> None:
    """Its archive may no longer hold the history its streams would be computed from: the
    replacement is refused, and nothing changes."""
    strata = module_strata
    n = next(_names)
    ev = f"kept_{n}"
    strata.create(
        f"CREATE STREAM {ev} (k integer, v bigint, t timestamptz) "
        "WITH (event_time = 't', retention = '30 days')"
    )
    recent = datetime.now(UTC) - timedelta(hours=3)  # well within the retention
    strata.ingest(ev, ndjson(rows(random.Random(1), 10, start=recent)), run_id=f"kept-{n}")
    with pytest.raises(Unreplaceable, match="retention"):
        replace(strata, f"kept-{n}", arrow(rows(random.Random(2), 5, start=recent)))
    assert strata.query(f"SELECT count(*) FROM {ev}") == [(10,)]
