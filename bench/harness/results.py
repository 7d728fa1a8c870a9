"""What a benchmark reports: its figures for bench/run.py, each against a baseline of the
same run (``Result``), and the phases it prints on the way (``Timing``).

The convention that makes a module of bench/ a benchmark ``make bench`` runs: it defines,
at the top level, ::

    def benchmark(scale: str) -> list[Result]:

where ``scale`` is one of SCALES: ``full`` (the figures docs/benchmarks.md reports) or ``smoke``
(tiny, for CI: it proves everything works, its numbers mean nothing). It raises on failure
(wrong results, a server that would not start), after printing what went wrong.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal, TypeVar

SCALES = ("smoke", "full")
T = TypeVar("T")


# bench/run.py names its results dir here for the benchmarks that draw pictures of their own.
OUT_VARIABLE = "STRATA_BENCH_OUT"
RESULTS = Path(__file__).resolve().parent.parent / "results"


def results_dir(scale: str) -> Path:
    """Where a benchmark run at ``scale`` puts files beside its figures: bench/run.py's
    ``--out``, or bench/results (bench/results/smoke at the smoke scale) when run alone."""
    given = os.environ.get(OUT_VARIABLE)
    if given:
        return Path(given)
    return RESULTS / "smoke" if check_scale(scale) == "smoke" else RESULTS


class ScaleError(ValueError):
    """A scale that is not one of SCALES."""


def check_scale(scale: str) -> str:
    if scale not in SCALES:
        raise ScaleError(f"unknown scale {scale!r}: one of {', '.join(SCALES)}")
    return scale


@dataclass
class Result:
    """One figure: Strata's number and the baseline's, measured in the same run on the same
    machine, so that their ratio says more than either (machines and loads differ)."""

    figure: str  # what was measured, e.g. "HTTP ingest, wait=true, 4 client threads"
    value: float  # Strata's number, in ``unit``
    baseline: float  # the baseline's number, same unit, same run
    baseline_name: str  # e.g. "PostgreSQL COPY"
    unit: str  # e.g. "rows/s", "ms", "s"
    # Which way is good for ``value`` against ``baseline``: rows/s want "higher", times "lower".
    better: Literal["higher", "lower"]
    notes: str = ""
    context: dict[str, float | int | str] = field(default_factory=dict)  # absolute numbers

    @property
    def ratio(self) -> float:
        return self.value / self.baseline if self.baseline else float("nan")

    def to_dict(self) -> dict[str, object]:
        # 4 significant digits; null when there is no ratio (a baseline of 0: rows lost, say)
        ratio = float(f"{self.ratio:.4g}") if math.isfinite(self.ratio) else None
        return asdict(self) | {"ratio": ratio}


def latency_results(
    figure: str, seconds: Mapping[str, float], baseline_name: str, samples: int
) -> list[Result]:
    """The p50 and the p99 (bench.harness.percentile) of a latency in seconds, Strata's
    (``strata_p50_s``) against the peer's (``sss_p50_s``) of ``seconds``; ``figure`` names
    it with ``{q}`` for the percentile."""
    return [
        Result(
            figure.format(q=q),
            seconds[f"strata_{q}_s"],
            seconds[f"sss_{q}_s"],
            baseline_name,
            "s",
            "lower",
            context={"samples": samples},
        )
        for q in ("p50", "p99")
    ]


@dataclass
class Timing:
    """One phase of a benchmark, a line of the table it prints."""

    name: str
    rows: int
    seconds: float
    notes: str = ""
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0


def print_table(timings: list[Timing], *, phase_width: int = 22, rows_width: int = 10) -> None:
    print(f"{'phase':<{phase_width}} {'rows':>{rows_width}} {'seconds':>9} {'rows/s':>11}  notes")
    for t in timings:
        rate = f"{t.rows_per_s:,.0f}" if t.rows else ""
        rows = f"{t.rows:,}" if t.rows else ""
        print(
            f"{t.name:<{phase_width}} {rows:>{rows_width}} {t.seconds:>9.2f} {rate:>11}  {t.notes}"
        )


def timed(what: Callable[[], T]) -> tuple[T, float]:
    """What ``what`` returns, and the seconds it took."""
    started = time.perf_counter()
    result = what()
    return result, time.perf_counter() - started
