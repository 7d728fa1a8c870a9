"""Generated runs: the CSV bodies a benchmark posts (or COPYs, or hands to Spark), and the
event-time text of their rows."""

from __future__ import annotations

from dataclasses import dataclass

DAY = "2024-01-01"  # the day of the generated event times
DAY_MS = 86_400_000
HOUR_MS = 3_600_000


@dataclass
class Dataset:
    """CSV bodies (with a header line each) in the order they arrive, and their rows."""

    bodies: list[bytes]
    rows_per_body: list[int]
    late_runs: list[int]  # indexes of the bodies that arrive late

    @property
    def rows(self) -> int:
        return sum(self.rows_per_body)

    @property
    def size(self) -> int:
        return sum(len(b) for b in self.bodies)


def day_timestamp(ms_of_day: int) -> str:
    """The instant ``ms_of_day`` milliseconds into DAY, as CSV text (UTC).

    >>> day_timestamp(3_723_004)
    '2024-01-01T01:02:03.004Z'
    """
    seconds, ms = divmod(ms_of_day, 1000)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    return f"{DAY}T{hour:02d}:{minute:02d}:{second:02d}.{ms:03d}Z"
