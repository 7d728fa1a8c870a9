"""public.strata_window_status: per window of every windowed stream, the rows its runs
brought, the late ones, a serial stream's repairs, the last change and completeness, as
the dashboard role strata_reader reads them."""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from server.security import READER_ROLE, configure_reader
from server.workers.serial import Materializer, Repairer
from tests.conftest import Strata
from tests.test_auth import as_role

START = datetime(2024, 6, 1, tzinfo=UTC)
MINUTE = timedelta(minutes=1)
STREAMS = [
    "CREATE STREAM ev (campaign text, t timestamptz) WITH (event_time = 't')",
    "CREATE STREAM per_minute AS SELECT campaign, count(*) AS n, window_end AS t "
    "FROM TUMBLE(ev, t, INTERVAL '1 minute') GROUP BY campaign, window_end",
    "CREATE STREAM sliding AS SELECT count(*) AS n, window_start FROM HOP(ev, t, "
    "INTERVAL '1 minute', INTERVAL '3 minutes') GROUP BY window_start",
    "CREATE STREAM top_per_5 AS SELECT max(n) AS top, window_end AS t "
    "FROM TUMBLE(per_minute, t, INTERVAL '5 minutes') GROUP BY window_end",
    # Without a window: no row in the status.
    "CREATE STREAM totals AS SELECT campaign, count(*) AS n FROM ev GROUP BY campaign",
]


def _rows(rng: random.Random, minutes: range, count: int) -> list[datetime]:
    return [
        START + minute * MINUTE + timedelta(seconds=rng.uniform(0, 59))
        for minute in (rng.choice(minutes) for _ in range(count))
    ]


def _body(times: list[datetime]) -> str:
    return "".join(json.dumps({"campaign": "a", "t": t.isoformat()}) + "\n" for t in times)


def _per(times: list[datetime], size: int) -> Counter[datetime]:
    """Rows per window of ``size`` minutes (tumbling)."""
    counted: Counter[datetime] = Counter()
    for t in times:
        minute = (t - START) // MINUTE
        counted[START + (minute - minute % size) * MINUTE] += 1
    return counted


def _hop(times: list[datetime]) -> Counter[datetime]:
    """Rows per 3-minute window sliding by a minute."""
    counted: Counter[datetime] = Counter()
    for start, n in _per(times, 1).items():
        for back in range(3):
            counted[start - back * MINUTE] += n
    return counted


@pytest.fixture
def reader(strata: Strata) -> Iterator[psycopg.Connection]:
    configure_reader(strata.service.engine, "status-pw")
    with psycopg.connect(
        as_role(strata.database_url, READER_ROLE, "status-pw"), autocommit=True
    ) as connection:
        yield connection


def _status(reader: psycopg.Connection, stream: str) -> dict[datetime, tuple]:
    rows = reader.execute(
        "SELECT window_start, window_end, rows, late_rows, revisions, complete, "
        "last_changed_at IS NOT NULL FROM strata_window_status WHERE stream = %s",
        (stream,),
    ).fetchall()
    return {r[0]: r[1:] for r in rows}


def test_status_of_tumbling_hop_and_serial_windows_for_the_reader(
    strata: Strata, reader: psycopg.Connection
) -> None:
    for statement in STREAMS:
        strata.create(statement)
    rng = random.Random(7)
    on_time = _rows(rng, range(0, 12), 120)  # the watermark reaches minute 11
    strata.ingest("ev", _body(on_time))
    engine, plans = strata.service.engine, strata.service.plans
    assert Materializer(engine, plans).run_once()["top_per_5"] == 2  # [0, 5) and [5, 10)
    late = _rows(rng, range(1, 4), 15)  # behind the watermark, into the closed [0, 5)
    strata.ingest("ev", _body(late))
    assert Repairer(engine, plans).run_once() == {"top_per_5": 1}
    watermark = max(on_time)
    everything = on_time + late

    minutes = _status(reader, "per_minute")
    assert {w: s[1] for w, s in minutes.items()} == dict(_per(everything, 1))
    assert {w: s[2] for w, s in minutes.items() if s[2]} == dict(_per(late, 1))
    for start, (end, _, _, revisions, complete, changed) in minutes.items():
        assert end == start + MINUTE and revisions == 0 and changed
        assert complete == (end <= watermark)

    sliding = _status(reader, "sliding")
    assert {w: s[1] for w, s in sliding.items()} == dict(_hop(everything))
    assert {w: s[2] for w, s in sliding.items() if s[2]} == dict(_hop(late))

    tops = _status(reader, "top_per_5")
    assert {w: s[1] for w, s in tops.items()} == dict(_per(everything, 5))
    assert tops[START][2] == len(late)  # every late row went into [0, 5)
    assert tops[START][3] == 1  # repaired once
    assert tops[START + 5 * MINUTE][3] == 0
    assert [s[4] for w, s in sorted(tops.items())] == [True, True, False]

    assert _status(reader, "totals") == {}
    # The reader reads the status, not the catalog behind it.
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        reader.execute("SELECT * FROM strata_catalog.window_changes")


def test_a_serial_streams_progress_counts_the_late_rows_of_its_windows(strata: Strata) -> None:
    for statement in STREAMS[:4]:
        strata.create(statement)
    rng = random.Random(8)
    strata.ingest("ev", _body(_rows(rng, range(0, 12), 50)))
    strata.ingest("ev", _body(_rows(rng, range(1, 4), 9)))
    progress = strata.client.get("/streams/top_per_5").json()["progress"]
    assert progress["late_rows"] == 9


def test_a_dropped_stream_leaves_no_status(strata: Strata, reader: psycopg.Connection) -> None:
    for statement in STREAMS[:2]:
        strata.create(statement)
    strata.ingest("ev", _body(_rows(random.Random(9), range(0, 5), 20)))
    assert _status(reader, "per_minute")
    assert strata.client.delete("/streams/per_minute").status_code in (200, 204)
    assert _status(reader, "per_minute") == {}
