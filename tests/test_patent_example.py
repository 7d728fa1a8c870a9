"""The worked example of seeds/003 (FIG. 3/4): a 5-minute tumbling count over 16 tuples.

Six tuples arrive after the watermark of an order-dependent engine has closed their
window (it would drop them and a 15-minute roll-up would report 10). Strata processes the
late tuples as runs of their own and reports the correct 16.
"""

from __future__ import annotations

import json

from tests.conftest import Strata

# (arrival position, event time within 2024-01-01 00:mm:ss); late ones are marked.
ARRIVALS = [
    ("00:30", False),
    ("01:10", False),
    ("02:00", False),
    ("04:50", False),
    ("05:20", False),  # the watermark passes 05:00: window [00:00, 00:05) closes
    ("03:10", True),
    ("06:00", False),
    ("09:00", False),
    ("04:00", True),
    ("10:30", False),  # window [00:05, 00:10) closes
    ("07:30", True),
    ("08:10", True),
    ("11:00", False),
    ("02:30", True),
    ("12:00", False),
    ("09:40", True),
]


def _body(times: list[str]) -> str:
    return "".join(
        json.dumps({"campaign": "c1", "t": f"2024-01-01T00:{mmss}Z"}) + "\n" for mmss in times
    )


def test_late_tuples_are_counted(strata: Strata) -> None:
    strata.create("CREATE STREAM impsns (campaign text, t timestamptz) WITH (event_time = 't')")
    strata.create(
        "CREATE STREAM impsn_count AS SELECT count(*) AS c, window_end AS t "
        "FROM TUMBLE(impsns, t, INTERVAL '5 minutes') GROUP BY window_end"
    )
    strata.create(
        "CREATE STREAM impsn_count15 AS SELECT count(*) AS c, window_end AS t "
        "FROM TUMBLE(impsns, t, INTERVAL '15 minutes') GROUP BY window_end"
    )
    on_time = [t for t, late in ARRIVALS if not late]
    late_first_window = [t for t, late in ARRIVALS if late and t < "05:00"]
    late_second_window = [t for t, late in ARRIVALS if late and t >= "05:00"]
    assert (len(on_time), len(late_first_window), len(late_second_window)) == (10, 3, 3)

    # Partition 1: the tuples an order-dependent engine keeps.
    strata.ingest("impsns", _body(on_time))
    five = "SELECT to_char(t, 'HH24:MI'), c FROM impsn_count ORDER BY t"
    assert strata.query(five) == [("00:05", 4), ("00:10", 3), ("00:15", 3)]
    assert strata.query("SELECT c FROM impsn_count15") == [(10,)]

    # Partitions 2 and 3: the late tuples, processed independently, arrive afterwards.
    strata.ingest("impsns", _body(late_second_window))
    strata.ingest("impsns", _body(late_first_window))
    assert strata.query(five) == [("00:05", 7), ("00:10", 6), ("00:15", 3)]
    assert strata.query("SELECT c FROM impsn_count15") == [(16,)]
    assert strata.query("SELECT sum(c) FROM impsn_count") == [(16,)]
    # Each run left its own partial rows; the view consolidates them on read.
    assert strata.query("SELECT count(*) FROM strata_internal.impsn_count__partial") == [(5,)]
