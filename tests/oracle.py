"""What the exactness tests share: rows as NDJSON at times after START, and the check that a
view equals its batch query read in the same snapshot."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from itertools import cycle
from typing import Any, TypeVar

import psycopg

from tests.conftest import Strata

START = datetime(2024, 5, 1, tzinfo=UTC)
T = TypeVar("T")
R = TypeVar("R")


def at(seconds: float) -> str:
    """The moment ``seconds`` after START, as the runs carry it."""
    return (START + timedelta(seconds=seconds)).isoformat()


def ndjson(rows: Sequence[dict[str, object]]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def canonical(rows: list[tuple]) -> list[tuple]:
    """Rows as a sorted multiset (None sorts first)."""
    return sorted(rows, key=lambda r: tuple((v is not None, str(v)) for v in r))


def same(strata: Strata, view: str, oracle: str) -> int:
    """The view equals its oracle, both read in one snapshot; the number of rows."""
    with psycopg.connect(strata.database_url) as connection:
        connection.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        got = canonical(connection.execute(view).fetchall())  # type: ignore[arg-type]
        want = canonical(connection.execute(oracle).fetchall())  # type: ignore[arg-type]
    assert got == want, f"{view}: {len(got)} rows, the batch query {len(want)}"
    return len(got)


def execute(strata: Strata, statement: str, *params: object) -> None:
    """One statement of the user's own (a table made, changed), committed."""
    with psycopg.connect(strata.database_url, autocommit=True) as connection:
        connection.execute(statement, params or None)  # type: ignore[arg-type]


def _identity(run: Any) -> Any:
    return run


def late(
    runs: Iterable[R], time: Callable[[Any], Any], rows: Callable[[R], Iterable[Any]] = _identity
) -> bool:
    """Whether a run (in the order sent) arrives late: behind a later event time that an
    earlier run holds. ``rows`` gives a run's rows (the run itself by default), ``time`` a
    row's event time."""
    newest = None
    for run in runs:
        times = [time(row) for row in rows(run)]
        if not times:
            continue
        if newest is not None and min(times) < newest:
            return True
        newest = max(times) if newest is None else max(newest, *times)
    return False


def with_a_late_run(
    runs: Sequence[R], time: Callable[[Any], Any], rows: Callable[[R], Iterable[Any]] = _identity
) -> list[R]:
    """``runs`` in their order, unless none arrives late: then with the first and the last
    swapped. Runs none of which is late are in event-time order, so the last then arrives
    first and the first after it, behind it, as soon as they hold two different times."""
    ordered = list(runs)
    assert len(ordered) > 1, "a late run needs two runs"
    if not late(ordered, time, rows):
        ordered[0], ordered[-1] = ordered[-1], ordered[0]
    assert late(ordered, time, rows), "no run can be late: every row has one event time"
    return ordered


def late_runs(strata: Strata, raw: str) -> int:
    """How many runs of raw stream ``raw`` Strata counted late (behind its watermark)."""
    return int(strata.client.get(f"/streams/{raw}").json()["progress"]["late_runs"])


def cut(rows: Sequence[T], sizes: Sequence[int]) -> Iterator[list[T]]:
    """``rows`` in runs of the ``sizes`` in turn, until none are left."""
    position = 0
    for size in cycle(sizes):
        chunk = list(rows[position : position + size])
        if not chunk:
            return
        position += size
        yield chunk


class SnapshotReader:
    """A thread that reads while a test writes: over and over, it runs ``check`` in one
    REPEATABLE READ snapshot (``check`` raises when the views and their oracles differ).

    Used as a context manager around the writing. On exit it stops, joins, and re-raises
    the first error the thread met (a mismatch or anything else: an exception in a thread
    is otherwise only a warning), then requires at least ``min_snapshots`` compared
    snapshots, so that a reader that never got to read cannot pass."""

    def __init__(
        self,
        database_url: str,
        check: Callable[[psycopg.Connection], object],
        *,
        min_snapshots: int = 5,
    ) -> None:
        self.database_url = database_url
        self.check = check
        self.min_snapshots = min_snapshots
        self.snapshots = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name="snapshot-reader", daemon=True)

    @classmethod
    def of(
        cls, database_url: str, pairs: Mapping[str, str], *, min_snapshots: int = 5
    ) -> SnapshotReader:
        """A reader comparing each view query with its oracle query (as multisets)."""

        def check(connection: psycopg.Connection) -> None:
            for view, oracle in pairs.items():
                got = canonical(connection.execute(view).fetchall())  # type: ignore[arg-type]
                want = canonical(connection.execute(oracle).fetchall())  # type: ignore[arg-type]
                assert got == want, f"{view}: {len(got)} rows, the oracle {len(want)}"

        return cls(database_url, check, min_snapshots=min_snapshots)

    def _read(self) -> None:
        try:
            with psycopg.connect(self.database_url, autocommit=True) as connection:
                while not self._stop.is_set():
                    with connection.transaction():
                        connection.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                        self.check(connection)
                    self.snapshots += 1
        except BaseException as error:  # noqa: BLE001 - re-raised by __exit__
            self.error = error

    def __enter__(self) -> SnapshotReader:
        self._thread.start()
        return self

    def __exit__(self, kind: object, value: BaseException | None, traceback: object) -> None:
        self._stop.set()
        self._thread.join(timeout=300)
        assert not self._thread.is_alive(), "the snapshot reader did not stop"
        if value is not None:
            return  # the writer's own error comes first
        if self.error is not None:
            raise AssertionError(
                f"the snapshot reader failed after {self.snapshots} snapshots"
            ) from self.error
        assert self.snapshots >= self.min_snapshots, (
            f"the reader compared {self.snapshots} snapshots, fewer than {self.min_snapshots}"
        )
