"""`make bench-smoke`: every benchmark of bench/ at tiny scale through bench/run.py, with the
reports it writes (JSON per benchmark, Markdown table, PNG chart, README section) written
into a temporary dir, never into the repository."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import run as runner
from bench.harness.results import Result

ROOT = Path(__file__).resolve().parent.parent
# Benchmarks only the slow tests smoke (test_bench_smoke_of_the_rest): clusters (bench/ha.py,
# bench/scaleout.py, bench/elastic.py), pgbench (bench/pgwire.py), Spark Structured Streaming
# (bench/peer_sss.py), the sustained ingest (bench/sustained.py, minutes of a server), the
# change feed's subscribers (bench/feed.py; tests/test_feed*.py prove the feed in CI), and,
# to keep CI within its time, the workloads whose paths CI's tests already prove: Nexmark
# (tests/test_nexmark.py), HiBench, ALTER, COPY formats and serial streams.
REST = (
    "ha",
    "scaleout",
    "elastic",
    "pgwire",
    "peer_sss",
    "sustained",
    "feed",
    "nexmark",
    "hibench",
    "alter",
    "copy_format",
    "serial",
)
# The documentation page whose table `make bench` rewrites (the README links to it).
README = ROOT / "docs" / "benchmarks.md"


def test_discovery_and_the_readme_section(tmp_path: Path) -> None:
    assert {"ingest", "reduce", "backfill", "joins", "pgwire", "dashboard"} <= set(
        runner.discover()
    )
    assert not {"run", "__init__", "harness"} & set(runner.discover())
    (tmp_path / "helper.py").write_text("def helper() -> None: ...\n")
    (tmp_path / "mine.py").write_text("def benchmark(scale: str) -> list: ...\n")
    assert runner.discover(tmp_path) == ["mine"]
    # The README has the section `make bench` rewrites, and only the section changes.
    text = README.read_text()
    assert runner.START in text and runner.END in text
    replaced = runner.replace_section(text, "| new table |\n")
    before, after = text.split(runner.START)[0], text.split(runner.END)[1]
    assert replaced == before + runner.START + "\n| new table |\n" + runner.END + after
    with pytest.raises(ValueError):
        runner.replace_section("no markers", "x")


def test_a_benchmark_run_alone_keeps_the_others_rows(tmp_path: Path) -> None:
    """`--only` writes one benchmark's results; the table and the chart also show the other
    benchmarks' last results at the same scale, and the heading dates them."""

    def outcome(name: str, scale: str, day: str) -> runner.Outcome:
        figure = Result(f"{name} figure", 2.0, 4.0, "baseline", "s", "lower", context={"n": 1})
        return runner.Outcome(name, scale, f"{day}T10:00:00+00:00", 1.5, [figure])

    alpha, gamma = outcome("alpha", "full", "2026-01-01"), outcome("gamma", "smoke", "2026-01-01")
    runner.write([alpha], "full", tmp_path, None)
    (tmp_path / "gamma.json").write_text(json.dumps(gamma.to_dict()))
    saved = (tmp_path / "alpha.json").read_text()
    assert runner.load(tmp_path / "alpha.json") == alpha

    kept = runner.earlier(tmp_path, ["alpha", "gamma", "delta"], "full")
    assert kept == [alpha]  # gamma is of another scale, delta never ran
    summary = runner.write([outcome("beta", "full", "2026-02-02")], "full", tmp_path, None, kept)
    assert "Scale `full`, 2026-01-01; beta: 2026-02-02, " in summary
    assert "| alpha | alpha figure |" in summary and "| beta | beta figure |" in summary
    assert "gamma" not in summary
    assert (tmp_path / "alpha.json").read_text() == saved


def test_the_readme_table_is_the_saved_results() -> None:
    """The committed results (bench/results/<name>.json) make the table of summary.md and of
    the README's section."""
    results = runner.BENCH / "results"
    shown = runner.earlier(results, runner.discover(), "full")
    summary = (results / "summary.md").read_text()
    assert runner.table(shown, "full") == summary
    assert runner.START + "\n" + summary + runner.END in README.read_text()


@pytest.mark.e2e
@pytest.mark.slow  # 79 s: out of CI, which stays within its 30 minutes (dev.py test --slow)
@pytest.mark.timeout(1800)
def test_bench_smoke(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(README.read_text())
    out = tmp_path / "results"
    command = [sys.executable, "-m", "bench.run", "--scale", "smoke", "--out", str(out)]
    # Flink's peer (its own environment, ~850 MB installed on first use, and a JVM more) and
    # the benchmarks that start clusters, pgbench or Spark Structured Streaming take more
    # than CI's share: test_flink_peer_smoke and test_bench_smoke_of_the_rest run them with
    # the slow tests (tests/test_ha.py and tests/test_cluster.py prove those paths in CI).
    command += ["--skip", "peer_flink", *REST]
    done = subprocess.run(
        [*command, "--readme", str(readme)], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-5000:]

    names = sorted(path.stem for path in out.glob("*.json"))  # one per benchmark run
    assert {"ingest", "reduce", "backfill", "joins", "dashboard"} <= set(names)
    assert not {"peer_flink", *REST} & set(names)
    for name in names:
        result = json.loads((out / f"{name}.json").read_text())
        assert result["benchmark"] == name and result["scale"] == "smoke"
        assert result["error"] is None and result["figures"], result
        for figure in result["figures"]:
            assert figure["value"] >= 0 and figure["baseline"] >= 0, figure
            if figure["baseline"]:  # a count of rows lost may be 0 on both sides: no ratio
                ratio = figure["value"] / figure["baseline"]
                assert figure["ratio"] == pytest.approx(ratio, 1e-3)
            assert figure["better"] in ("higher", "lower") and figure["unit"]
        assert any(figure["ratio"] for figure in result["figures"]), result
    summary = (out / "summary.md").read_text()
    assert "| benchmark | figure |" in summary and "Scale `smoke`" in summary
    assert all(f"| {name} |" in summary for name in names)
    assert (out / "summary.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The copy's section holds the table; the repository's README is untouched.
    assert summary in readme.read_text()
    assert "Scale `smoke`" not in README.read_text()


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_bench_smoke_of_the_rest(tmp_path: Path) -> None:
    """The benchmarks CI's smoke leaves out (REST), at tiny scale through bench/run.py:
    every figure measured."""
    out = tmp_path / "results"
    command = [sys.executable, "-m", "bench.run", "--scale", "smoke", "--out", str(out)]
    done = subprocess.run([*command, "--only", *REST], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-5000:]
    for name in REST:
        result = json.loads((out / f"{name}.json").read_text())
        assert result["error"] is None and result["figures"], result
        assert all(f["value"] >= 0 and f["baseline"] >= 0 for f in result["figures"]), result
    # The sustained run's curve goes beside its figures.
    assert (out / "sustained.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_flink_peer_smoke(tmp_path: Path) -> None:
    """bench/peer_flink.py at tiny scale through bench/run.py: every workload in both engines,
    Strata exact, Flink missing the rows behind its watermark and none of HiBench's."""
    out = tmp_path / "results"
    command = [sys.executable, "-m", "bench.run", "--scale", "smoke", "--out", str(out)]
    done = subprocess.run(
        [*command, "--only", "peer_flink"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-5000:]
    result = json.loads((out / "peer_flink.json").read_text())
    assert result["error"] is None, result
    figures = result["figures"]
    # workloads: throughput (wall, net) and rows missing; 3 queries: throughput, rows missing
    assert len(figures) == 3 * 6 + 2 * 3
    for figure in figures:
        assert figure["baseline_name"].startswith("Apache Flink SQL")
        if figure["unit"] == "rows":
            assert figure["value"] == 0, figure  # Strata misses nothing
            if not figure["figure"].startswith("Nexmark"):  # Flink only the late rows
                assert (figure["baseline"] > 0) == ("late" in figure["figure"]), figure
        else:
            assert figure["value"] > 0 and figure["baseline"] > 0, figure
