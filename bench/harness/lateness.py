"""How generated runs arrive late, shared by the workloads (impressions, nexmark): the
lateness profiles, which runs are late, and the order in which runs arrive."""

from __future__ import annotations

import random
from dataclasses import dataclass

from bench.harness.data import HOUR_MS


@dataclass(frozen=True)
class Lateness:
    """How the runs of a generated workload arrive late (a lateness profile).

    A fraction ``runs`` of the runs are late. With ``delay_ms`` unset, a late run mixes a
    fraction ``rows`` of rows from anywhere earlier in the span into its own slice (the
    ingest benchmark's profile). With ``delay_ms = (low, high)``, a late run holds only the
    rows of its own slice but arrives ``low`` to ``high`` later, after the runs of that much
    later event time, as a log file held back for hours does. ``jitter_ms`` delays each
    run's arrival by up to that much, shuffling neighbouring runs; 0 keeps event-time order.
    """

    runs: float = 0.2
    rows: float = 0.5
    delay_ms: tuple[int, int] | None = None
    jitter_ms: int = 0


MIXED = Lateness()
# 20% of the rows arrive in runs 1-6 hours late; every run's arrival is jittered by up to
# 30 minutes, which shuffles neighbouring runs when they are shorter than that.
HOURS_LATE = Lateness(runs=0.2, rows=0.0, delay_ms=(HOUR_MS, 6 * HOUR_MS), jitter_ms=HOUR_MS // 2)
ON_TIME = Lateness(runs=0.0, rows=0.0)


def pick_late(rng: random.Random, runs: int, lateness: Lateness) -> list[int]:
    """The indexes of the late runs among ``runs``, in order; never the first run (there is
    nothing before it to be late after)."""
    return sorted(rng.sample(range(1, runs), round(lateness.runs * runs))) if runs > 1 else []


def arrival_order(
    slice_ends_ms: list[int], late: set[int], lateness: Lateness, rng: random.Random
) -> list[int]:
    """The indexes of the runs in the order they arrive: run i when its slice ends
    (``slice_ends_ms[i]``), plus its delay if it is in ``late``, plus its jitter; runs that
    arrive at the same instant keep their order.

    >>> arrival_order([10, 20, 30], {0}, Lateness(delay_ms=(15, 15)), random.Random(1))
    [1, 0, 2]
    """
    arrives = []
    for run, at in enumerate(slice_ends_ms):
        if lateness.delay_ms is not None and run in late:
            at += rng.randint(*lateness.delay_ms)
        if lateness.jitter_ms:
            at += rng.randrange(lateness.jitter_ms + 1)
        arrives.append((at, run))
    return [run for _, run in sorted(arrives)]
