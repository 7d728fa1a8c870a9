"""Benchmark of the reducer: query time of a consolidating view before and after reduction.

    python -m bench.reduce [--groups 1000] [--late-fraction 0.2] [--runs 50] [--repeat 5]
                           [--keep]

The figure (from the issue): the query time of a consolidating view over one day of
1-minute windows x ``--groups`` groups with late data spread over ``--runs`` runs, before
reduction, after reduction, and against the same query over a fully reduced plain table
(one row per window x group) measured in the same run. The ratio after reduction is the
figure.

What it does, in one process:

1. starts an embedded PostgreSQL in a temporary dir (or uses ``STRATA_DATABASE_URL`` when
   set) and applies the migrations (SQL functions, internal schema;
   bench.harness.database);
2. plans the raw stream ``impsns`` and the derived stream ``impsn_stats`` (1-minute count,
   revenue, average and maximum price per campaign) with the rewriter, and executes the
   derived stream's create statements (partial archive, its index, the view); the stream is
   not registered in the catalog, so no reducer of a running server would touch it;
3. fills the partial archive with synthetic partial rows (seeded), as Spark would have
   written them: each run covers 1/``--runs`` of the day, so every (window, group) has an
   on-time partial row from the run covering its minute (two when a run boundary falls
   inside the minute); ``--late-fraction`` of the (window, group)s also get 1..3 extra
   partial rows from distinct later runs (late data). States are consistent: count, sum,
   avg's (sum, count), max, of 1..20 events each;
4. baseline: ``CREATE TABLE plain_stats AS SELECT * FROM impsn_stats`` (one row per window
   x group, final values) with an index on (t, campaign), like the archive's on
   (window_start, key_0); VACUUM ANALYZE everything;
5. times three queries (``--repeat`` times each after one untimed warm-up run; median and
   min): Q1 an aggregate over everything, Q2 one hour of one campaign, Q3 the top 10
   campaigns by revenue over the last 3 hours; against the view before reduction, the view
   after reduction (the plan's reduce statement, min_rows=0, until it folds nothing; then
   VACUUM ANALYZE as autovacuum would), and the plain table;
6. Q2/Q3 filter on the view's ``t`` (= window_start + 1 minute): the script shows how the
   archive is scanned for them (EXPLAIN), and times "what if" variants Q2w/Q3w, the same
   queries with the range also written on window_start inside the view's query;
7. checks that every query gives identical results on the view before and after reduction
   and on the plain table, that the view equals the plain table after reduction, and that
   the reduction left one partial row per (window, group); exits non-zero otherwise.

Prints the data shape, a table and one JSON line with the medians (ms) and the ratios
view_after/plain and view_before/plain per query.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from bench.harness.database import Measurement, measure, scalar, scratch_database
from bench.harness.errors import BenchError
from bench.harness.results import Result, check_scale, timed
from rewriter import rewrite
from rewriter.naming import INTERNAL_SCHEMA, consolidated_table, partial_archive_table
from rewriter.plan import ParallelAggregatePlan

RAW_SQL = (
    "CREATE STREAM impsns (campaign text, user_id bigint, price numeric(12,4), t timestamptz) "
    "WITH (event_time='t')"
)
STREAM_SQL = (
    "CREATE STREAM impsn_stats AS SELECT campaign, count(*) AS c, sum(price) AS revenue, "
    "avg(price) AS avg_price, max(price) AS top, window_end AS t "
    "FROM TUMBLE(impsns, t, INTERVAL '1 minute') GROUP BY campaign, window_end"
)
VIEW = "impsn_stats"
PLAIN = "plain_stats"
DAY = datetime(2024, 1, 1, tzinfo=UTC)
WINDOW = timedelta(minutes=1)
WINDOWS = 1440  # one day of 1-minute windows
DAY_SECONDS = 86_400
MAX_LATE_ROWS = 3  # a late (window, group) gets 1..3 extra partial rows
MAX_EVENTS = 20  # events per partial row: 1..20
SEED = 2024
COPY_BATCH = 100_000


# ---- the stream ------------------------------------------------------------------------


def plan_stream() -> ParallelAggregatePlan:
    raw = rewrite(RAW_SQL, {})
    plan = rewrite(STREAM_SQL, {"impsns": raw})
    assert isinstance(plan, ParallelAggregatePlan)
    return plan


def archive_name(plan: ParallelAggregatePlan) -> str:
    return f'"{INTERNAL_SCHEMA}"."{partial_archive_table(plan.name)}"'


def consolidated_name(plan: ParallelAggregatePlan) -> str:
    return f'"{INTERNAL_SCHEMA}"."{consolidated_table(plan.name)}"'


# ---- data ------------------------------------------------------------------------------


@dataclass
class Shape:
    """What was generated."""

    pairs: int = 0  # (window, group)s
    rows: int = 0  # partial rows
    events: int = 0
    straddling_pairs: int = 0  # a run boundary inside the minute: 2 on-time rows
    late_pairs: int = 0
    late_rows: int = 0
    late_events: int = 0
    rows_per_pair: Counter[int] = field(default_factory=Counter)


def _decimal(units: int) -> str:
    """A value in 1/10000 as numeric text."""
    return f"{units // 10_000}.{units % 10_000:04d}"


def _states(rng: random.Random, base: int) -> dict[str, int]:
    """Consistent states of 1..MAX_EVENTS events priced around ``base`` (in 1/10000)."""
    n = rng.randint(1, MAX_EVENTS)
    mean = base * rng.uniform(0.8, 1.2)
    total = round(mean * n)
    if n == 1:
        top = total
    else:
        floor = -(-total // n)  # the maximum is at least the mean
        top = rng.randint(floor, max(floor, min(total, round(mean * 1.5))))
    return {"count": n, "sum": total, "max": top}


def on_time_runs(window: int, runs: int) -> range:
    """The runs (numbered from 1) whose slice of the day overlaps the minute ``window``."""
    first = window * 60 * runs // DAY_SECONDS
    last = ((window + 1) * 60 * runs - 1) // DAY_SECONDS
    return range(first + 1, last + 2)


def partial_rows(
    plan: ParallelAggregatePlan, groups: int, late_fraction: float, runs: int, shape: Shape
) -> Iterator[str]:
    """COPY text lines of the partial archive, in the plan's column order."""
    rng = random.Random(SEED)
    columns = [c for c, _ in plan.partial_columns]
    # state column -> state name ("count", "sum", "max"): avg is (sum, count).
    states = {s.column: s.name for a in plan.aggregates for s in a.states}
    unknown = set(states.values()) - {"count", "sum", "max"}
    if unknown:
        raise BenchError(f"the plan has states this benchmark cannot generate: {unknown}")
    key = next(c for c in columns if c.startswith("key_"))
    starts = [(DAY + w * WINDOW).isoformat(sep=" ") for w in range(WINDOWS)]
    # Only windows before the last run's slice can receive data from a later run; they get
    # a little more often late data so that late_fraction of all (window, group)s do.
    eligible = sum(1 for w in range(WINDOWS) if on_time_runs(w, runs)[-1] < runs)
    p_late = min(1.0, late_fraction * WINDOWS / eligible) if eligible else 0.0
    campaigns = [f"c{g}" for g in range(groups)]
    bases = [2_000 + (g % 97) * 500 for g in range(groups)]  # 0.20 .. 5.00 per event

    def line(run: int, window: int, group: int) -> str:
        drawn = _states(rng, bases[group])
        shape.rows += 1
        shape.events += drawn["count"]
        text = {"strata_run": str(run), "window_start": starts[window], key: campaigns[group]}
        for column, name in states.items():
            text[column] = str(drawn[name]) if name == "count" else _decimal(drawn[name])
        return "\t".join(text[c] for c in columns) + "\n"

    for window in range(WINDOWS):
        on_time = on_time_runs(window, runs)
        later = range(on_time[-1] + 1, runs + 1)
        for group in range(groups):
            shape.pairs += 1
            rows_before = shape.rows
            for run in on_time:
                yield line(run, window, group)
            if len(on_time) > 1:
                shape.straddling_pairs += 1
            if later and rng.random() < p_late:
                events_before = shape.events
                k = rng.randint(1, min(MAX_LATE_ROWS, len(later)))
                for run in sorted(rng.sample(later, k)):
                    yield line(run, window, group)
                shape.late_pairs += 1
                shape.late_rows += k
                shape.late_events += shape.events - events_before
            shape.rows_per_pair[shape.rows - rows_before] += 1


def load_archive(
    conn: psycopg.Connection, plan: ParallelAggregatePlan, args: argparse.Namespace
) -> Shape:
    shape = Shape()
    columns = ", ".join(f'"{c}"' for c, _ in plan.partial_columns)
    rows = partial_rows(plan, args.groups, args.late_fraction, args.runs, shape)
    with conn.cursor().copy(f"COPY {archive_name(plan)} ({columns}) FROM STDIN") as copy:
        batch: list[str] = []
        for row in rows:
            batch.append(row)
            if len(batch) == COPY_BATCH:
                copy.write("".join(batch))
                batch.clear()
        copy.write("".join(batch))
    return shape


# ---- queries ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TimeRange:
    """A range on a timestamp column, e.g. (lo, hi] = TimeRange(">", lo, "<=", hi)."""

    lo_op: str
    lo: datetime
    hi_op: str
    hi: datetime

    def on(self, column: str, shift: timedelta = timedelta(0)) -> str:
        lo, hi = (self.lo + shift).isoformat(sep=" "), (self.hi + shift).isoformat(sep=" ")
        return f"{column} {self.lo_op} '{lo}' AND {column} {self.hi_op} '{hi}'"


@dataclass(frozen=True)
class Query:
    key: str
    title: str
    template: str  # over {rel}
    range: TimeRange | None = None

    def sql(self, rel: str) -> str:
        return self.template.format(rel=rel, t=self.range.on("t") if self.range else "")


HOUR = TimeRange(">=", DAY + timedelta(hours=12), "<", DAY + timedelta(hours=13))
LAST_3_HOURS = TimeRange(">", DAY + timedelta(hours=21), "<=", DAY + timedelta(hours=24))
QUERIES = [
    Query("Q1", "full scan aggregate", "SELECT count(*), sum(c), sum(revenue) FROM {rel}"),
    Query(
        "Q2",
        "1 hour of 1 campaign",
        "SELECT * FROM {rel} WHERE campaign = 'c42' AND {t} ORDER BY t",
        HOUR,
    ),
    Query(
        "Q3",
        "top 10 campaigns, last 3 h",
        "SELECT campaign, sum(revenue) AS revenue FROM {rel} WHERE {t} "
        "GROUP BY campaign ORDER BY revenue DESC, campaign LIMIT 10",
        LAST_3_HOURS,
    ),
]


@dataclass
class Explained:
    outline: str  # the plan's nodes, outermost first
    scans: list[str]  # how the table of interest is read, with conditions and filters
    window_start_cond: bool  # an index condition on window_start


AGGREGATE_STRATEGIES = {"Sorted": "GroupAggregate", "Hashed": "HashAggregate"}


def explain(conn: psycopg.Connection, sql: str, table: str) -> Explained:
    """What EXPLAIN (no ANALYZE) says of ``sql``, and of how it reads ``table``."""
    row = conn.execute(f"EXPLAIN (FORMAT JSON) {sql}").fetchone()  # type: ignore[arg-type]
    assert row is not None
    nodes: list[str] = []
    scans: list[str] = []
    conditions: list[str] = []

    def walk(node: dict[str, Any]) -> None:
        name = node["Node Type"]
        if name == "Aggregate":  # as EXPLAIN's text format names them
            name = AGGREGATE_STRATEGIES.get(node.get("Strategy", ""), name)
            if node.get("Partial Mode", "Simple") != "Simple":
                name = f"{node['Partial Mode']} {name}"
        if node.get("Parallel Aware"):
            name = f"Parallel {name}"
        if "Index Name" in node:
            name += f" ({node['Index Name']})"
        nodes.append(name)
        # Bitmap index scans name their index only, which is named after the table.
        if node.get("Relation Name") == table or node.get("Index Name", "").startswith(table):
            details = [f"{d}: {node[d]}" for d in ("Index Cond", "Filter") if d in node]
            scans.append("; ".join([name, *details]))
            conditions.append(node.get("Index Cond", ""))
        for child in node.get("Plans", []):
            walk(child)

    walk(row[0][0]["Plan"])
    return Explained(
        " > ".join(nodes), scans, any("window_start" in c or "window_end" in c for c in conditions)
    )


@dataclass
class Phase:
    """The timed queries against one relation, in one state."""

    times: dict[str, Measurement]
    plans: dict[str, Explained]


def run_phase(conn: psycopg.Connection, queries: dict[str, str], table: str, repeat: int) -> Phase:
    return Phase(
        {key: measure(conn, sql, repeat) for key, sql in queries.items()},
        {key: explain(conn, sql, table) for key, sql in queries.items()},
    )


def view_queries(plan: ParallelAggregatePlan) -> dict[str, str]:
    """Q1..Q3 over the view."""
    return {q.key: q.sql(VIEW) for q in QUERIES}


# ---- the run ---------------------------------------------------------------------------


def size_mb(conn: psycopg.Connection, relation: str) -> float:
    return scalar(conn, f"SELECT pg_total_relation_size('{relation}')") / 1e6


def reduce_all(conn: psycopg.Connection, plan: ParallelAggregatePlan) -> tuple[int, int]:
    """The reducer's statement until it folds nothing; returns (groups folded, passes)."""
    params = {"min_rows": 0, "max_groups": 1_000_000_000}
    folded = passes = 0
    while True:
        passes += 1
        n = conn.execute(plan.reduce_statement, params).rowcount  # type: ignore[arg-type]
        folded += n
        if n == 0:
            return folded, passes


def check_absent(conn: psycopg.Connection, plan: ParallelAggregatePlan) -> None:
    for relation in (VIEW, PLAIN, archive_name(plan)):
        if scalar(conn, f"SELECT to_regclass('{relation}')") is not None:
            raise BenchError(f"{relation} already exists in this database; not touching it")


def drop_all(conn: psycopg.Connection, plan: ParallelAggregatePlan) -> None:
    conn.execute(f"DROP TABLE IF EXISTS {PLAIN}")
    for statement in plan.drop_statements:
        conn.execute(statement)  # type: ignore[arg-type]


def verify(
    conn: psycopg.Connection,
    plan: ParallelAggregatePlan,
    shape: Shape,
    before: Phase,
    after: Phase,
    plain: Phase,
) -> list[str]:
    """What is wrong (empty when all is right); run after the reduction."""
    problems: list[str] = []
    for key, reference in plain.times.items():
        for label, phase in (("before", before), ("after", after)):
            # repr: identical values, numeric scales included
            if repr(phase.times[key].result) != repr(reference.result):
                problems.append(f"{key}: the view {label} reduction differs from {PLAIN}")
    differ = scalar(
        conn,
        f"SELECT count(*) FROM ((TABLE {VIEW} EXCEPT ALL TABLE {PLAIN}) "
        f"UNION ALL (TABLE {PLAIN} EXCEPT ALL TABLE {VIEW})) d",
    )
    if differ:
        problems.append(f"after reduction, {VIEW} and {PLAIN} differ in {differ} rows")
    left = scalar(conn, f"SELECT count(*) FROM {archive_name(plan)}")
    if left:
        problems.append(f"{left:,} partial rows left unreduced after reduction")
    rows = scalar(conn, f"SELECT count(*) FROM {consolidated_name(plan)}")
    if rows != shape.pairs:
        problems.append(f"{rows:,} consolidated rows after reduction, expected {shape.pairs:,}")
    return problems


def run(args: argparse.Namespace) -> int:
    return run_benchmark(args)[0]


def run_benchmark(args: argparse.Namespace) -> tuple[int, list[Result]]:
    """The benchmark; returns its exit code and its figures (one per query)."""
    plan = plan_stream()
    archive = archive_name(plan)
    table = partial_archive_table(plan.name)  # as EXPLAIN names it
    problems: list[str] = []
    results: list[Result] = []
    try:
        with (
            scratch_database("strata-bench-reduce-", keep=args.keep) as database,
            psycopg.connect(database.url, autocommit=True) as conn,
        ):
            check_absent(conn, plan)
            for statement in plan.create_statements:
                conn.execute(statement)  # type: ignore[arg-type]  # may contain '%': no params
            steps: dict[str, float] = {}

            shape, steps["load"] = timed(lambda: load_archive(conn, plan, args))
            conn.execute(f"VACUUM ANALYZE {archive}")
            _, steps["plain"] = timed(
                lambda: (
                    conn.execute(f"CREATE TABLE {PLAIN} AS SELECT * FROM {VIEW}"),
                    conn.execute(f"CREATE INDEX {PLAIN}_window ON {PLAIN} (t, campaign)"),
                    conn.execute(f"VACUUM ANALYZE {PLAIN}"),
                )
            )
            counted = conn.execute(f"SELECT count(*), sum(c) FROM {PLAIN}").fetchone()
            if counted != (shape.pairs, shape.events):
                raise BenchError(
                    f"the view before reduction: (count(*), sum(c)) = {counted}, "
                    f"expected {(shape.pairs, shape.events)}"
                )
            sizes = {"archive before": size_mb(conn, archive), "plain": size_mb(conn, PLAIN)}

            before = run_phase(conn, view_queries(plan), table, args.repeat)
            (folded, passes), steps["reduce"] = timed(lambda: reduce_all(conn, plan))
            _, steps["vacuum"] = timed(
                lambda: (
                    conn.execute(f"VACUUM ANALYZE {archive}"),
                    conn.execute(f"VACUUM ANALYZE {consolidated_name(plan)}"),
                )
            )
            sizes["archive after"] = size_mb(conn, archive) + size_mb(conn, consolidated_name(plan))
            after = run_phase(conn, view_queries(plan), consolidated_table(plan.name), args.repeat)
            plain = run_phase(conn, {q.key: q.sql(PLAIN) for q in QUERIES}, PLAIN, args.repeat)
            problems = verify(conn, plan, shape, before, after, plain)

            settings = ", ".join(
                f"{name}={scalar(conn, f'SHOW {name}')}"
                for name in ("work_mem", "shared_buffers", "max_parallel_workers_per_gather")
            )
            report(
                args,
                Report(
                    shape=shape,
                    before=before,
                    after=after,
                    plain=plain,
                    sizes=sizes,
                    steps=steps,
                    folded=folded,
                    passes=passes,
                    server=f"PostgreSQL {scalar(conn, 'SHOW server_version')}, "
                    f"JIT available: {scalar(conn, 'SELECT pg_jit_available()')}, {settings}, "
                    f"{os.cpu_count()} CPUs",
                ),
            )
            results = figures(args, before, after, plain, steps["reduce"])
            if problems:
                print("\nWRONG:\n  " + "\n  ".join(problems), file=sys.stderr)
            if database.external and not args.keep:
                drop_all(conn, plan)
    except BenchError as err:
        print(f"benchmark failed: {err}", file=sys.stderr)
        problems.append(str(err))
    return 1 if problems else 0, results


def figures(
    args: argparse.Namespace, before: Phase, after: Phase, plain: Phase, reduce_s: float
) -> list[Result]:
    """The view after reduction against the plain table, per query (medians)."""
    return [
        Result(
            f"view query after reduction: {q.title}",
            after.times[q.key].median_ms,
            plain.times[q.key].median_ms,
            "the same query over a plain table of the final values",
            "ms",
            "lower",
            notes=f"{WINDOWS} 1-minute windows x {args.groups:,} groups, {args.runs} runs",
            context={
                "view_before_reduction_ms": round(before.times[q.key].median_ms, 3),
                "view_after_reduction_ms": round(after.times[q.key].median_ms, 3),
                "plain_ms": round(plain.times[q.key].median_ms, 3),
                "reduce_seconds": round(reduce_s, 2),
            },
        )
        for q in QUERIES
    ]


# ---- report ----------------------------------------------------------------------------


@dataclass
class Report:
    shape: Shape
    before: Phase
    after: Phase
    plain: Phase
    sizes: dict[str, float]
    steps: dict[str, float]
    folded: int
    passes: int
    server: str


def describe_shape(shape: Shape, groups: int, runs: int) -> list[str]:
    per_pair = ", ".join(
        f"{n}: {count:,} ({count / shape.pairs:.1%})"
        for n, count in sorted(shape.rows_per_pair.items())
    )
    return [
        f"{WINDOWS} windows x {groups:,} groups = {shape.pairs:,} (window, group)s, "
        f"{shape.events:,} events, {runs} runs",
        f"partial rows before reduction: {shape.rows:,} "
        f"({shape.rows / shape.pairs:.3f} per (window, group))",
        f"  on time: {shape.rows - shape.late_rows:,} (one per (window, group) from the run "
        f"covering its minute; {shape.straddling_pairs:,} (window, group)s straddle a run "
        "boundary and have two)",
        f"  late: {shape.late_rows:,} rows for {shape.late_pairs:,} (window, group)s "
        f"({shape.late_pairs / shape.pairs:.1%}), 1..{MAX_LATE_ROWS} each from distinct later "
        f"runs, carrying {shape.late_events / shape.events:.1%} of the events",
        f"partial rows per (window, group): {per_pair}",
        f"partial rows after reduction: {shape.pairs:,} (one per (window, group))",
    ]


def ratio(a: float, b: float) -> float:
    return round(a / b, 2) if b else float("nan")


def report(args: argparse.Namespace, r: Report) -> None:
    print("data:")
    for line in describe_shape(r.shape, args.groups, args.runs):
        print("  " + line)
    print(f"  loaded by COPY in {r.steps['load']:.1f}s; {PLAIN} built in {r.steps['plain']:.1f}s")
    print(
        f"  size (heap + indexes): archive {r.sizes['archive before']:.0f} MB before, "
        f"{r.sizes['archive after']:.0f} MB after reduction; {PLAIN} {r.sizes['plain']:.0f} MB"
    )
    print(
        f"reduction: {r.folded:,} (window, group)s folded in {r.steps['reduce']:.1f}s "
        f"({r.passes} statements, min_rows=0), then VACUUM ANALYZE in {r.steps['vacuum']:.1f}s"
    )
    print(f"server: {r.server}")

    plain = dict(r.plain.times)
    titles = {q.key: q.title for q in QUERIES}
    print(f"\nquery times in ms, {args.repeat} runs each after a warm-up run (median / min)")
    head = (
        f"{'query':<34} {'view before':>15} {'view after':>15} {'plain':>15} "
        f"{'after/plain':>11} {'before/plain':>12}"
    )
    print(head)
    print("-" * len(head))
    for key, title in titles.items():
        b, a, p = r.before.times[key], r.after.times[key], plain[key]
        cells = [f"{m.median_ms:7.1f} /{m.min_ms:6.1f}" for m in (b, a, p)]
        print(
            f"{key + ' ' + title:<34} {cells[0]:>15} {cells[1]:>15} {cells[2]:>15} "
            f"{ratio(a.median_ms, p.median_ms):>11.2f} {ratio(b.median_ms, p.median_ms):>12.2f}"
        )

    print("\nplans (EXPLAIN):")
    for key in titles:
        print(f"  {key} view before: {r.before.plans[key].outline}")
        print(f"  {key} view after:  {r.after.plans[key].outline}")
        if key in r.plain.plans:
            print(f"  {key} plain:       {r.plain.plans[key].outline}")
    print("how the view reads the consolidated table for the time ranges (after reduction):")
    for key in titles:
        if key != "Q1":
            for scan in r.after.plans[key].scans:
                print(f"  {key}: {scan}")

    keys = [q.key for q in QUERIES]
    print(
        json.dumps(
            {
                "groups": args.groups,
                "runs": args.runs,
                "late_fraction": args.late_fraction,
                "partial_rows_before": r.shape.rows,
                "partial_rows_after": r.shape.pairs,
                "reduce_s": round(r.steps["reduce"], 2),
                "median_ms": {
                    k: {
                        "view_before": round(r.before.times[k].median_ms, 2),
                        "view_after": round(r.after.times[k].median_ms, 2),
                        "plain": round(plain[k].median_ms, 2),
                    }
                    for k in titles
                },
                "ratio_after_plain": {
                    k: ratio(r.after.times[k].median_ms, plain[k].median_ms) for k in keys
                },
                "ratio_before_plain": {
                    k: ratio(r.before.times[k].median_ms, plain[k].median_ms) for k in keys
                },
                "window_index_cond": {
                    k: r.after.plans[k].window_start_cond for k in titles if k != "Q1"
                },
            }
        )
    )


# The arguments of each scale of bench/run.py (full: the defaults, the README's figures).
SCALES = {"smoke": ["--groups", "43", "--runs", "5", "--repeat", "2"], "full": []}  # c42: Q2


def benchmark(scale: str) -> list[Result]:
    """bench/run.py's entry (see bench.harness.results)."""
    logging.basicConfig(level=logging.WARNING)
    code, results = run_benchmark(_parser().parse_args(SCALES[check_scale(scale)]))
    if code:
        raise BenchError("the reduce benchmark failed (see above)")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.groups <= 0 or args.runs <= 0 or args.repeat <= 0:
        parser.error("--groups, --runs and --repeat must be positive")
    if not 0 <= args.late_fraction <= 1:
        parser.error("--late-fraction must be between 0 and 1")
    logging.basicConfig(level=logging.WARNING)
    return run(args)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--groups", type=int, default=1000, help="campaigns (1000)")
    parser.add_argument(
        "--late-fraction",
        type=float,
        default=0.2,
        help="fraction of the (window, group)s that get late partial rows (0.2)",
    )
    parser.add_argument("--runs", type=int, default=50, help="runs over the day (50)")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per query (5)")
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the data dir (embedded PostgreSQL) or, with STRATA_DATABASE_URL, the tables",
    )
    return parser


if __name__ == "__main__":
    sys.exit(main())
