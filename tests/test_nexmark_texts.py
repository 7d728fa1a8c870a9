"""The Nexmark project's own query texts (bench/nexmark_queries/, nexmark/nexmark's Flink
SQL, only the source DDL, PROCTIME(), q14's Java UDF and q6's invalid SQL adapted),
created as written over its sources (ddl_strata.sql) and fed the shuffled, hours-late
runs of tests/test_nexmark.py: every
text that Strata takes equals the same query as a batch over the raw rows, half-way
through the runs and after the last one, with the reducer folding meanwhile; the others
are refused, each with Strata's reason (bench.harness.nexmark_texts)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import psycopg
import pytest

from bench.harness import nexmark_texts
from server.workers.reducer import Reducer
from tests.conftest import Strata
from tests.oracle import canonical, execute
from tests.test_nexmark import WORKLOAD

pytestmark = pytest.mark.slow  # about 4 minutes: 19 queries over 2,500 events, checked twice


@dataclass
class Outcome:
    strata: Strata
    refused: dict[str, str] = field(default_factory=dict)
    checks: dict[str, list[tuple[int, int, bool]]] = field(default_factory=dict)

    def check(self) -> None:
        with psycopg.connect(self.strata.database_url) as connection:
            connection.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            for query in nexmark_texts.QUERIES:
                if query in self.refused:
                    continue
                view, batch = nexmark_texts.compared(query)
                got = canonical(connection.execute(view).fetchall())  # type: ignore[arg-type]
                want = canonical(connection.execute(batch).fetchall())  # type: ignore[arg-type]
                self.checks.setdefault(query, []).append((len(got), len(want), got == want))


@pytest.fixture(scope="module")
def texts(module_strata: Strata) -> Iterator[Outcome]:
    strata = module_strata
    outcome = Outcome(strata)
    for statement in nexmark_texts.source_statements():
        strata.create(statement)
    for query in nexmark_texts.QUERIES:
        text = nexmark_texts.read(query)
        for statement in text.tables:
            execute(strata, statement)
            execute(strata, nexmark_texts.side_input_rows())
        for statement in text.functions:
            execute(strata, statement)
        if text.refused is not None:
            outcome.refused[query] = text.refused
            continue
        for statement in text.streams:
            response = strata.client.post("/streams", json={"sql": statement})
            if response.status_code != 201:
                outcome.refused[query] = response.json().get("error", response.text)
                break
    reducer = Reducer(strata.service.engine, strata.service.plans, min_rows=1, max_groups=3)
    runs = WORKLOAD.runs
    for n, run in enumerate(runs):
        strata.ingest(run.stream, nexmark_texts.flink_header(run.body), csv=True)
        if n % 4 == 3:
            reducer.run_once()
        if n == len(runs) // 2:
            outcome.check()
    outcome.check()
    yield outcome


def test_the_texts_strata_refuses_are_those_the_planner_refuses(texts: Outcome) -> None:
    planned = nexmark_texts.report()
    assert set(texts.refused) == {q for q, problem in planned.items() if problem}, texts.refused


@pytest.mark.parametrize("query", nexmark_texts.QUERIES)
def test_a_text_taken_as_written_equals_its_batch_under_late_runs(
    texts: Outcome, query: str
) -> None:
    if query in texts.refused:
        pytest.skip(f"refused: {texts.refused[query]}")
    checks = texts.checks[query]
    assert len(checks) == 2
    for got, want, equal in checks:
        assert equal, f"{query}: the view has {got} rows, the batch query {want}"
    assert checks[-1][1] > 0, f"{query}: the workload gives the query no rows to check"
