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
# Streams built on queries that do not select their event time (q2 a selection, q3 a join):
# windowed by the event time each keeps unshown, equal to their batch queries too.
BUILT_ON = {
    "q2_minutes": (
        "CREATE STREAM q2_minutes AS SELECT count(*) AS bids, sum(price) AS total, "
        "window_start FROM TUMBLE(q2, INTERVAL '1 minute') GROUP BY window_start",
        "SELECT count(*), sum(price), date_bin('1 minute', date_time, timestamptz 'epoch') "
        "FROM bid WHERE mod(auction, 123) = 0 GROUP BY 3",
    ),
    "q3_states": (
        "CREATE STREAM q3_states AS SELECT state, count(*) AS auctions, window_start "
        "FROM TUMBLE(q3, INTERVAL '10 minutes') GROUP BY state, window_start",
        "SELECT p.state, count(*), date_bin('10 minutes', a.date_time, timestamptz 'epoch') "
        "FROM auction a JOIN person p ON a.seller = p.id WHERE a.category = 10 "
        "AND p.state IN ('OR', 'ID', 'CA') GROUP BY 1, 3",
    ),
}
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
            pairs = [(q.name, q.view, q.batch) for q in nexmark_queries.QUERIES]
            pairs += [(name, f"SELECT * FROM {name}", b) for name, (_, b) in BUILT_ON.items()]
            for name, view, batch in pairs:
                if name in self.refused:
                    continue
                got = canonical(connection.execute(view).fetchall())  # type: ignore[arg-type]
                want = canonical(connection.execute(batch).fetchall())  # type: ignore[arg-type]
                self.checks.setdefault(name, []).append((len(got), len(want), got == want))


@pytest.fixture(scope="module")
def nexmark(module_strata: Strata) -> Iterator[Outcome]:
    strata = module_strata
    outcome = Outcome(strata)
    for statement in nexmark_queries.side_input_statements():
        execute(strata, statement)
    for stream in nexmark_streams.STREAMS:
        strata.create(nexmark_streams.create_statement(stream))
    made = [(q.name, q.streams) for q in nexmark_queries.QUERIES]
    made += [(name, (statement,)) for name, (statement, _) in BUILT_ON.items()]
    for name, statements in made:
        for statement in statements:
            response = strata.client.post("/streams", json={"sql": statement})
            if response.status_code != 201:
                outcome.refused[name] = response.json().get("error", response.text)
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


@pytest.mark.parametrize("name", sorted(BUILT_ON))
def test_streams_built_on_queries_without_their_event_time(nexmark: Outcome, name: str) -> None:
    assert name not in nexmark.refused, f"{name} refused: {nexmark.refused[name]}"
    assert all(equal for _, _, equal in nexmark.checks[name]), nexmark.checks[name]
    assert nexmark.checks[name][-1][1] > 0
