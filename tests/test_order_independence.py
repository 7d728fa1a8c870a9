"""Invariant 1, property-based: for any split of the same rows into runs, any arrival order and
any lateness, every derived view equals a plain PostgreSQL GROUP BY over the raw archive:
tumbling and sliding windows, HAVING, a roll-up and a serial stream (gather point).

Hypothesis draws events spread over several days, splits them into runs, shuffles the runs
(so whole runs arrive days late), encodes each run as CSV or NDJSON, and creates some
derived streams before the first run and others part-way (back-fill over history).
"""

from __future__ import annotations

import csv
import io
import itertools
import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import TypeVar

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import Strata, examples
from tests.oracle import late, late_runs, with_a_late_run

T = TypeVar("T")

EPOCH = datetime(2024, 3, 1, tzinfo=UTC)
_names = itertools.count()

# Each derived stream with its oracle: the same query, written as a plain PostgreSQL
# GROUP BY over the raw view (windows computed here with independent epoch arithmetic).
DERIVED = {
    "per_minute": (
        "CREATE STREAM {name} AS SELECT campaign, count(*) AS n, count(user_id) AS users, "
        "sum(price) AS revenue, min(price) AS lo, max(price) AS hi, avg(price) AS mean, "
        "sum(user_id) AS id_sum, avg(user_id) AS id_mean, max(t) AS last_seen, "
        "window_end AS t FROM TUMBLE({raw}, t, INTERVAL '1 minute') "
        "GROUP BY campaign, window_end",
        "SELECT campaign, count(*), count(user_id), sum(price), min(price), max(price), "
        "avg(price), sum(user_id), avg(user_id), max(t), {window} + interval '1 minute' "
        "FROM {raw} GROUP BY campaign, {window}",
        60,
    ),
    "hourly_buckets": (
        "CREATE STREAM {name} AS SELECT user_id % 3 AS bucket, user_id / 1000 AS thousand, "
        "window_start, sum(price * 2) AS doubled, count(*) AS n, sum(price) / count(*) AS per "
        "FROM TUMBLE({raw}, t, INTERVAL '1 hour') WHERE price > 1 OR campaign = 'c0' "
        "GROUP BY user_id % 3, user_id / 1000, window_start HAVING count(*) > 1",
        "SELECT user_id % 3, user_id / 1000, {window}, sum(price * 2), count(*), "
        "sum(price) / count(*) FROM {raw} WHERE price > 1 OR campaign = 'c0' "
        "GROUP BY user_id % 3, user_id / 1000, {window} HAVING count(*) > 1",
        3600,
    ),
    "sliding": (
        "CREATE STREAM {name} AS SELECT campaign, count(*) AS n, sum(price) AS revenue, "
        "window_start FROM HOP({raw}, t, INTERVAL '1 hour', INTERVAL '3 hours') "
        "GROUP BY campaign, window_start",
        "SELECT campaign, count(*), sum(price), w FROM {raw} CROSS JOIN LATERAL "
        "generate_series({window} - interval '2 hours', {window}, interval '1 hour') AS w "
        "GROUP BY campaign, w",
        3600,
    ),
    "daily_text": (
        "CREATE STREAM {name} AS SELECT min(campaign) AS first, max(campaign) AS last, "
        "count(campaign) AS named, window_end FROM TUMBLE({raw}, t, INTERVAL '1 day') "
        "GROUP BY window_end",
        "SELECT min(campaign), max(campaign), count(campaign), {window} + interval '1 day' "
        "FROM {raw} GROUP BY {window}",
        86400,
    ),
}

# Streams over the streams above, created right after their source: a roll-up that stays
# parallel, and a gather point (max over count) that is serial.
OVER = {
    "per_minute": {
        "per_hour": (
            "CREATE STREAM {name} AS SELECT campaign, sum(n) AS n, avg(mean) AS mean, "
            "max(hi) AS hi, window_start FROM TUMBLE({source}, t, INTERVAL '1 hour') "
            "GROUP BY campaign, window_start",
            "SELECT campaign, count(*)::numeric, avg(price), max(price), {window} "
            "FROM {raw} GROUP BY campaign, {window}",
            3600,
        ),
        "busiest": (
            "CREATE STREAM {name} AS SELECT max(n) AS top, window_end AS t "
            "FROM TUMBLE({source}, t, INTERVAL '1 minute') GROUP BY window_end",
            "SELECT max(n), w + interval '1 minute' FROM (SELECT count(*) AS n, {window} AS w "
            "FROM {raw} GROUP BY campaign, {window}) c GROUP BY w",
            60,
        ),
    },
}

events = st.lists(
    st.fixed_dictionaries(
        {
            "campaign": st.one_of(st.none(), st.sampled_from(["c0", "c1", "c2", "Zed", "ä"])),
            "user_id": st.one_of(st.none(), st.integers(-5000, 5000)),
            "price": st.one_of(
                st.none(),
                st.decimals(min_value=-1000, max_value=1000, places=4, allow_nan=False),
            ),
            # Up to four days: runs holding old events arrive "days late".
            "t": st.integers(0, 4 * 86400 * 1_000_000 - 1).map(
                lambda us: EPOCH + timedelta(microseconds=us)
            ),
        }
    ),
    min_size=2,
    max_size=120,
).filter(lambda rows: len({row["t"] for row in rows}) > 1)  # one late run needs two times


def _ndjson(rows: list[dict]) -> str:
    out = []
    for row in rows:
        item = {k: v for k, v in row.items() if v is not None}
        if "price" in item:
            item["price"] = str(item["price"])
        item["t"] = row["t"].isoformat()
        out.append(json.dumps(item))
    return "\n".join(out) + "\n"


def _csv(rows: list[dict]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["campaign", "user_id", "price", "t"])
    for row in rows:
        writer.writerow(
            ["" if row[k] is None else row[k] for k in ("campaign", "user_id", "price")]
            + [row["t"].isoformat()]
        )
    return buffer.getvalue()


def _window(seconds: int) -> str:
    # Independent of Strata's own function: floor of epoch seconds, in exact numeric.
    return f"to_timestamp(floor(extract(epoch FROM t) / {seconds}) * {seconds})"


def _normalise(rows: list[tuple]) -> list[tuple]:
    def value(v: object) -> object:
        return v.normalize() if isinstance(v, Decimal) else v

    return sorted((tuple(value(v) for v in row) for row in rows), key=repr)


@settings(
    max_examples=examples(12),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(rows=events, data=st.data())
def test_views_equal_batch_group_by(module_strata: Strata, rows: list[dict], data) -> None:
    strata = module_strata
    suffix = next(_names)
    raw = f"ev_{suffix}"
    strata.create(
        f"CREATE STREAM {raw} (campaign text, user_id bigint, price numeric(12,4), "
        "t timestamptz) WITH (event_time = 't')"
    )
    # Split into runs at random cut points (one at least), then deliver the runs in random
    # order, one at least behind a later event time an earlier run held.
    cuts = sorted(data.draw(st.sets(st.integers(1, len(rows) - 1), min_size=1, max_size=5)))
    runs = [rows[a:b] for a, b in itertools.pairwise([0, *cuts, len(rows)])]
    order = data.draw(st.permutations(runs))
    arrivals = with_a_late_run(order, lambda row: row["t"])
    late_streams = data.draw(st.sets(st.sampled_from(sorted(DERIVED))))
    create_at = data.draw(st.integers(0, len(runs)))

    def create(kind: str) -> None:
        strata.create(DERIVED[kind][0].format(name=f"{kind}_{suffix}", raw=raw))
        for over, (ddl, _oracle, _seconds) in OVER.get(kind, {}).items():
            strata.create(ddl.format(name=f"{over}_{suffix}", source=f"{kind}_{suffix}"))

    for kind in sorted(set(DERIVED) - late_streams):
        create(kind)
    for position, run in enumerate(arrivals):
        if position == create_at:
            for kind in sorted(late_streams):
                create(kind)
        use_csv = data.draw(st.booleans())
        strata.ingest(raw, _csv(run) if use_csv else _ndjson(run), csv=use_csv)
    if create_at >= len(runs):
        for kind in sorted(late_streams):
            create(kind)

    assert strata.query(f"SELECT count(*) FROM {raw}") == [(len(rows),)]
    checks = list(DERIVED.items()) + [i for over in OVER.values() for i in over.items()]
    compared = {}
    for kind, (_ddl, oracle, seconds) in checks:
        view = strata.query(f"SELECT * FROM {kind}_{suffix}")
        expected = strata.query(oracle.format(raw=raw, window=_window(seconds)))
        assert _normalise(view) == _normalise(expected), kind
        compared[kind] = len(expected)
    # The example proved something: rows to compare, and a run that came late.
    assert compared["per_minute"] > 0 and compared["daily_text"] > 0, compared
    assert late(arrivals, lambda row: row["t"]) and late_runs(strata, raw) > 0
