"""The aggregates beyond count/sum/min/max/avg, end to end: rows split into runs (ingested in
a shuffled order through the HTTP API, partials by Spark, finals in PostgreSQL's views)
against PostgreSQL's own aggregates over the raw archive.

Exact aggregates (stddev/variance of integers and numerics, bool_and/bool_or/every,
count(DISTINCT x), FILTER) must give PostgreSQL's values digit for digit and its types;
stddev/variance of floats agree within rounding; approx_count_distinct must stay within
its documented bound of count(DISTINCT x), approx_percentile within alpha (relative) of
percentile_disc. The registry's docstring documents every state and bound.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import math
import random
import re
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest
import sqlglot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession
from sqlglot import exp

from rewriter import rewrite
from rewriter.errors import StrataError
from rewriter.registry import exact_in_postgres
from rewriter.sketches import (
    DDSKETCH_ALPHA,
    DDSKETCH_LN_GAMMA,
    DDSKETCH_MAX_INDEX,
    DDSKETCH_OFFSET,
    KMV_K,
    ddsketch_bucket,
)
from tests.conftest import Strata, examples
from tests.oracle import late, late_runs, with_a_late_run

SQL_FILE = Path(__file__).resolve().parents[1] / "sql" / "002_aggregates.sql"
EPOCH = dt.datetime(2024, 5, 1, tzinfo=dt.UTC)
HOUR_US = 3_600_000_000
_names = itertools.count()


def _ndjson(rows: list[dict[str, object]]) -> str:
    def value(v: object) -> object:
        if isinstance(v, Decimal):
            return str(v)
        if isinstance(v, dt.datetime | dt.date):
            return v.isoformat()
        return v

    return "".join(
        json.dumps({k: value(v) for k, v in row.items() if v is not None}) + "\n" for row in rows
    )


def _ingest_in_runs(strata: Strata, stream: str, rows: list[dict], runs: int, seed: int) -> None:
    """Split rows into `runs` runs at random cut points; deliver them in random order."""
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(rows)), runs - 1))
    parts = [rows[a:b] for a, b in itertools.pairwise([0, *cuts, len(rows)])]
    rng.shuffle(parts)
    for part in parts:
        strata.ingest(stream, _ndjson(part))


def _execute(strata: Strata, statement: str) -> None:
    with psycopg.connect(strata.database_url, autocommit=True) as connection:
        connection.execute(statement)  # type: ignore[arg-type]


def _column_types(strata: Strata, relation: str) -> dict[str, str]:
    return dict(
        strata.query(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = %s::regclass AND attnum > 0 ORDER BY attnum",
            relation,
        )
    )


def _same_digits(a: object, b: object) -> bool:
    """Equal, and for numerics with the same digits (scale included), as psql shows them."""
    if isinstance(a, Decimal) or isinstance(b, Decimal):
        return str(a) == str(b)
    return a == b


def _close(a: object, b: object, rel: float) -> bool:
    if a is None or b is None:
        return a is b
    assert isinstance(a, int | float) and isinstance(b, int | float)
    return math.isclose(float(a), float(b), rel_tol=rel, abs_tol=1e-300)


# ---------------------------------------------------------------------------------------
# Every new aggregate over every type, with NULLs, extremes and FILTER, in four runs.
# ---------------------------------------------------------------------------------------

RAW_COLUMNS = (
    "g text, i integer, s smallint, b bigint, n numeric(12,4), u numeric, f double precision, "
    "r real, txt text, flag boolean, ts timestamptz, d date, t timestamptz"
)
TEXTS = ["a", "A", 'a"b', "c\\d", "{x,y}", "", "NULL", "ä", " sp ", "Zz", "x'y", None]


def _mixed_rows(seed: int) -> list[dict[str, object]]:
    rng = random.Random(seed)
    rows: list[dict[str, object]] = []
    for k in range(240):
        group = "abc"[k % 3]
        rows.append(
            {
                "g": group,
                "i": rng.choice(
                    [None, rng.randint(-1000, 1000), rng.randint(-(2**31) + 1, 2**31 - 1)]
                ),
                "s": rng.choice([None, rng.randint(-32767, 32767)]),
                "b": rng.choice([None, 2**63 - 1, -(2**63) + 1, rng.randint(-(10**18), 10**18), 7]),
                "n": rng.choice([None, Decimal(rng.randint(-(10**12) + 1, 10**12 - 1)) / 10**4]),
                "u": rng.choice(
                    [
                        None,
                        Decimal(rng.randint(-(10**6), 10**6)) / 1000,
                        Decimal(rng.randint(-(10**37), 10**37)) / 10**10,
                    ]
                ),
                # Group 'c' sits at 1e9 with a spread of 1: naive sums of squares would lose
                # every digit there; the moments must not.
                "f": rng.choice(
                    [None, 1e9 + rng.random() if group == "c" else rng.uniform(-1e6, 1e6)]
                ),
                "r": rng.choice([None, rng.randint(-(10**6), 10**6) / 8, -0.0, 0.0]),
                "txt": rng.choice(TEXTS),
                "flag": rng.choice([None, True, False, True]),
                "ts": EPOCH + dt.timedelta(microseconds=rng.randint(-(10**15), 10**15)),
                "d": dt.date(2000, 1, 1) + dt.timedelta(days=rng.randint(-3000, 3000)),
                "t": EPOCH + dt.timedelta(minutes=rng.randint(0, 119)),
            }
        )
    # A group whose every aggregated value is NULL, and a group of one row.
    for minute in (3, 70):
        rows.append({"g": "nulls", "t": EPOCH + dt.timedelta(minutes=minute)})
    rows.append(
        {
            "g": "one",
            "i": 5,
            "s": 1,
            "b": 2,
            "n": Decimal("1.5000"),
            "u": Decimal("2.5"),
            "f": 0.5,
            "r": 1.5,
            "txt": "x",
            "flag": True,
            "ts": EPOCH,
            "d": dt.date(2024, 1, 1),
            "t": EPOCH,
        }
    )
    random.Random(seed + 1).shuffle(rows)
    return rows


@dataclass(frozen=True)
class Case:
    alias: str
    call: str  # in the derived stream
    oracle: str  # PostgreSQL's own, over the raw rows
    kind: str = "exact"  # exact | float | kmv | percentile


EXACT_CALLS = [
    *(f"{fn}({col})" for fn in ("stddev", "var_pop") for col in ("i", "s", "b", "n", "u")),
    "stddev_samp(b)",
    "stddev_pop(n)",
    "variance(u)",
    "var_samp(i)",
    "stddev_pop(u)",
    "variance(n * 2)",
    "stddev(i + s)",
    "var_pop(CASE WHEN flag THEN n END)",
    "bool_and(flag)",
    "bool_or(flag)",
    "every(flag)",
    "bool_and(i > 0)",
    *(
        f"count(DISTINCT {col})"
        for col in ("i", "s", "b", "n", "u", "f", "r", "txt", "flag", "ts", "d")
    ),
    "count(DISTINCT lower(txt))",
    # FILTER on old and new aggregates; count(*) FILTER is 0, never NULL, when nothing matches
    "count(*) FILTER (WHERE i > 0)",
    "count(*) FILTER (WHERE i > 2147483647)",
    "count(i) FILTER (WHERE flag)",
    "sum(n) FILTER (WHERE flag)",
    "sum(b) FILTER (WHERE txt IS NOT NULL)",
    "avg(i) FILTER (WHERE NOT flag)",
    "min(txt) FILTER (WHERE i < 0)",
    "max(ts) FILTER (WHERE flag IS NULL)",
    "stddev(n) FILTER (WHERE i > 0)",
    "var_samp(u) FILTER (WHERE flag)",
    "bool_or(flag) FILTER (WHERE i < 0)",
    "count(DISTINCT txt) FILTER (WHERE flag OR i > 0)",
    # arithmetic over aggregates, evaluated by PostgreSQL in the view
    "round(stddev(n), 2)",
    "stddev(i) / count(*)",
    "sum(n) / count(*) FILTER (WHERE n IS NOT NULL)",
    "count(DISTINCT txt) * 2 + count(*)",
    "CASE WHEN bool_and(flag) THEN 1 ELSE 0 END",
    "var_pop(n) - stddev(n) * stddev(n)",
]
FLOAT_CALLS = [
    "stddev(f)",
    "stddev_pop(f)",
    "var_samp(f)",
    "var_pop(f)",
    "stddev(r)",
    "variance(r)",
    "stddev(f) FILTER (WHERE flag)",
    "variance(f * 2)",
]
PERCENTILES = [
    ("f", 0.5),
    ("f", 0.0),
    ("f", 1.0),
    ("i", 0.9),
    ("n", 0.1),
    ("b", 0.75),
    ("u", 0.33),
    ("r", 0.5),
]
CASES = (
    [Case(f"e{k}", c, c) for k, c in enumerate(EXACT_CALLS)]
    + [Case(f"f{k}", c, c, "float") for k, c in enumerate(FLOAT_CALLS)]
    + [
        Case(f"k_{col}", f"approx_count_distinct({col})", f"count(DISTINCT {col})", "kmv")
        for col in ("i", "b", "u", "f", "txt", "ts")
    ]
    + [
        Case(
            f"p_{col}_{k}",
            f"approx_percentile({col}, {p})",
            f"percentile_disc({p}) WITHIN GROUP (ORDER BY {col})",
            "percentile",
        )
        for k, (col, p) in enumerate(PERCENTILES)
    ]
    + [
        Case(
            "p_filtered",
            "approx_percentile(f, 0.5) FILTER (WHERE flag)",
            "percentile_disc(0.5) WITHIN GROUP (ORDER BY f) FILTER (WHERE flag)",
            "percentile",
        ),
        Case(
            "k_filtered",
            "approx_count_distinct(txt) FILTER (WHERE flag)",
            "count(DISTINCT txt) FILTER (WHERE flag)",
            "kmv",
        ),
    ]
)


# HOP windows consolidate the same pane states in overlapping windows.
HOP_SELECT = (
    "stddev(n) AS sd_n, var_pop(b) AS vp_b, count(DISTINCT txt) AS cd_txt, bool_or(flag) AS bo, "
    "approx_count_distinct(i) AS k_i, count(*) FILTER (WHERE flag) AS c_flag"
)
HOP_ORACLE = re.sub(r" AS \w+", "", HOP_SELECT).replace(
    "approx_count_distinct(i)", "count(DISTINCT i)"
)


@dataclass
class Compared:
    view: list[tuple]
    oracle: list[tuple]
    view_types: dict[str, str]
    oracle_types: dict[str, str]
    stream: str


@pytest.fixture(scope="module")
def mixed(module_strata: Strata) -> Compared:
    strata = module_strata
    raw, derived = "agg_raw", "agg_all"
    strata.create(f"CREATE STREAM {raw} ({RAW_COLUMNS}) WITH (event_time = 't')")
    select = ", ".join(f"{c.call} AS {c.alias}" for c in CASES)
    strata.create(
        f"CREATE STREAM {derived} AS SELECT g, window_start, {select} "
        f"FROM TUMBLE({raw}, t, INTERVAL '1 hour') GROUP BY g, window_start"
    )
    strata.create(
        f"CREATE STREAM agg_hop AS SELECT g, window_start, {HOP_SELECT} "
        f"FROM HOP({raw}, t, INTERVAL '30 minutes', INTERVAL '1 hour') GROUP BY g, window_start"
    )
    _ingest_in_runs(strata, raw, _mixed_rows(7), runs=4, seed=2)
    oracle_select = ", ".join(f"{c.oracle} AS {c.alias}" for c in CASES)
    _execute(
        strata,
        f"CREATE VIEW agg_oracle AS SELECT g, strata_window_start(t, {HOUR_US}) AS window_start, "
        f"{oracle_select} FROM {raw} GROUP BY 1, 2",
    )
    order = "ORDER BY g, window_start"
    return Compared(
        view=strata.query(f"SELECT * FROM {derived} {order}"),
        oracle=strata.query(f"SELECT * FROM agg_oracle {order}"),
        view_types=_column_types(strata, derived),
        oracle_types=_column_types(strata, "agg_oracle"),
        stream=derived,
    )


def test_groups_cover_nulls_and_single_rows(mixed: Compared) -> None:
    groups = [row[:2] for row in mixed.view]
    assert groups == [row[:2] for row in mixed.oracle]
    assert {g for g, _ in groups} == {"a", "b", "c", "nulls", "one"}
    assert len(groups) == 9  # two windows for a, b, c and nulls; one for one


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.call)
def test_aggregate_equals_postgresql(case: Case, mixed: Compared) -> None:
    k = 2 + CASES.index(case)
    differ = []
    for view_row, oracle_row in zip(mixed.view, mixed.oracle, strict=True):
        got, expected = view_row[k], oracle_row[k]
        if case.kind == "exact":
            ok = _same_digits(got, expected)
        elif case.kind == "float":
            ok = _close(got, expected, 1e-6 if view_row[0] == "c" else 1e-11)
        elif case.kind == "kmv":
            # Below k distinct values the sketch holds every hash: exact.
            ok = got == expected if expected < KMV_K else abs(got - expected) <= 0.1 * expected
        else:
            ok = _within_alpha(got, expected)
        if not ok:
            differ.append((view_row[:2], got, expected))
    assert not differ, f"{case.call}: (group, view, PostgreSQL): {differ}"


def _within_alpha(got: object, expected: object) -> bool:
    if expected is None or got is None:
        return got is expected
    assert isinstance(got, float)
    value = float(expected)  # type: ignore[arg-type]
    return abs(got - value) <= DDSKETCH_ALPHA * abs(value) * (1 + 1e-9)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.call)
def test_result_types_are_postgresql_types(case: Case, mixed: Compared) -> None:
    got = mixed.view_types[case.alias]
    if case.kind == "percentile":
        assert got == "double precision"  # approximate, whatever the input type
    else:
        assert got == mixed.oracle_types[case.alias]


def test_hop_windows(module_strata: Strata, mixed: Compared) -> None:
    """Each row counts in two overlapping windows: its half hour's and the one before."""
    half_hour = HOUR_US // 2
    oracle = module_strata.query(
        f"SELECT g, w, {HOP_ORACLE} FROM agg_raw CROSS JOIN LATERAL "
        f"(VALUES (strata_window_start(t, {half_hour})), "
        f"(strata_window_start(t, {half_hour}) - interval '30 minutes')) AS hop(w) "
        "GROUP BY 1, 2 ORDER BY 1, 2"
    )
    view = module_strata.query("SELECT * FROM agg_hop ORDER BY g, window_start")
    assert len(view) > len(mixed.view)
    assert [tuple(map(str, r)) for r in view] == [tuple(map(str, r)) for r in oracle]


def test_reduced_states_give_the_same_view(module_strata: Strata, mixed: Compared) -> None:
    """The reduce forms keep the partial form: replacing a group's partial rows by their
    reduced row (what the reducer does) changes no value of the view."""
    description = module_strata.client.get(f"/streams/{mixed.stream}").json()
    reduce_query = description["rewrite"]["reduce_query"]
    archive = description["rewrite"]["partial_archive_table"]
    columns = [c["name"] for c in description["rewrite"]["partial_columns"]][1:]
    with psycopg.connect(module_strata.database_url) as conn:
        before = conn.execute(f"SELECT count(*) FROM {archive}").fetchone()
        conn.execute(f"DELETE FROM {archive} WHERE strata_run < 0")
        conn.execute(
            f"INSERT INTO {archive} (strata_run, {', '.join(columns)}) "
            f"SELECT -1, * FROM ({reduce_query}) AS reduced"
        )
        conn.execute(f"DELETE FROM {archive} WHERE strata_run >= 0")
        after = conn.execute(f"SELECT count(*) FROM {archive}").fetchone()
        view = conn.execute(f"SELECT * FROM {mixed.stream} ORDER BY g, window_start").fetchall()
        conn.rollback()
    assert before is not None and after is not None and after[0] < before[0]
    assert len(view) == len(mixed.view)
    for got, expected in zip(view, mixed.view, strict=True):
        for k, case in enumerate(CASES, start=2):
            if case.kind == "float":
                assert _close(got[k], expected[k], 1e-9), case.call
            else:
                assert _same_digits(got[k], expected[k]), case.call


def test_exact_twins_for_queries_postgresql_runs(module_strata: Strata, mixed: Compared) -> None:
    """Serial streams run the query as written in PostgreSQL: the approximate aggregates
    then become their exact twins (within any bound)."""
    query = sqlglot.parse_one(
        "SELECT g, approx_count_distinct(i) AS a, approx_percentile(f, 0.5) FILTER "
        "(WHERE flag) AS b FROM agg_raw GROUP BY g ORDER BY g",
        read="postgres",
    )
    assert module_strata.query(query.transform(exact_in_postgres).sql("postgres")) == (
        module_strata.query(
            "SELECT g, count(DISTINCT i), (percentile_disc(0.5) WITHIN GROUP (ORDER BY f) "
            "FILTER (WHERE flag))::double precision FROM agg_raw GROUP BY g ORDER BY g"
        )
    )


# ---------------------------------------------------------------------------------------
# The sketches at scale: more than k distinct values, a few thousand values per group.
# ---------------------------------------------------------------------------------------

SKETCH_PERCENTILES = (0.0, 0.001, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999, 1.0)


@pytest.fixture(scope="module")
def sketches(module_strata: Strata) -> tuple[list[tuple], list[tuple]]:
    strata = module_strata
    raw = "sketch_raw"
    strata.create(
        f"CREATE STREAM {raw} (g integer, x bigint, y double precision, z numeric(12,4), "
        "t timestamptz) WITH (event_time = 't')"
    )
    rng = random.Random(11)
    rows: list[dict[str, object]] = []
    # g = distinct values per group: below and above k; values recur across runs.
    for g, distinct, count in ((1, 700, 2000), (2, 3000, 6000), (3, 9000, 12000)):
        pool = rng.sample(range(-(10**12), 10**12), distinct)
        for k in range(count):
            x = pool[k] if k < distinct else rng.choice(pool)
            y = rng.choice([0.0, -rng.lognormvariate(0, 3), rng.lognormvariate(2, 4)])
            rows.append(
                {
                    "g": g,
                    "x": x,
                    "y": y,
                    "z": Decimal(rng.randint(-(10**9), 10**11)) / 10**4,
                    "t": EPOCH + dt.timedelta(seconds=rng.randint(0, 86399)),
                }
            )
    rng.shuffle(rows)
    # A third of the rows arrive before the stream exists: back-filled from the archive.
    _ingest_in_runs(strata, raw, rows[:7000], runs=2, seed=3)
    percentiles = ", ".join(
        f"approx_percentile(y, {p}) AS py{k}, approx_percentile(z, {p}) AS pz{k}"
        for k, p in enumerate(SKETCH_PERCENTILES)
    )
    strata.create(
        f"CREATE STREAM sketch_agg AS SELECT g, window_end, approx_count_distinct(x) AS kx, "
        f"approx_count_distinct(y) AS ky, {percentiles} "
        f"FROM TUMBLE({raw}, t, INTERVAL '1 day') GROUP BY g, window_end"
    )
    _ingest_in_runs(strata, raw, rows[7000:], runs=4, seed=4)
    percentile_oracle = ", ".join(
        f"percentile_disc({p}) WITHIN GROUP (ORDER BY y), "
        f"percentile_disc({p}) WITHIN GROUP (ORDER BY z)"
        for p in SKETCH_PERCENTILES
    )
    oracle = strata.query(
        f"SELECT g, strata_window_start(t, 86400000000) + interval '1 day', count(DISTINCT x), "
        f"count(DISTINCT y), {percentile_oracle} FROM {raw} GROUP BY 1, 2 ORDER BY 1"
    )
    return strata.query("SELECT * FROM sketch_agg ORDER BY g"), oracle


def test_approx_count_distinct_within_its_bound(sketches: tuple[list, list]) -> None:
    view, oracle = sketches
    assert [r[:2] for r in view] == [r[:2] for r in oracle]
    errors = []
    for got, expected in zip(view, oracle, strict=True):
        for estimate, exact in ((got[2], expected[2]), (got[3], expected[3])):
            if exact < KMV_K:
                assert estimate == exact
            else:
                errors.append(abs(estimate - exact) / exact)
    assert errors and max(errors) <= 0.10, errors  # 3.2 standard errors (1/sqrt(k - 2))


def test_approx_percentile_within_alpha(sketches: tuple[list, list]) -> None:
    view, oracle = sketches
    for got, expected in zip(view, oracle, strict=True):
        for k in range(4, len(got)):
            assert _within_alpha(got[k], expected[k]), (got[0], k, got[k], expected[k])


def test_ddsketch_buckets_agree_between_engines(spark: SparkSession, module_strata: Strata) -> None:
    """Spark buckets values (partials) as sql/002 does, extremes included, and every bucket
    stands for its values within alpha."""
    rng = random.Random(5)
    values = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        5e-324,
        -5e-324,
        2.2250738585072014e-308,
        1.7976931348623157e308,
    ]
    values += [math.exp(k * DDSKETCH_LN_GAMMA) for k in range(-50, 50)]  # bucket edges
    values += [rng.lognormvariate(0, 30) * rng.choice([-1, 1]) for _ in range(2000)]
    frame = spark.createDataFrame([(v,) for v in values], "x double")
    frame.createOrReplaceTempView("ddsketch_values")
    bucket = ddsketch_bucket(exp.column("x", quoted=True)).sql("spark")
    spark_buckets = [r[0] for r in spark.sql(f"SELECT {bucket} FROM ddsketch_values").collect()]
    pg_buckets = [
        module_strata.query("SELECT strata_ddsketch_bucket(%s::float8)", v)[0][0] for v in values
    ]
    # ln() may differ in the last ulp between the JVM and libm: exactly on a bucket edge the
    # engines may pick neighbouring buckets (both within alpha). Elsewhere they agree.
    for v, in_spark, in_pg in zip(values, spark_buckets, pg_buckets, strict=True):
        on_edge = v != 0 and abs(math.log(abs(v)) / DDSKETCH_LN_GAMMA % 1 - 0.5) > 0.5 - 1e-9
        assert in_spark == in_pg or (on_edge and abs(in_spark - in_pg) == 1), (v, in_spark, in_pg)
    for v, b in zip(values, pg_buckets, strict=True):
        represented = module_strata.query("SELECT strata_ddsketch_value(%s)", b)[0][0]
        assert abs(represented - v) <= DDSKETCH_ALPHA * abs(v) * (1 + 1e-9), (v, b, represented)


def test_sketch_constants_agree_with_the_sql_file() -> None:
    text = SQL_FILE.read_text()
    gamma = (1 + DDSKETCH_ALPHA) / (1 - DDSKETCH_ALPHA)
    assert math.log(gamma) == DDSKETCH_LN_GAMMA
    assert repr(DDSKETCH_LN_GAMMA) in text
    assert f"{DDSKETCH_OFFSET} + least(" in text and f", {DDSKETCH_MAX_INDEX})" in text
    assert f"LIMIT {KMV_K}" in text and f"< {KMV_K}" in text and f"sketch[{KMV_K}]" in text
    assert f"{1 - DDSKETCH_ALPHA} * exp(" in text


# ---------------------------------------------------------------------------------------
# What is refused, and how it says so.
# ---------------------------------------------------------------------------------------

SOURCE = (
    "CREATE STREAM src (i integer, f double precision, txt text, flag boolean, t timestamptz) "
    "WITH (event_time = 't')"
)
REFUSED = [
    ("approx_percentile(txt, 0.5)", "approx_percentile takes number types, not text"),
    ("approx_percentile(f, 1.5)", "constant fraction p between 0 and 1"),
    ("approx_percentile(f, i)", "constant fraction p between 0 and 1"),
    ("approx_percentile(f)", "approx_percentile takes (x, p)"),
    ("percentile_cont(0.5) WITHIN GROUP (ORDER BY f)", "use approx_percentile(x, p)"),
    ("percentile_disc(0.5) WITHIN GROUP (ORDER BY f)", "use approx_percentile(x, p)"),
    ("stddev(txt)", "stddev takes number types, not text"),
    ("var_pop(flag)", "var_pop takes number types, not boolean"),
    ("bool_and(i)", "bool_and takes boolean, not integer"),
    ("every(txt)", "every takes boolean, not text"),
    ("count(DISTINCT i, f)", "count(DISTINCT x) takes one expression"),
    ("sum(DISTINCT i)", "DISTINCT inside aggregates is not supported except in count(DISTINCT x)"),
    ("approx_count_distinct(i, 0.01)", "approx_count_distinct takes one argument"),
    ("count(*) FILTER (WHERE i)", "FILTER needs a boolean condition"),
    ("count(*) FILTER (WHERE count(*) > 1)", "FILTER needs a boolean condition"),
    ("stddev(stddev(i))", "aggregates cannot be nested"),
    ("count(*) FILTER (WHERE flag) OVER ()", "window functions (OVER)"),
    ("string_agg(txt, ',')", "late runs change that order"),
]


@pytest.mark.parametrize("call,fragment", REFUSED)
def test_unsupported_calls_say_why(call: str, fragment: str) -> None:
    source = rewrite(SOURCE, {})
    with pytest.raises(StrataError) as caught:
        rewrite(
            f"CREATE STREAM d AS SELECT {call} AS a, window_end "
            "FROM TUMBLE(src, t, INTERVAL '1 minute') GROUP BY window_end",
            {"src": source},
        )
    assert fragment in str(caught.value)


def test_refusal_lists_the_supported_aggregates() -> None:
    source = rewrite(SOURCE, {})
    with pytest.raises(StrataError) as caught:
        rewrite(
            "CREATE STREAM d AS SELECT mode() WITHIN GROUP (ORDER BY i) AS a, window_end "
            "FROM TUMBLE(src, t, INTERVAL '1 minute') GROUP BY window_end",
            {"src": source},
        )
    assert "WITHIN GROUP" in str(caught.value)
    with pytest.raises(StrataError) as caught:
        rewrite(
            "CREATE STREAM d AS SELECT corr(i, f) AS a, window_end "
            "FROM TUMBLE(src, t, INTERVAL '1 minute') GROUP BY window_end",
            {"src": source},
        )
    message = str(caught.value)
    for name in ("stddev(x)", "count(DISTINCT x)", "approx_count_distinct(x)", "FILTER"):
        assert name in message


def test_filter_is_in_the_partial_query() -> None:
    source = rewrite(SOURCE, {})
    plan = rewrite(
        "CREATE STREAM d AS SELECT count(*) FILTER (WHERE i > 0) AS c, "
        "stddev(i) FILTER (WHERE flag) AS s, window_end "
        "FROM TUMBLE(src, t, INTERVAL '1 minute') GROUP BY window_end",
        {"src": source},
    )
    partial = plan.partial_query  # type: ignore[union-attr]
    assert "COUNT(*) FILTER(WHERE `i` > 0) AS `agg_0_count`" in partial
    # Every Spark aggregate inside stddev's moments is filtered.
    moments = partial.split("AS `agg_0_count`, ")[1].split(" AS `agg_1_moments`")[0]
    assert len(re.findall(r"\b(?:COUNT|SUM)\(", moments)) == 3
    assert moments.count("FILTER(WHERE `flag`)") == 3


# ---------------------------------------------------------------------------------------
# Property: any values, any split into runs, any arrival order.
# ---------------------------------------------------------------------------------------

PROPERTY_SELECT = (
    "stddev(n) AS sd_n, var_pop(i) AS vp_i, variance(f) AS v_f, stddev_pop(b) AS sp_b, "
    "bool_and(flag) AS ba, bool_or(flag) AS bo, every(i > 0) AS ev, "
    "count(DISTINCT txt) AS cd_txt, count(DISTINCT n) AS cd_n, "
    "count(*) FILTER (WHERE flag) AS c_flag, count(DISTINCT i) FILTER (WHERE n > 0) AS cd_i, "
    "stddev_samp(i) FILTER (WHERE txt IS NOT NULL) AS sd_i, sum(n) FILTER (WHERE NOT flag) AS s_n"
)
PROPERTY_ORACLE = re.sub(r" AS \w+", "", PROPERTY_SELECT)
PROPERTY_FLOAT_COLUMNS = {4}  # v_f, by position in the rows below (after g and window)

property_rows = st.lists(
    st.fixed_dictionaries(
        {
            "g": st.sampled_from(["x", "y"]),
            "i": st.one_of(st.none(), st.integers(-(2**31) + 1, 2**31 - 1), st.integers(-3, 3)),
            "b": st.one_of(st.none(), st.integers(-(2**63) + 1, 2**63 - 1)),
            "n": st.one_of(st.none(), st.decimals(min_value=-(10**7), max_value=10**7, places=4)),
            # Quarters: float variances are then well conditioned, both engines near exact.
            "f": st.one_of(st.none(), st.integers(-(10**7), 10**7).map(lambda v: v / 4)),
            "flag": st.one_of(st.none(), st.booleans()),
            "txt": st.one_of(st.none(), st.sampled_from(["a", "B", "", 'q"', "\\", "ä", "{,}"])),
            "t": st.integers(0, 3 * HOUR_US - 1).map(
                lambda us: EPOCH + dt.timedelta(microseconds=us)
            ),
        }
    ),
    min_size=2,
    max_size=60,
).filter(lambda rows: len({row["t"] for row in rows}) > 1)  # a late run needs two times


@settings(
    max_examples=examples(8),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(rows=property_rows, data=st.data())
def test_any_split_and_order_gives_postgresql_results(
    module_strata: Strata, rows: list[dict], data: st.DataObject
) -> None:
    strata = module_strata
    suffix = next(_names)
    raw = f"prop_raw_{suffix}"
    strata.create(
        f"CREATE STREAM {raw} (g text, i integer, b bigint, n numeric(12,4), "
        "f double precision, flag boolean, txt text, t timestamptz) WITH (event_time = 't')"
    )
    strata.create(
        f"CREATE STREAM prop_{suffix} AS SELECT g, window_start, {PROPERTY_SELECT} "
        f"FROM TUMBLE({raw}, t, INTERVAL '1 hour') GROUP BY g, window_start"
    )
    # Two runs at least, in any order with one at least behind an earlier one.
    cuts = sorted(data.draw(st.sets(st.integers(1, len(rows) - 1), min_size=1, max_size=3)))
    runs = [rows[a:b] for a, b in itertools.pairwise([0, *cuts, len(rows)])]
    runs = with_a_late_run(data.draw(st.permutations(runs)), lambda row: row["t"])
    for run in runs:
        strata.ingest(raw, _ndjson(run))
    order = "ORDER BY 1, 2"
    view = strata.query(f"SELECT * FROM prop_{suffix} {order}")
    oracle = strata.query(
        f"SELECT g, strata_window_start(t, {HOUR_US}), "
        f"{PROPERTY_ORACLE} FROM {raw} GROUP BY 1, 2 {order}"
    )
    assert [r[:2] for r in view] == [r[:2] for r in oracle]
    for got, expected in zip(view, oracle, strict=True):
        for k in range(2, len(got)):
            if k in PROPERTY_FLOAT_COLUMNS:
                assert _close(got[k], expected[k], 1e-9), (k, got, expected)
            else:
                assert _same_digits(got[k], expected[k]), (k, got[k], expected[k])
    # The example proved something: groups to compare, and a run that came late.
    assert oracle and late(runs, lambda row: row["t"]) and late_runs(strata, raw) > 0


@pytest.mark.parametrize("parallel", [False, True])
def test_sketch_merges_equal_the_union_and_the_sums(module_strata: Strata, parallel: bool) -> None:
    """The merge aggregates over many states, gathered and compacted as they go (and
    combined across parallel workers): the KMV union is the 1,024 smallest distinct hashes
    of all states, the DDSketch merge each bucket's counts added, as computed in Python."""
    rng = random.Random(29 + parallel)
    groups: dict[int, tuple[list[list[int]], list[dict[str, int]]]] = {}
    for g in range(6):
        states = 1 + (g * 37) % 150  # up to 149 states: several compactions each
        hashes = [
            sorted(rng.sample(range(-(10**4) * (g + 1), 10**4 * (g + 1)), rng.randint(0, 1024)))
            for _ in range(states)
        ]
        buckets = [
            {str(rng.randint(-5, 40)): rng.randint(1, 9) for _ in range(rng.randint(0, 12))}
            for _ in range(states)
        ]
        groups[g] = (hashes, buckets)
    rows = [
        (g, hashes, json.dumps(buckets))
        for g, (all_hashes, all_buckets) in groups.items()
        for hashes, buckets in zip(all_hashes, all_buckets, strict=True)
    ]
    rng.shuffle(rows)
    with psycopg.connect(module_strata.database_url) as conn:
        conn.execute("CREATE TEMP TABLE states (g integer, kmv bigint[], dd jsonb)")
        with conn.cursor().copy("COPY states FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        conn.execute("ANALYZE states")
        if parallel:
            for setting in ("parallel_setup_cost", "parallel_tuple_cost"):
                conn.execute(f"SET {setting} = 0")
            conn.execute("SET min_parallel_table_scan_size = 0")
            conn.execute("SET debug_parallel_query = on")
        merged = conn.execute(
            "SELECT g, strata_kmv_union(kmv), strata_ddsketch_merge(dd) FROM states GROUP BY g"
        ).fetchall()
    assert len(merged) == len(groups)
    for g, kmv, dd in merged:
        all_hashes, all_buckets = groups[g]
        assert kmv == sorted({h for hashes in all_hashes for h in hashes})[:KMV_K], g
        sums: dict[str, int] = {}
        for buckets in all_buckets:
            for bucket, count in buckets.items():
                sums[bucket] = sums.get(bucket, 0) + count
        assert dd == sums, g
