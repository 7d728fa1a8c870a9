"""Golden rewrite fixtures (tests/fixtures/rewrite/*.sql) and the rewriter's error messages.

Run with STRATA_UPDATE_GOLDENS=1 to rewrite the expected sections after a deliberate
change; review the diff like code.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest
import sqlglot

from rewriter import (
    ParallelAggregatePlan,
    RawStreamPlan,
    SerialAggregatePlan,
    StreamPlan,
    companion,
    rewrite,
)
from rewriter.errors import StrataError
from rewriter.plan import ReadJoinStreamPlan, ReadUnionStreamPlan
from rewriter.sql_functions import SqlFunction
from rewriter.tables import TableSchema

FIXTURES = Path(__file__).parent / "fixtures"
IMPSNS = (
    "CREATE STREAM impsns (campaign text, user_id bigint, price numeric(12,4), "
    "t timestamptz) WITH (event_time = 't')"
)
SECTIONS = (
    "parallelism",
    "partial_query",
    "view_query",
    "reduce_query",
    "reduce_statement",
    "create_statements",
    "serial_statements",
)


def sources() -> dict[str, RawStreamPlan]:
    raw = rewrite(IMPSNS, {})
    assert isinstance(raw, RawStreamPlan)
    return {"impsns": raw}


def _sections(text: str) -> dict[str, str]:
    parts = re.split(r"^-- (\w+)\n", text, flags=re.M)
    return {parts[i]: parts[i + 1].strip() for i in range(1, len(parts), 2)}


def _render(
    plan: ParallelAggregatePlan | SerialAggregatePlan | ReadJoinStreamPlan | ReadUnionStreamPlan,
) -> dict[str, str]:
    """The sections of a plan, in SECTIONS order: each kind renders the parts it has."""
    parts = {
        "parallelism": f"{plan.parallelism.value}: {plan.parallelism_reason}",
        "view_query": plan.view_query + ";",
        "create_statements": "\n".join(s + ";" for s in plan.create_statements),
    }
    if isinstance(plan, ReadJoinStreamPlan | ReadUnionStreamPlan):
        pass
    elif isinstance(plan, ParallelAggregatePlan):
        parts |= {
            "partial_query": plan.partial_query + ";",
            "reduce_query": plan.reduce_query + ";",
            "reduce_statement": plan.reduce_statement + ";",
        }
    else:
        serial = plan.serial
        statements = (serial.windows_query, serial.delete_statement, serial.insert_statement)
        parts["serial_statements"] = "\n".join(s + ";" for s in statements)
    return {name: parts[name] for name in SECTIONS if name in parts}


@pytest.mark.parametrize("path", sorted((FIXTURES / "rewrite").glob("*.sql")), ids=lambda p: p.stem)
def test_golden_rewrite(path: Path) -> None:
    sections = _sections(path.read_text())
    streams: dict[str, StreamPlan] = dict(sources())
    # Optional: the streams the input is built on, one CREATE STREAM per line, the
    # PostgreSQL tables it joins, one JSON TableSchema per line, and the user functions it
    # calls, one JSON SqlFunction per line.
    for statement in sections.get("sources", "").splitlines():
        made = rewrite(statement, streams)
        streams[made.name] = made
    tables = [TableSchema.from_json(json.loads(t)) for t in sections.get("tables", "").splitlines()]
    functions = [
        SqlFunction.from_json(json.loads(f)) for f in sections.get("functions", "").splitlines()
    ]
    plan = rewrite(
        sections["input"], streams, {t.name: t for t in tables}, {f.name: f for f in functions}
    )
    assert isinstance(
        plan,
        ParallelAggregatePlan | SerialAggregatePlan | ReadJoinStreamPlan | ReadUnionStreamPlan,
    )
    rendered = _render(plan)
    if os.environ.get("STRATA_UPDATE_GOLDENS"):
        text = f"-- sources\n{sections['sources']}\n" if "sources" in sections else ""
        text += f"-- tables\n{sections['tables']}\n" if "tables" in sections else ""
        text += f"-- functions\n{sections['functions']}\n" if "functions" in sections else ""
        text += f"-- input\n{sections['input']}\n"
        text += "".join(f"-- {name}\n{text}\n" for name, text in rendered.items())
        path.write_text(text)
    expected = {name: text for name, text in sections.items() if name in SECTIONS}
    assert list(expected) == list(rendered), f"{path.name}: the sections differ"
    for name, text in rendered.items():
        assert text == expected[name], f"{path.name}: section {name} differs"


def _error_cases() -> list[tuple[str, str]]:
    text = (FIXTURES / "rewrite_errors.sql").read_text()
    cases = re.findall(r"^-- case\n(.*?)\n-- error\n(.*?)\n", text, flags=re.M | re.S)
    assert len(cases) >= 20
    return cases


@pytest.mark.parametrize("statement,fragment", _error_cases())
def test_rewrite_errors_say_what_is_wrong(statement: str, fragment: str) -> None:
    with pytest.raises(StrataError) as caught:
        rewrite(statement, sources())
    assert fragment in str(caught.value)


def test_raw_stream_plan() -> None:
    plan = sources()["impsns"]
    assert [c.name for c in plan.columns] == ["campaign", "user_id", "price", "t"]
    assert plan.event_time == "t"
    assert plan.create_statements == (
        'CREATE TABLE "strata_internal"."impsns__raw" ("campaign" TEXT COLLATE "C", '
        '"user_id" BIGINT, "price" DECIMAL(12, 4), "t" TIMESTAMPTZ NOT NULL, '
        '"strata_run" BIGINT NOT NULL)',
        'CREATE INDEX impsns__raw_runs ON "strata_internal"."impsns__raw" USING brin(strata_run)',
        'CREATE VIEW "public"."impsns" AS SELECT "campaign", "user_id", "price", "t" '
        'FROM "strata_internal"."impsns__raw"',
    )


def test_plans_are_immutable_and_deterministic() -> None:
    text = (FIXTURES / "rewrite" / "count_per_campaign.sql").read_text()
    statement = _sections(text)["input"]
    first = rewrite(statement, sources())
    assert first == rewrite(statement, sources())
    with pytest.raises(FrozenInstanceError):
        first.name = "other"  # type: ignore[misc]


def test_integer_division_is_integer_division_in_spark() -> None:
    plan = rewrite(
        "CREATE STREAM d AS SELECT user_id / 2 AS half, count(*) AS c "
        "FROM TUMBLE(impsns, t, INTERVAL '1 minute') GROUP BY user_id / 2, window_end",
        sources(),
    )
    assert isinstance(plan, ParallelAggregatePlan)
    assert "`user_id` DIV 2" in plan.partial_query


def test_an_aggregate_over_a_join_is_a_join_stream_and_an_aggregate_over_it() -> None:
    streams: dict[str, StreamPlan] = dict(sources())
    other = rewrite(
        "CREATE STREAM camp (campaign text, owner text, t timestamptz) WITH (event_time = 't')",
        streams,
    )
    streams[other.name] = other
    statement = (
        "CREATE STREAM spend AS SELECT c.owner, sum(i.price) AS revenue, window_end AS t "
        "FROM TUMBLE(impsns, t, INTERVAL '1 minute') i JOIN camp c ON c.campaign = i.campaign "
        "GROUP BY c.owner, window_end"
    )
    rows = companion(statement, streams)
    assert rows == (
        "spend",
        "spend__rows",
        'CREATE STREAM spend__rows AS SELECT i.t AS "i__t", c.owner AS "c__owner", '
        "i.price AS \"i__price\" FROM TUMBLE(impsns, t, INTERVAL '1 MINUTE') AS i "
        "JOIN camp AS c ON c.campaign = i.campaign",
    )
    with pytest.raises(StrataError, match="spend__rows"):
        rewrite(statement, streams)  # the server makes the join stream first
    joined = rewrite(rows[2], streams)
    streams[joined.name] = joined
    plan = rewrite(statement, streams)
    assert isinstance(plan, ParallelAggregatePlan)
    assert plan.source == "spend__rows"
    # Reduced windows read as they are kept; the others merge the join's partials on read.
    view = sqlglot.parse_one(plan.view_query, read="postgres")
    union = view.find(sqlglot.exp.Union)
    assert union is not None
    reduced, merged = (part.sql("postgres").lower() for part in (union.this, union.expression))
    assert reduced.startswith(
        'select key_0 as "owner", final_0 as "revenue", window_end as "t", '
        'c.window_start as "strata$window_start", true as "strata$stored" '
        'from "strata_internal"."spend__reduced"'
    )
    assert merged.startswith(
        'select key_0 as "owner", cast(sum(agg_0_sum) as decimal) as "revenue", '
        'window_start + interval \'1 minute\' as "t", window_start as "strata$window_start", '
        'false as "strata$stored" from (select w.window_start, u.key_0, u.agg_0_sum from '
        '"strata_internal".strata_waiting_spend_'
    )
    assert 'join "strata_internal"."spend__partial" as u on u.window_start = w.window_start' in (
        merged
    )
