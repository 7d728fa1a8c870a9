"""Run every benchmark of bench/ and report their figures: `make bench`, `make bench-smoke`.

    python -m bench.run [--scale full|smoke] [--only NAME ...] [--skip NAME ...] [--out DIR]
                        [--readme PATH | --no-readme]

A benchmark is a module of the package bench that defines ``benchmark(scale) ->
list[Result]`` at its top level (bench.harness.results); other modules (this runner) are
skipped, and the harness is a package of its own. A benchmark that fails to import is
reported as failed. Each benchmark runs in turn,
in this process; then the runner writes, into ``--out`` (bench/results, or
bench/results/smoke for the smoke scale):

* ``<name>.json`` per benchmark: each figure with Strata's number, the baseline's (measured
  in the same run) and their ratio, the absolute numbers for context, or the error;
* ``summary.md``: one Markdown table of every figure;
* ``summary.png``: the ratios as a bar chart (matplotlib, Agg backend).

At the full scale it also replaces the part of docs/benchmarks.md between ``<!-- bench:start -->``
and ``<!-- bench:end -->`` with the table (``--readme`` names another file, for tests;
``--no-readme`` leaves it alone). With ``--only`` (or ``--skip``), the table and the chart
also show the other benchmarks as their last run at the same scale left them in ``--out``
(``<name>.json``, dated in the table's heading), so that running one benchmark updates
its rows and keeps the others'. A benchmark that fails does not stop the others; the
runner exits non-zero if any failed.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import re
import sys
import time
import traceback
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from bench.harness.results import OUT_VARIABLE, SCALES, Result, check_scale

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
# The benchmarks page of the documentation site holds the table (docs/, `python3 dev.py docs`).
README = ROOT / "docs" / "benchmarks.md"
START, END = "<!-- bench:start -->", "<!-- bench:end -->"
ENTRY = re.compile(r"^def benchmark\(", re.M)


@dataclass
class Outcome:
    """One benchmark's run."""

    name: str
    scale: str
    started_at: str
    seconds: float = 0.0
    results: list[Result] = field(default_factory=list)
    error: str | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "benchmark": self.name,
            "scale": self.scale,
            "started_at": self.started_at,
            "seconds": round(self.seconds, 1),
            "cpus": os.cpu_count(),
            "figures": [r.to_dict() for r in self.results],
            "error": self.error,
        }


def load(path: Path) -> Outcome:
    """The outcome ``write`` saved as ``path`` (``<name>.json``)."""
    saved = json.loads(path.read_text())
    results = [
        Result(**{k: v for k, v in figure.items() if k != "ratio"}) for figure in saved["figures"]
    ]
    return Outcome(
        saved["benchmark"],
        saved["scale"],
        saved["started_at"],
        saved["seconds"],
        results,
        saved["error"],
    )


def earlier(out: Path, names: list[str], scale: str) -> list[Outcome]:
    """The last outcomes of the benchmarks ``names`` at ``scale`` saved in ``out``, where
    there are some."""
    paths = (out / f"{name}.json" for name in names)
    found = [load(path) for path in paths if path.exists()]
    return [o for o in found if o.scale == scale]


def discover(directory: Path = BENCH) -> list[str]:
    """Modules of ``directory`` that define ``benchmark(...)`` at the top level, by name; read
    as text, so that nothing is imported for nothing."""
    return sorted(
        path.stem
        for path in directory.glob("*.py")
        if path.stem not in ("run", "__init__") and ENTRY.search(path.read_text(errors="replace"))
    )


def run_one(name: str, scale: str) -> Outcome:
    outcome = Outcome(name, scale, datetime.now(UTC).isoformat(timespec="seconds"))
    print(f"\n==== {name} ({scale}) ====", flush=True)
    started = time.monotonic()
    try:
        module = importlib.import_module(f"bench.{name}")
        outcome.results = list(module.benchmark(scale))
        if not outcome.results:
            outcome.error = "the benchmark returned no figures"
    except Exception as error:  # one failing benchmark must not stop the others
        traceback.print_exc()
        outcome.error = f"{type(error).__name__}: {error}"
    outcome.seconds = time.monotonic() - started
    print(f"==== {name}: {'failed' if outcome.error else 'ok'} in {outcome.seconds:.0f}s ====")
    return outcome


# ---- reports -----------------------------------------------------------------------------


def _number(value: float, unit: str) -> str:
    if math.isnan(value):
        return "n/a"
    if unit == "rows/s" or abs(value) >= 1000:
        return f"{value:,.0f} {unit}"
    return f"{value:.3g} {unit}" if abs(value) < 10 else f"{value:.1f} {unit}"


def _ratio(ratio: float) -> str:
    if not math.isfinite(ratio):
        return "n/a"
    return f"{ratio:.2f}" if ratio >= 0.1 else f"{ratio:.2g}"


def table(outcomes: list[Outcome], scale: str) -> str:
    """The Markdown table of every figure (with a line on when, where, and the failures)."""
    dates = {o.name: o.started_at[:10] for o in outcomes}
    when = min(dates.values(), default="")
    others = "".join(f"; {name}: {date}" for name, date in dates.items() if date != when)
    lines = [
        f"Scale `{scale}`, {when}{others}, {os.cpu_count()} CPUs; ratio = Strata / baseline, "
        "both measured in the same run (`make bench` regenerates this table).",
        "",
        "| benchmark | figure | Strata | baseline | ratio | better |",
        "|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        for r in o.results:
            lines.append(
                f"| {o.name} | {r.figure} | {_number(r.value, r.unit)} | {r.baseline_name}: "
                f"{_number(r.baseline, r.unit)} | {_ratio(r.ratio)} | {r.better} |"
            )
        if o.error:
            lines.append(f"| {o.name} | **failed**: {o.error.splitlines()[0]} | | | | |")
    return "\n".join(lines) + "\n"


def chart(outcomes: list[Outcome], scale: str, path: Path) -> None:
    """The ratios as horizontal bars from 1 (the baseline) on a log scale; green where Strata
    is at least as good as the baseline, orange where not."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = [(f"{o.name}: {r.figure}", r) for o in outcomes for r in o.results]
    bars = [(label, r) for label, r in bars if r.ratio > 0 and math.isfinite(r.ratio)]
    figure, axes = plt.subplots(figsize=(10, 1.2 + 0.45 * max(1, len(bars))))
    if bars:
        ratios = [r.ratio for _, r in bars]
        good = [(r.ratio >= 1) == (r.better == "higher") or r.ratio == 1 for _, r in bars]
        positions = range(len(bars))
        axes.barh(
            positions,
            [r - 1 for r in ratios],
            left=1,
            color=["tab:green" if g else "tab:orange" for g in good],
            height=0.6,
        )
        axes.set_yticks(list(positions), [_short(label) for label, _ in bars], fontsize=8)
        axes.invert_yaxis()
        axes.set_xscale("log")
        axes.axvline(1.0, color="black", linewidth=1)
        for y, (_, r) in enumerate(bars):
            axes.annotate(
                f" {_ratio(r.ratio)} ({r.better} is better)",
                (max(r.ratio, 1.0), y),
                va="center",
                fontsize=7,
            )
        low, high = min(ratios + [1.0]), max(ratios + [1.0])
        axes.set_xlim(low / 2, high * 40)
    else:
        axes.text(0.5, 0.5, "no figures", ha="center", va="center")
    axes.set_xlabel("Strata / baseline of the same run (log scale; 1 = the baseline)")
    axes.set_title(f"Strata's benchmarks against their baselines (scale {scale})", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _short(label: str, width: int = 60) -> str:
    return label if len(label) <= width else label[: width - 1] + "…"


def replace_section(text: str, body: str) -> str:
    """``text`` with what lies between the bench markers replaced by ``body``."""
    start, end = text.find(START), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"no {START} ... {END} section")
    return text[: start + len(START)] + "\n" + body + text[end:]


def write(
    outcomes: list[Outcome],
    scale: str,
    out: Path,
    readme: Path | None,
    kept: list[Outcome] | None = None,
) -> str:
    """``<name>.json`` of each of ``outcomes``; the table (summary.md, and ``readme``'s
    section) and the chart of them and of ``kept``, earlier outcomes of other benchmarks."""
    out.mkdir(parents=True, exist_ok=True)
    for o in outcomes:
        (out / f"{o.name}.json").write_text(json.dumps(o.to_dict(), indent=2) + "\n")
    shown = sorted([*outcomes, *(kept or [])], key=lambda o: o.name)
    summary = table(shown, scale)
    (out / "summary.md").write_text(summary)
    chart(shown, scale, out / "summary.png")
    if readme is not None:
        readme.write_text(replace_section(readme.read_text(), summary))
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scale", choices=SCALES, default="full", help="(full)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="these benchmarks only")
    parser.add_argument("--skip", nargs="+", metavar="NAME", help="all but these benchmarks")
    parser.add_argument("--out", type=Path, help="results dir (bench/results[/smoke])")
    readme = parser.add_mutually_exclusive_group()
    readme.add_argument("--readme", type=Path, help="file whose bench section to replace")
    readme.add_argument("--no-readme", action="store_true", help="leave docs/benchmarks.md alone")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and stop")
    args = parser.parse_args(argv)
    scale = check_scale(args.scale)
    every = discover()
    if args.list:
        print("\n".join(every))
        return 0
    names = every
    if args.only:
        unknown = sorted(set(args.only) - set(every))
        if unknown:
            parser.error(f"no such benchmark: {', '.join(unknown)} (there are {', '.join(every)})")
        names = [n for n in every if n in args.only]
    if args.skip:
        unknown = sorted(set(args.skip) - set(every))
        if unknown:
            parser.error(f"no such benchmark: {', '.join(unknown)} (there are {', '.join(every)})")
        names = [n for n in names if n not in args.skip]
    out = args.out or (BENCH / "results" / ("smoke" if scale == "smoke" else ""))
    target = None if args.no_readme else args.readme or (README if scale == "full" else None)
    if target is not None and START not in target.read_text():
        parser.error(f"{target} has no {START} ... {END} section to replace")

    kept = earlier(out, [n for n in every if n not in names], scale)
    # A benchmark that draws a picture of its own (bench/sustained.py) puts it beside the
    # results: bench.harness.results.results_dir.
    os.environ[OUT_VARIABLE] = str(out)
    outcomes = [run_one(name, scale) for name in names]
    print("\n" + write(outcomes, scale, out, target, kept))
    print(f"results in {out}" + (f"; {target} updated" if target else ""))
    failed = [o.name for o in outcomes if o.error]
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed or not outcomes else 0


if __name__ == "__main__":
    sys.exit(main())
