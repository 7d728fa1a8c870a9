"""Alternation where the matched text is returned ((regexp_match(x, p))[n], substring,
regexp_replace): accepted where rewriter.regex_choices proves that PostgreSQL's longest
match and Spark's first give the same text, refused by name elsewhere.

Three proofs: random patterns and texts, every pattern the rewriter accepts evaluated by
Spark (the translation) and by PostgreSQL (the meaning), which must agree; Nexmark q21 as
written, and a windowed count keyed by its channel id (computed by Spark per run), equal
their batch queries over the raw rows after every run of shuffled late runs; and the
refusals, each naming the construct.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from rewriter.errors import UnsupportedSQL
from rewriter.expressions import TEXT, to_spark
from rewriter.parse_stream import parse_expression
from rewriter.text_patterns import PatternRefused, regex
from tests.conftest import Strata, examples
from tests.oracle import SnapshotReader, at, cut, late, late_runs, ndjson, same, with_a_late_run

_names = itertools.count()

# ---- random patterns: Spark's translation against PostgreSQL's meaning ----------------

_ATOMS = ["a", "b", "&", "=", ".", "[^&]", "[ab]", "\\w"]


@st.composite
def patterns(draw: st.DrawFn, depth: int = 0) -> str:
    """A pattern of the supported subset over a small alphabet, with alternations."""
    branches = []
    for _ in range(draw(st.integers(1, 3))):
        items = []
        for _ in range(draw(st.integers(0 if branches else 1, 3))):
            kind = draw(st.sampled_from(["atom"] * 4 + ["anchor", "group", "capture"]))
            if kind == "anchor":
                items.append(draw(st.sampled_from(["^", "$"])))
                continue
            if kind in ("group", "capture") and depth < 2:
                inner = draw(patterns(depth + 1))
                # a quantified capture group is refused on its own; keep captures plain
                if kind == "capture":
                    items.append(f"({inner})")
                    continue
                item = f"(?:{inner})"
            else:
                item = draw(st.sampled_from(_ATOMS))
            items.append(item + draw(st.sampled_from(["", "", "*", "+", "?", "{1,2}"])))
        branches.append("".join(items))
    return "|".join(branches)


_TEXTS = st.text(alphabet="ab&=c\n", max_size=8)
# Patterns the check must accept, so that every example compares alternations.
_ACCEPTED = ["(&|^)channel_id=([^&]*)", "(?:ab|b)+=", "(a|&)(b*)", "x|a|b?"]


def _expressions(pattern: str) -> list[str]:
    quoted = pattern.replace("'", "''")
    groups = regex(pattern, extracting=True).groups
    return [
        *(f"(regexp_match(txt, '{quoted}'))[{n}]" for n in range(1, max(groups, 1) + 1)),
        f"regexp_replace(txt, '{quoted}', '<\\&>', 'g')",
    ]


def _accepted(pattern: str) -> bool:
    try:
        regex(pattern, extracting=True)
    except PatternRefused:
        return False
    return True


@pytest.fixture(scope="module")
def pg(pg_url: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(pg_url, autocommit=True) as connection:
        yield connection


@given(
    drawn=st.lists(patterns(), min_size=10, max_size=25),
    texts=st.lists(_TEXTS, min_size=5, max_size=12),
)
@settings(
    max_examples=examples(4),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_accepted_alternations_give_postgresqls_match_in_spark(
    spark: SparkSession, pg: psycopg.Connection, drawn: list[str], texts: list[str]
) -> None:
    chosen = [p for p in drawn if "|" in p and _accepted(p)] + _ACCEPTED
    expressions = [e for p in dict.fromkeys(chosen) for e in _expressions(p)]
    texts = [*texts, "a=1&channel_id=9&b=2", "channel_id=x", "&ab&"]
    rows = list(enumerate(texts))
    spark_items = [
        f"{to_spark(parse_expression(e), {'txt': TEXT}).sql('spark')} AS `e{k}`"
        for k, e in enumerate(expressions)
    ]
    frame = spark.createDataFrame(rows, "id int, txt string").selectExpr("id", *spark_items)
    got = [tuple(r) for r in frame.orderBy("id").collect()]
    values = ", ".join(["(%s, %s)"] * len(rows))
    pg_items = ", ".join(f"{e} AS e{k}" for k, e in enumerate(expressions))
    want = pg.execute(
        f"SELECT id, {pg_items} FROM (VALUES {values}) AS r(id, txt) ORDER BY id",  # type: ignore[arg-type]
        [v for row in rows for v in row],
    ).fetchall()
    for k, expression in enumerate(expressions):
        for (i, text), got_row, want_row in zip(rows, got, want, strict=True):
            assert got_row[k + 1] == want_row[k + 1], (expression, text, i)


# ---- Nexmark q21 as written, and a count keyed by its channel id -------------------------

_CHANNEL_ID = "(regexp_match(url, '(&|^)channel_id=([^&]*)'))[2]"
_Q21 = (
    "SELECT auction, channel, CASE WHEN lower(channel) = 'apple' THEN '0' "
    f"WHEN lower(channel) = 'baidu' THEN '3' ELSE {_CHANNEL_ID} END AS channel_id "
    "FROM {bid} WHERE " + _CHANNEL_ID + " IS NOT NULL OR lower(channel) IN ('apple', 'baidu')"
)
# The value of the first channel_id parameter (at the start of the URL or after an &), up to
# the next &: what the leftmost match of '(&|^)channel_id=([^&]*)' captures, by positions.
_CHANNEL_ID_BY_POSITION = (
    "CASE WHEN starts_with(url, 'channel_id=') THEN split_part(substr(url, 12), '&', 1) "
    "WHEN strpos(url, '&channel_id=') > 0 "
    "THEN split_part(substr(url, strpos(url, '&channel_id=') + 12), '&', 1) END"
)
_PARAMETERS = ["channel_id=", "&channel_id=", "channel_id=&", "a=1", "&", "x_channel_id="]
_VALUES = ["", "7", "42", "&b=2", "=x"]


@st.composite
def urls(draw: st.DrawFn) -> str:
    """Query strings where channel_id= may come first, after &, glued to another name."""
    parts = draw(st.lists(st.sampled_from(_PARAMETERS), min_size=0, max_size=3))
    return "".join(p + draw(st.sampled_from(_VALUES)) for p in parts)


@given(
    bids=st.lists(
        st.tuples(urls(), st.sampled_from(["Apple", "baidu", "web"]), st.integers(0, 3 * 3600)),
        min_size=2,
        max_size=15,
    ).filter(lambda bids: len({t for *_, t in bids}) > 1),
    cuts=st.lists(st.integers(2, 6), min_size=1, max_size=3),
    order=st.randoms(use_true_random=False),
)
@settings(
    max_examples=examples(3),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_q21_and_a_count_by_channel_id_equal_their_batch_after_every_run(
    module_strata: Strata,
    bids: list[tuple[str, str, int]],
    cuts: list[int],
    order: random.Random,
) -> None:
    """Random URLs, cut into shuffled runs with a late one: q21 (a view PostgreSQL
    evaluates) and an hourly count keyed by the channel id (Spark evaluates it per run)
    equal the same queries as batches over the raw rows after every run."""
    strata = module_strata
    n = next(_names)
    bid, oracles = _q21_streams(strata, n)
    rows = [
        {"auction": k, "channel": channel, "url": url, "date_time": at(t)}
        for k, (url, channel, t) in enumerate(bids)
    ]
    order.shuffle(rows)
    runs = list(cut(rows, cuts))
    if len(runs) < 2:
        runs = [rows[:1], rows[1:]]
    runs = with_a_late_run(runs, lambda row: row["date_time"])
    compared: dict[str, int] = {}
    for run in runs:
        strata.ingest(bid, ndjson(run))
        for view, oracle in oracles.items():
            compared[view] = same(strata, view, oracle)
    assert compared[f"SELECT * FROM by_channel_{n}"] > 0
    assert late(runs, lambda row: row["date_time"]) and late_runs(strata, bid) > 0


def test_q21_channel_ids_are_postgresqls(module_strata: Strata) -> None:
    """The cases where the first and the longest alternative could differ in principle:
    channel_id= first, after &, after another parameter's name; none matching."""
    strata = module_strata
    n = next(_names)
    bid = f"rbid_fixed_{n}"
    strata.create(
        f"CREATE STREAM {bid} (auction bigint, channel text, url text, date_time timestamptz) "
        "WITH (event_time = 'date_time')"
    )
    strata.create(
        f"CREATE STREAM ids_{n} AS SELECT {_CHANNEL_ID} AS channel_id, count(*) AS bids "
        f"FROM {bid} GROUP BY {_CHANNEL_ID}"
    )
    urls = ["channel_id=1", "a=2&channel_id=3&b", "x_channel_id=4", "b=5", "&channel_id=&"]
    strata.ingest(
        bid,
        ndjson(
            [
                {"auction": k, "channel": "web", "url": url, "date_time": at(k)}
                for k, url in enumerate(urls)
            ]
        ),
    )
    got = sorted(strata.query(f"SELECT channel_id, bids FROM ids_{n}"), key=repr)
    assert got == sorted([("1", 1), ("3", 1), (None, 2), ("", 1)], key=repr)


# ---- what stays refused, by name ------------------------------------------------------

REFUSED = [
    ("(regexp_match(url, '(a|ab)c'))[1]", "the alternatives of 'a|ab' can match at the same"),
    ("substring(url FROM '(?:x|x=)y')", "the alternatives of 'x|x='"),
    ("(regexp_match(url, 'x(?:b?|a)'))[1]", "an alternative of 'b?|a' other than the last"),
    ("(regexp_match(url, '(a)|b'))[1]", "a capture group inside an alternative of '(a)|b'"),
    ("regexp_replace(url, '(?:a|ab)', '', 'g')", "the alternatives of 'a|ab'"),
    ("(regexp_match(url, 'a|.*'))[1]", "the alternatives of 'a|.*'"),
    ("(regexp_match(url, 'x(?:a|b)?.'))[1]", "'(?:a|b)?' can repeat or stop"),
]


@pytest.mark.parametrize("expression,fragment", REFUSED)
def test_undecided_alternations_are_refused_by_name(expression: str, fragment: str) -> None:
    with pytest.raises(UnsupportedSQL) as caught:
        to_spark(parse_expression(expression), {"url": TEXT})
    assert fragment in str(caught.value)


def test_a_reader_sees_every_snapshot_exact_while_runs_arrive(module_strata: Strata) -> None:
    """While runs of bids (one of them hours late) commit and the reducer folds, a reader
    comparing q21 and the hourly count by channel id with their batch queries, in one
    snapshot after another, never sees them differ."""
    strata = module_strata
    n = next(_names)
    bid, pairs = _q21_streams(strata, n)
    rng = random.Random(3)
    urls = [
        "https://www.nexmark.com/a/b?channel_id={}",
        "https://www.nexmark.com/a/b?x=1&channel_id={}&y=2",
        "channel_id={}",
        "https://www.nexmark.com/a/b?channel_idx={}",
    ]
    runs = []
    for i in range(8):
        hours = 0 if i == 6 else 5 + i  # run 6 comes hours late
        runs.append(
            [
                {
                    "auction": i * 100 + r,
                    "channel": rng.choice(["Apple", "Baidu", "Google", "Bing"]),
                    "url": rng.choice(urls).format(rng.randrange(6)),
                    "date_time": at(hours * 3600 + rng.randrange(3600)),
                }
                for r in range(30)
            ]
        )
    with SnapshotReader.of(strata.database_url, pairs, min_snapshots=5):
        for run in runs:
            strata.ingest(bid, ndjson(run))
    assert late_runs(strata, bid) > 0
    assert strata.query(f"SELECT count(*) FROM by_channel_{n}")[0][0] > 0


def _q21_streams(strata: Strata, n: int) -> tuple[str, dict[str, str]]:
    """A stream of bids, q21 over it and an hourly count keyed by the channel id: the raw
    stream's name, and each view with the batch query over the raw rows it equals."""
    bid = f"rbid_{n}"
    strata.create(
        f"CREATE STREAM {bid} (auction bigint, channel text, url text, date_time timestamptz) "
        "WITH (event_time = 'date_time')"
    )
    q21 = _Q21.format(bid=bid)
    strata.create(f"CREATE STREAM q21_{n} AS {q21}")
    counts = (
        f"SELECT {_CHANNEL_ID} AS channel_id, count(*) AS bids, window_start FROM {{}} "
        f"GROUP BY {_CHANNEL_ID}, window_start"
    )
    strata.create(
        f"CREATE STREAM by_channel_{n} AS "
        + counts.format(f"TUMBLE({bid}, date_time, INTERVAL '1 hour')")
    )
    # The oracles find the parameter without a regular expression, so that they do not read
    # PostgreSQL's regexp_match as the q21 view (which PostgreSQL evaluates) does.
    windowed = (
        f"(SELECT *, {_CHANNEL_ID_BY_POSITION} AS channel_id, "
        "to_timestamp(floor(extract(epoch FROM date_time) / 3600) * 3600) AS window_start "
        f"FROM {bid}) w"
    )
    return bid, {
        f"SELECT * FROM q21_{n}": (
            "SELECT auction, channel, CASE WHEN lower(channel) = 'apple' THEN '0' "
            "WHEN lower(channel) = 'baidu' THEN '3' ELSE channel_id END "
            f"FROM {windowed} WHERE channel_id IS NOT NULL OR lower(channel) IN ('apple', 'baidu')"
        ),
        f"SELECT * FROM by_channel_{n}": (
            f"SELECT channel_id, count(*), window_start FROM {windowed} "
            "GROUP BY channel_id, window_start"
        ),
    }
