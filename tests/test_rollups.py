"""Derived streams over derived streams, HOP windows and gather points (seeds/003's impsn
family), each view compared with a plain PostgreSQL query over the raw archive."""

from __future__ import annotations

import itertools
import json
import random
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import Strata, examples
from tests.oracle import late, late_runs, with_a_late_run

START = datetime(2024, 5, 1, tzinfo=UTC)
IMPSNS = (
    "CREATE STREAM {raw} (campaign text, user_id bigint, price numeric(12,4), t timestamptz) "
    "WITH (event_time = 't')"
)


def _minute(seconds: int) -> str:
    return f"to_timestamp(floor(extract(epoch FROM t) / {seconds}) * {seconds})"


def _rows(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        # The last sub-window of every 5 minutes is well represented (00:04:xx).
        seconds = rng.choice(
            [rng.randrange(0, 3600), rng.randrange(0, 12) * 300 + 240 + rng.randrange(60)]
        )
        rows.append(
            {
                "campaign": rng.choice(["c1", "c2", "c3", None]),
                "user_id": rng.randrange(100),
                "price": str(Decimal(rng.randrange(1, 100000)) / 10000),
                "t": (
                    START + timedelta(seconds=seconds, microseconds=rng.randrange(10**6))
                ).isoformat(),
            }
        )
    return rows


def _ingest_shuffled(strata: Strata, raw: str, rows: list[dict], runs: int, seed: int) -> None:
    rng = random.Random(seed)
    chunks = [rows[i::runs] for i in range(runs)]
    rng.shuffle(chunks)
    for chunk in chunks:
        body = "".join(
            json.dumps({k: v for k, v in r.items() if v is not None}) + "\n" for r in chunk
        )
        strata.ingest(raw, body)


def _same(strata: Strata, view: str, oracle: str) -> None:
    def norm(rows: list[tuple]) -> list[tuple]:
        return sorted(
            (tuple(v.normalize() if isinstance(v, Decimal) else v for v in row) for row in rows),
            key=repr,
        )

    got = norm(strata.query(view))
    expected = norm(strata.query(oracle))
    assert got == expected, f"{view}\n  got      {got[:5]}\n  expected {expected[:5]}"
    assert got, f"{view} is empty: the test would prove nothing"


def test_the_impsn_family(strata: Strata) -> None:
    strata.create(IMPSNS.format(raw="impsns"))
    streams = {
        "impsn_count": "SELECT campaign, count(*) AS c, window_end AS t "
        "FROM TUMBLE(impsns, t, INTERVAL '1 minute') GROUP BY campaign, window_end",
        "impsn_sum": "SELECT sum(c) AS total, window_end AS t "
        "FROM TUMBLE(impsn_count, t, INTERVAL '1 minute') GROUP BY window_end",
        "impsn_max": "SELECT max(c) AS top, window_end AS t "
        "FROM TUMBLE(impsn_count, t, INTERVAL '1 minute') GROUP BY window_end",
        "impsn_thresh": "SELECT campaign, count(*) AS c, window_end AS t "
        "FROM TUMBLE(impsns, t, INTERVAL '5 minutes') GROUP BY campaign, window_end "
        "HAVING count(*) > 50",
        "impsn_count5min": "SELECT campaign, sum(c) AS c, window_end AS t "
        "FROM TUMBLE(impsn_count, t, INTERVAL '5 minutes') GROUP BY campaign, window_end",
        "impsn_avg": "SELECT campaign, avg(price) AS a, window_end AS t "
        "FROM TUMBLE(impsns, t, INTERVAL '1 minute') GROUP BY campaign, window_end",
        "impsn_avg5min": "SELECT campaign, avg(a) AS a, window_end AS t "
        "FROM TUMBLE(impsn_avg, t, INTERVAL '5 minutes') GROUP BY campaign, window_end",
        "impsn_count15": "SELECT campaign, sum(c) AS c, window_end AS t "
        "FROM TUMBLE(impsn_count5min, t, INTERVAL '15 minutes') GROUP BY campaign, window_end",
    }
    rows = _rows(3000, seed=7)
    # Half the data arrives before the roll-ups exist (back-fill), half after, shuffled.
    _ingest_shuffled(strata, "impsns", rows[:1500], runs=4, seed=1)
    kinds = {}
    for name, query in streams.items():
        kinds[name] = strata.create(f"CREATE STREAM {name} AS {query}")
    _ingest_shuffled(strata, "impsns", rows[1500:], runs=5, seed=2)

    assert kinds["impsn_sum"]["parallelism"] == "PP"
    assert kinds["impsn_count5min"]["parallelism"] == "PP"
    assert kinds["impsn_avg5min"]["parallelism"] == "PP"
    assert kinds["impsn_count15"]["parallelism"] == "PP"
    assert kinds["impsn_thresh"]["parallelism"] == "PP"
    assert kinds["impsn_max"]["parallelism"] == "SP"
    assert "max" in kinds["impsn_max"]["parallelism_reason"]
    assert "gather point" in kinds["impsn_max"]["parallelism_reason"]
    assert "strata_partials_impsn_count" in kinds["impsn_sum"]["rewrite"]["partial_query"]

    m1, m5, m15 = _minute(60), _minute(300), _minute(900)
    _same(
        strata,
        "SELECT * FROM impsn_count",
        f"SELECT campaign, count(*), {m1} + interval '1 minute' FROM impsns GROUP BY 1, {m1}",
    )
    _same(
        strata,
        "SELECT * FROM impsn_sum",
        f"SELECT count(*)::numeric, {m1} + interval '1 minute' FROM impsns GROUP BY {m1}",
    )
    _same(
        strata,
        "SELECT * FROM impsn_max",
        f"SELECT max(c), w + interval '1 minute' FROM (SELECT count(*) AS c, {m1} AS w "
        f"FROM impsns GROUP BY campaign, {m1}) per_campaign GROUP BY w",
    )
    _same(
        strata,
        "SELECT * FROM impsn_thresh",
        f"SELECT campaign, count(*), {m5} + interval '5 minutes' FROM impsns "
        f"GROUP BY 1, {m5} HAVING count(*) > 50",
    )
    _same(
        strata,
        "SELECT * FROM impsn_count5min",
        f"SELECT campaign, count(*)::numeric, {m5} + interval '5 minutes' FROM impsns "
        f"GROUP BY 1, {m5}",
    )
    # AVG over AVG is the average of the underlying rows, never an average of averages.
    _same(
        strata,
        "SELECT * FROM impsn_avg5min",
        f"SELECT campaign, avg(price), {m5} + interval '5 minutes' FROM impsns GROUP BY 1, {m5}",
    )
    _same(
        strata,
        "SELECT * FROM impsn_count15",
        f"SELECT campaign, count(*)::numeric, {m15} + interval '15 minutes' FROM impsns "
        f"GROUP BY 1, {m15}",
    )
    # Types are PostgreSQL's for the same query over the lower view (sum of bigint: numeric).
    types = dict(
        strata.query(
            "SELECT column_name, data_type FROM information_schema.columns "
            "WHERE table_name = 'impsn_count5min'"
        )
    )
    assert types == {"campaign": "text", "c": "numeric", "t": "timestamp with time zone"}


def test_rollup_places_last_sub_window_by_either_time_column(strata: Strata) -> None:
    strata.create(IMPSNS.format(raw="ev"))
    strata.create(
        "CREATE STREAM by_end AS SELECT count(*) AS c, window_end AS t "
        "FROM TUMBLE(ev, t, INTERVAL '1 minute') GROUP BY window_end"
    )
    strata.create(
        "CREATE STREAM by_start AS SELECT count(*) AS c, window_start AS s "
        "FROM TUMBLE(ev, t, INTERVAL '1 minute') GROUP BY window_start"
    )
    for lower, column in (("by_end", "t"), ("by_start", "s")):
        strata.create(
            f"CREATE STREAM {lower}_5 AS SELECT sum(c) AS c, window_start AS w "
            f"FROM TUMBLE({lower}, {column}, INTERVAL '5 minutes') GROUP BY window_start"
        )
    # 00:04:30 lies in [00:04, 00:05), which belongs to [00:00, 00:05), not [00:05, 00:10).
    body = "".join(
        json.dumps({"t": f"2024-05-01T00:{m}Z"}) + "\n"
        for m in ("00:10", "04:30", "04:59", "05:00")
    )
    strata.ingest("ev", body)
    for view in ("by_end_5", "by_start_5"):
        assert strata.query(f"SELECT to_char(w, 'HH24:MI'), c FROM {view} ORDER BY w") == [
            ("00:00", 3),
            ("00:05", 1),
        ]


def test_hop_windows_through_panes(strata: Strata) -> None:
    strata.create(IMPSNS.format(raw="impsns"))
    hop = strata.create(
        "CREATE STREAM sliding AS SELECT campaign, count(*) AS c, sum(price) AS s, "
        "window_start, window_end FROM HOP(impsns, t, INTERVAL '1 minute', INTERVAL '5 minutes') "
        "GROUP BY campaign, window_start, window_end"
    )
    assert hop["parallelism"] == "PP"
    _ingest_shuffled(strata, "impsns", _rows(800, seed=3), runs=4, seed=4)
    _same(
        strata,
        "SELECT * FROM sliding",
        "SELECT campaign, count(*), sum(price), w, w + interval '5 minutes' FROM impsns "
        "CROSS JOIN LATERAL generate_series(date_trunc('minute', t) - interval '4 minutes', "
        "date_trunc('minute', t), interval '1 minute') AS w GROUP BY campaign, w",
    )
    # Partials are kept per 1-minute pane, not per 5-minute window.
    panes = strata.query(
        "SELECT count(DISTINCT window_start) FROM strata_internal.sliding__partial"
    )[0][0]
    assert panes == strata.query("SELECT count(DISTINCT date_trunc('minute', t)) FROM impsns")[0][0]
    bad = strata.client.post(
        "/streams",
        json={
            "sql": "CREATE STREAM odd AS SELECT count(*) AS c, window_end FROM "
            "HOP(impsns, t, INTERVAL '2 minutes', INTERVAL '5 minutes') GROUP BY window_end"
        },
    )
    assert bad.status_code == 400 and "multiple of its slide" in bad.json()["error"]


def test_gather_points_are_serial_views(strata: Strata) -> None:
    strata.create(IMPSNS.format(raw="impsns"))
    strata.create(
        "CREATE STREAM per_campaign AS SELECT campaign, count(*) AS c, sum(price) AS s, "
        "window_end AS t FROM TUMBLE(impsns, t, INTERVAL '1 minute') GROUP BY campaign, window_end"
    )
    serial = {
        # a HAVING on lower final values, arithmetic inside the upper aggregate,
        # a key on an aggregate value, DISTINCT over aggregates
        "busy": "SELECT count(*) AS busy_campaigns, window_end AS t FROM "
        "TUMBLE(per_campaign, t, INTERVAL '1 minute') WHERE c > 2 GROUP BY window_end",
        "scaled": "SELECT sum(s * 2) AS s2, window_end AS t FROM "
        "TUMBLE(per_campaign, t, INTERVAL '5 minutes') GROUP BY window_end",
        "by_count": "SELECT c, count(*) AS campaigns, window_end AS t FROM "
        "TUMBLE(per_campaign, t, INTERVAL '1 minute') GROUP BY c, window_end",
        "distinct_counts": "SELECT DISTINCT count(*) AS n, window_end AS t FROM "
        "TUMBLE(impsns, t, INTERVAL '1 minute') GROUP BY campaign, window_end",
    }
    for name, query in serial.items():
        described = strata.create(f"CREATE STREAM {name} AS {query}")
        assert described["parallelism"] == "SP", name
        assert described["parallelism_reason"].startswith("serial: "), name
    _ingest_shuffled(strata, "impsns", _rows(600, seed=5), runs=3, seed=6)
    m1, m5 = _minute(60), _minute(300)
    per = (
        f"(SELECT campaign, count(*) AS c, sum(price) AS s, {m1} AS w "
        f"FROM impsns GROUP BY 1, {m1}) p"
    )
    _same(
        strata,
        "SELECT * FROM busy",
        f"SELECT count(*), w + interval '1 minute' FROM {per} WHERE c > 2 GROUP BY w",
    )
    _same(
        strata,
        "SELECT * FROM scaled",
        f"SELECT sum(s * 2), {m5.replace('t)', 'w)')} + interval '5 minutes' FROM {per} "
        f"GROUP BY {m5.replace('t)', 'w)')}",
    )
    _same(
        strata,
        "SELECT * FROM by_count",
        f"SELECT c, count(*), w + interval '1 minute' FROM {per} GROUP BY c, w",
    )
    _same(
        strata,
        "SELECT * FROM distinct_counts",
        f"SELECT DISTINCT count(*), {m1} + interval '1 minute' FROM impsns GROUP BY campaign, {m1}",
    )


_chains = itertools.count()


def _time(row: dict) -> datetime:
    return datetime.fromisoformat(row["t"])


@settings(
    max_examples=examples(8),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    seed=st.integers(0, 10**6),
    runs=st.integers(2, 6),
    lower_minutes=st.sampled_from([1, 2, 5]),
    factors=st.lists(st.sampled_from([1, 2, 3]), min_size=1, max_size=2),
    time_column=st.sampled_from(["window_start", "window_end"]),
    backfill_at=st.integers(0, 6),
)
def test_rollup_chains_equal_batch(
    module_strata: Strata, seed, runs, lower_minutes, factors, time_column, backfill_at
) -> None:
    strata = module_strata
    n = next(_chains)
    raw = f"chain_{n}"
    strata.create(IMPSNS.format(raw=raw))
    names = [f"{raw}_l0"]
    ddl = [
        f"CREATE STREAM {names[0]} AS SELECT campaign, count(*) AS c, sum(price) AS s, "
        f"avg(price) AS a, min(price) AS lo, max(price) AS hi, {time_column} AS w "
        f"FROM TUMBLE({raw}, t, INTERVAL '{lower_minutes} minutes') "
        f"GROUP BY campaign, {time_column}"
    ]
    minutes = lower_minutes
    for level, factor in enumerate(factors, start=1):
        minutes *= factor
        names.append(f"{raw}_l{level}")
        ddl.append(
            f"CREATE STREAM {names[-1]} AS SELECT campaign, sum(c) AS c, sum(s) AS s, "
            f"avg(a) AS a, min(lo) AS lo, max(hi) AS hi, {time_column} AS w "
            f"FROM TUMBLE({names[-2]}, w, INTERVAL '{minutes} minutes') "
            f"GROUP BY campaign, {time_column}"
        )
    rows = _rows(400, seed)
    chunks = [rows[i::runs] for i in range(runs)]
    random.Random(seed).shuffle(chunks)
    chunks = with_a_late_run(chunks, _time)  # each run spans the hour: all but one are late
    created = False
    for position, chunk in enumerate(chunks):
        if position == backfill_at:
            for statement in ddl:
                strata.create(statement)
            created = True
        body = "".join(
            json.dumps({k: v for k, v in r.items() if v is not None}) + "\n" for r in chunk
        )
        strata.ingest(raw, body)
    if not created:
        for statement in ddl:
            strata.create(statement)
    minutes = lower_minutes
    for level, name in enumerate(names):
        if level:
            minutes *= factors[level - 1]
        window = _minute(minutes * 60)
        shift = "" if time_column == "window_start" else f" + interval '{minutes} minutes'"
        cast = "::numeric" if level else ""
        _same(
            strata,
            f"SELECT * FROM {name}",
            f"SELECT campaign, count(*){cast}, sum(price), avg(price), min(price), max(price), "
            f"{window}{shift} FROM {raw} GROUP BY campaign, {window}",
        )
    # The example proved something (_same refuses empty views): a run came late.
    assert late(chunks, _time) and late_runs(strata, raw) > 0


def test_selection_projection_and_union_all_streams(strata: Strata) -> None:
    strata.create(IMPSNS.format(raw="web"))
    strata.create(IMPSNS.format(raw="app"))
    # Selection with several conditions and computed columns (seeds/004).
    big = strata.create(
        "CREATE STREAM big AS SELECT campaign, price * 2 AS doubled, user_id % 10 AS bucket, t "
        "FROM web WHERE price > 1 AND campaign IS NOT NULL AND user_id < 90"
    )
    assert big["event_time"] == "t" and big["raw_sources"] == ["web"]
    strata.create(
        "CREATE STREAM big_count AS SELECT bucket, count(*) AS c, sum(doubled) AS s, "
        "window_end AS t FROM TUMBLE(big, t, INTERVAL '1 minute') GROUP BY bucket, window_end"
    )
    # UNION ALL of streams with the same columns as the source of a derived stream.
    both = strata.create(
        "CREATE STREAM both_channels AS SELECT campaign, price, t FROM web "
        "UNION ALL SELECT campaign, price, t FROM app"
    )
    assert sorted(both["raw_sources"]) == ["app", "web"]
    rows = _rows(900, seed=11)
    _ingest_shuffled(strata, "web", rows[:500], runs=3, seed=12)
    # A stream created after data arrived back-fills from every source.
    strata.create(
        "CREATE STREAM both_count AS SELECT campaign, count(*) AS c, avg(price) AS a, "
        "window_end AS t FROM TUMBLE(both_channels, t, INTERVAL '5 minutes') "
        "GROUP BY campaign, window_end"
    )
    _ingest_shuffled(strata, "app", rows[500:], runs=3, seed=13)
    _ingest_shuffled(strata, "web", _rows(300, seed=14), runs=2, seed=15)
    m1, m5 = _minute(60), _minute(300)
    _same(
        strata,
        "SELECT * FROM big_count",
        f"SELECT user_id % 10, count(*), sum(price * 2), {m1} + interval '1 minute' FROM web "
        f"WHERE price > 1 AND campaign IS NOT NULL AND user_id < 90 GROUP BY 1, {m1}",
    )
    union = "(SELECT campaign, price, t FROM web UNION ALL SELECT campaign, price, t FROM app) u"
    _same(
        strata,
        "SELECT * FROM both_count",
        f"SELECT campaign, count(*), avg(price), {m5} + interval '5 minutes' FROM {union} "
        f"GROUP BY 1, {m5}",
    )
    assert strata.query("SELECT count(*) FROM both_channels") == [(1200,)]
    # Runs go to raw streams only, and a raw stream others read stays: nothing changes.
    row = json.dumps({"campaign": "c1", "price": "1", "t": START.isoformat()}) + "\n"
    derived = strata.post_run("both_channels", row)
    assert derived.status_code == 400 and "is derived" in derived.json()["error"], derived.text
    used = strata.client.delete("/streams/web")
    assert used.status_code == 409 and "both_channels" in used.json()["error"], used.text
    assert strata.client.get("/streams/web").status_code == 200
    assert strata.query("SELECT count(*) FROM both_channels") == [(1200,)]
    mismatch = strata.client.post(
        "/streams",
        json={
            "sql": "CREATE STREAM bad AS SELECT campaign, t FROM web "
            "UNION ALL SELECT user_id, t FROM app"
        },
    )
    assert mismatch.status_code == 400 and "same column names and types" in mismatch.json()["error"]
    # A stream that selects no event time keeps its source's unshown; a UNION ALL must
    # select it in every branch or in none.
    quiet = strata.create("CREATE STREAM quiet AS SELECT campaign FROM web")
    assert [c["name"] for c in quiet["columns"]] == ["campaign"]  # type: ignore[index]
    half = strata.client.post(
        "/streams",
        json={
            "sql": "CREATE STREAM bad AS SELECT campaign, t FROM web "
            "UNION ALL SELECT campaign FROM app"
        },
    )
    assert half.status_code == 400 and "event time" in half.json()["error"]
