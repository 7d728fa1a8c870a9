"""The 24 Nexmark queries (bench.harness.nexmark_queries) as Strata streams over person,
auction and bid (bench.harness.nexmark_streams), fed in shuffled runs of which a third
arrive hours late: each view equals the same query run as a batch over the raw streams,
half-way through the runs and after the last one, with the reducer folding meanwhile."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import psycopg
import pytest

from bench.harness import nexmark_queries, nexmark_streams
from bench.harness.data import HOUR_MS
from server.workers.reducer import Reducer
from tests.conftest import Strata
from tests.oracle import canonical, execute

EVENTS, RUN_EVENTS = 2_500, 250
WORKLOAD = nexmark_streams.generate(
    EVENTS, RUN_EVENTS, seed=23, late=0.3, span_ms=HOUR_MS // 3, jitter_ms=HOUR_MS // 12
)


@dataclass
class Outcome:
    """What happened to each query: why it could not be created, and its view's rows
    against the batch query's at each check."""

    strata: Strata
    refused: dict[str, str] = field(default_factory=dict)
    checks: dict[str, list[tuple[int, int, bool]]] = field(default_factory=dict)

    def check(self) -> None:
        """Every created query's view against its batch twin, in one snapshot."""
        with psycopg.connect(self.strata.database_url) as connection:
            connection.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            for query in nexmark_queries.QUERIES:
                if query.name in self.refused:
                    continue
                got = canonical(connection.execute(query.view).fetchall())  # type: ignore[arg-type]
                want = canonical(connection.execute(query.batch).fetchall())  # type: ignore[arg-type]
                self.checks.setdefault(query.name, []).append((len(got), len(want), got == want))


@pytest.fixture(scope="module")
def nexmark(module_strata: Strata) -> Iterator[Outcome]:
    strata = module_strata
    outcome = Outcome(strata)
    for statement in nexmark_queries.side_input_statements():
        execute(strata, statement)
    for stream in nexmark_streams.STREAMS:
        strata.create(nexmark_streams.create_statement(stream))
    for query in nexmark_queries.QUERIES:
        for statement in query.streams:
            response = strata.client.post("/streams", json={"sql": statement})
            if response.status_code != 201:
                outcome.refused[query.name] = response.json().get("error", response.text)
                break
    reducer = Reducer(strata.service.engine, strata.service.plans, min_rows=1, max_groups=3)
    runs = WORKLOAD.runs
    for n, run in enumerate(runs):
        strata.ingest(run.stream, run.body, csv=True)
        if n % 4 == 3:
            reducer.run_once()
        if n == len(runs) // 2:
            outcome.check()
    outcome.check()
    yield outcome


def test_the_workload_is_nexmarks_mix_with_late_runs() -> None:
    people = WORKLOAD.rows(nexmark_streams.PERSON)
    auctions = WORKLOAD.rows(nexmark_streams.AUCTION)
    assert (people, auctions, WORKLOAD.events - people - auctions) == (50, 150, 2_300)
    late = [n for n, run in enumerate(WORKLOAD.runs) if run.late]
    assert len(late) >= 6 and late != list(range(len(WORKLOAD.runs) - len(late), len(late)))
    again = nexmark_streams.generate(
        EVENTS, RUN_EVENTS, seed=23, late=0.3, span_ms=HOUR_MS // 3, jitter_ms=HOUR_MS // 12
    )
    assert again == WORKLOAD


@pytest.mark.parametrize("query", nexmark_queries.QUERIES, ids=lambda q: q.name)
def test_query_equals_its_batch_under_late_runs(
    nexmark: Outcome, query: nexmark_queries.Query
) -> None:
    assert query.name not in nexmark.refused, f"{query.name} refused: {nexmark.refused[query.name]}"
    checks = nexmark.checks[query.name]
    assert len(checks) == 2
    for got, want, equal in checks:
        assert equal, f"{query.name}: the view has {got} rows, the batch query {want}"
    assert checks[-1][1] > 0, f"{query.name}: the workload gives the query no rows to check"
