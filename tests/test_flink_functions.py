"""Flink's REGEXP_EXTRACT and SPLIT_INDEX, as Nexmark q21 and q22 write them, mean in Strata
what they mean in Flink: checked against a Python model of Flink's functions (Python's
``re`` backtracks as Java's does; Flink splits with commons-lang's
splitByWholeSeparatorPreserveAllTokens, Python's ``str.split`` keeps empty pieces alike),
both where PostgreSQL computes them (a stream of rows, a view) and where Spark does (the
partial rows of an aggregate), over runs in shuffled order."""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from rewriter.errors import UnsupportedSQL
from rewriter.rewrite import rewrite
from tests.conftest import Strata

CHANNEL = "(&|^)channel_id=([^&]*)"
URLS = [
    "https://www.nexmark.com/item/a/b?channel_id=7&x=1",
    "https://www.nexmark.com/item",
    "channel_id=42",
    "&channel_id=&z",
    "x=1&channel_id=abc",
    "a//b",
    "/lead/trail/",
    "no-separator",
    "",
    "id=123 and id=456",
    None,
]


def split_index(text: str | None, sep: str, index: int) -> str | None:
    if text is None or index < 0 or text == "":
        return None
    pieces = text.split(sep)
    return pieces[index] if index < len(pieces) else None


def regexp_extract(text: str | None, pattern: str, group: int) -> str | None:
    found = None if text is None else re.search(pattern, text)
    return None if found is None else found.group(group)


PROJECTION = (
    "CREATE STREAM fl_parts AS SELECT url, SPLIT_INDEX(url, '/', 0) AS p0, "
    "SPLIT_INDEX(url, '/', 3) AS p3, SPLIT_INDEX(url, '//', 1) AS q1, "
    "SPLIT_INDEX(url, '/', -1) AS neg, "
    f"REGEXP_EXTRACT(url, '{CHANNEL}', 2) AS ch, REGEXP_EXTRACT(url, 'id=([0-9]+)', 0) AS whole, "
    "t FROM fl_urls"
)
AGGREGATE = (
    "CREATE STREAM fl_counts AS SELECT SPLIT_INDEX(url, '/', 3) AS d, "
    f"REGEXP_EXTRACT(url, '{CHANNEL}', 2) AS ch, count(*) AS n, window_end AS w "
    "FROM TUMBLE(fl_urls, t, INTERVAL '1 hour') "
    f"GROUP BY SPLIT_INDEX(url, '/', 3), REGEXP_EXTRACT(url, '{CHANNEL}', 2), window_end"
)


def test_regexp_extract_and_split_index_mean_what_flink_means(strata: Strata) -> None:
    strata.create("CREATE STREAM fl_urls (url text, t timestamptz) WITH (event_time = 't')")
    strata.create(PROJECTION)
    strata.create(AGGREGATE)
    rng = random.Random(21)
    start = datetime(2026, 11, 20, tzinfo=UTC)
    rows = [(url, start + timedelta(minutes=rng.randrange(300))) for url in URLS * 6]
    rng.shuffle(rows)
    runs = [rows[k : k + 11] for k in range(0, len(rows), 11)]
    rng.shuffle(runs)  # hours late or early, in any order
    for number, run in enumerate(runs):
        body = "".join(json.dumps({"url": u, "t": t.isoformat()}) + "\n" for u, t in run)
        strata.ingest("fl_urls", body, run_id=f"fl-{number}")

    model = Counter(
        (
            url,
            split_index(url, "/", 0),
            split_index(url, "/", 3),
            split_index(url, "//", 1),
            None,
            regexp_extract(url, CHANNEL, 2),
            regexp_extract(url, "id=([0-9]+)", 0),
        )
        for url, _ in rows
    )
    shown = Counter(strata.query("SELECT url, p0, p3, q1, neg, ch, whole FROM fl_parts"))
    assert shown == model

    counted: Counter[tuple[str | None, str | None, datetime]] = Counter()
    for url, t in rows:
        hour = t.replace(minute=0) + timedelta(hours=1)
        counted[(split_index(url, "/", 3), regexp_extract(url, CHANNEL, 2), hour)] += 1
    assert (
        Counter(
            {(d, ch, w): n for d, ch, n, w in strata.query("SELECT d, ch, n, w FROM fl_counts")}
        )
        == counted
    )


@pytest.mark.parametrize(
    "call, fragment",
    [
        ("SPLIT_INDEX(url, '', 1)", "separator literal (not empty)"),
        ("SPLIT_INDEX(url, sep, 1)", "separator literal"),
        ("SPLIT_INDEX(url, '/', n)", "index literal"),
        ("REGEXP_EXTRACT(url, pat, 1)", "pattern literal"),
        ("REGEXP_EXTRACT(url, '(a|ab)', 1)", "(a|ab)"),  # alternatives PostgreSQL and Java
    ],
)
def test_what_is_refused_says_what_to_write(call: str, fragment: str) -> None:
    raw = rewrite(
        "CREATE STREAM fl_raw (url text, sep text, n int, pat text, t timestamptz) "
        "WITH (event_time = 't')",
        {},
    )
    with pytest.raises(UnsupportedSQL) as caught:
        rewrite(
            f"CREATE STREAM s AS SELECT {call} AS x, count(*) AS c FROM fl_raw GROUP BY 1",
            {"fl_raw": raw},
        )
    assert fragment in str(caught.value)
