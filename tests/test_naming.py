"""Derived names fit PostgreSQL's 63-byte identifiers (rewriter/naming.py)."""

from __future__ import annotations

import pytest
import sqlglot
from sqlglot import exp

from rewriter import (
    ParallelAggregatePlan,
    ProjectionStreamPlan,
    RawStreamPlan,
    SerialAggregatePlan,
    StreamPlan,
    naming,
    rewrite,
)


def _longest(prefix: str) -> str:
    return naming.check_stream_name(f"{prefix}_".ljust(naming.MAX_STREAM_NAME, "x"))


RAW = _longest("raw")
PROJECTION = _longest("projection")
PARALLEL = _longest("parallel")
HOP = _longest("hop")
ROLLUP = _longest("rollup")
SERIAL = _longest("serial")
LONGEST_COLUMN = "v" * naming.MAX_IDENTIFIER
STATEMENTS = {
    RAW: f"CREATE STREAM {RAW} (campaign text, {LONGEST_COLUMN} bigint, t timestamptz) "
    "WITH (event_time = 't', retention = '30 days')",
    PROJECTION: f"CREATE STREAM {PROJECTION} AS SELECT campaign, {LONGEST_COLUMN} * 2 AS doubled, "
    f"t FROM {RAW}",
    PARALLEL: f"CREATE STREAM {PARALLEL} AS SELECT campaign, count(*) AS c, "
    f"sum({LONGEST_COLUMN}) AS {LONGEST_COLUMN}, window_end AS t "
    f"FROM TUMBLE({RAW}, t, INTERVAL '1 minute') GROUP BY campaign, window_end",
    HOP: f"CREATE STREAM {HOP} AS SELECT campaign, avg(doubled) AS a, window_start, window_end "
    f"FROM HOP({PROJECTION}, t, INTERVAL '1 minute', INTERVAL '5 minutes') "
    "GROUP BY campaign, window_start, window_end",
    ROLLUP: f"CREATE STREAM {ROLLUP} AS SELECT campaign, sum(c) AS c, window_end AS t "
    f"FROM TUMBLE({PARALLEL}, t, INTERVAL '5 minutes') GROUP BY campaign, window_end",
    SERIAL: f"CREATE STREAM {SERIAL} AS SELECT max(c) AS top, window_end AS t "
    f"FROM TUMBLE({PARALLEL}, t, INTERVAL '1 minute') GROUP BY window_end",
}
KINDS: dict[str, type] = {
    RAW: RawStreamPlan,
    PROJECTION: ProjectionStreamPlan,
    PARALLEL: ParallelAggregatePlan,
    HOP: ParallelAggregatePlan,
    ROLLUP: ParallelAggregatePlan,
    SERIAL: SerialAggregatePlan,
}


def _plans() -> dict[str, StreamPlan]:
    plans: dict[str, StreamPlan] = {}
    for name, statement in STATEMENTS.items():
        plans[name] = rewrite(statement, plans)
        assert isinstance(plans[name], KINDS[name]), name
    return plans


def _created(statement: str) -> tuple[tuple[str, str], list[str]]:
    """The relation (schema, name) a CREATE statement makes, and the columns it gives it."""
    create = sqlglot.parse_one(statement, read="postgres")
    assert isinstance(create, exp.Create), statement
    target = create.this
    if isinstance(target, exp.Index):
        table = target.args["table"]
        return (table.db, target.name), []
    if isinstance(target, exp.Schema):
        return (target.this.db, target.this.name), [c.name for c in target.expressions]
    assert isinstance(target, exp.Table) and isinstance(create.expression, exp.Query)
    return (target.db, target.name), list(create.expression.named_selects)


@pytest.mark.parametrize("stream", list(STATEMENTS), ids=lambda s: s.split("_")[0])
def test_every_name_a_plan_creates_fits_and_is_its_own(stream: str) -> None:
    plan = _plans()[stream]
    relations = []
    for statement in plan.create_statements:
        for identifier in sqlglot.parse_one(statement, read="postgres").find_all(exp.Identifier):
            assert len(identifier.name.encode()) <= naming.MAX_IDENTIFIER, identifier.name
        relation, columns = _created(statement)
        relations.append(relation)
        assert len(set(columns)) == len(columns), f"{relation}: {columns}"
    # Tables, indexes and views share one namespace per schema.
    assert len(set(relations)) == len(relations), relations


def test_fit_keeps_short_names_and_shortens_long_ones_apart() -> None:
    assert naming.fit("impsns__partial_window") == "impsns__partial_window"
    exact = "n" * naming.MAX_IDENTIFIER
    assert naming.fit(exact) == exact
    long_names = [f"{'a' * 60}_{suffix}" for suffix in ("window", "windows", "wind")]
    fitted = [naming.fit(name) for name in long_names]
    assert all(len(name.encode()) == naming.MAX_IDENTIFIER for name in fitted)
    assert len(set(fitted)) == len(fitted)  # PostgreSQL would have cut all three alike
    assert [naming.fit(name) for name in long_names] == fitted
    assert fitted[0].startswith("a" * 54 + "_")
