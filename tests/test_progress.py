"""Progress indicators: the watermark decides what counts as late; late data is counted,
per stream and per window, and never dropped."""

from __future__ import annotations

import json

from tests.conftest import Strata


def _body(*times: str) -> str:
    return "".join(json.dumps({"k": "a", "t": f"2024-07-01T00:{t}Z"}) + "\n" for t in times)


def test_watermark_and_late_data_are_visible(strata: Strata) -> None:
    raw = strata.create(
        "CREATE STREAM ev (k text, t timestamptz) WITH (event_time = 't', delay = '1 minute')"
    )
    assert raw["delay_seconds"] == 60
    strata.create(
        "CREATE STREAM per_minute AS SELECT count(*) AS c, window_start "
        "FROM TUMBLE(ev, t, INTERVAL '1 minute') GROUP BY window_start"
    )
    assert strata.client.get("/streams/ev").json()["progress"]["watermark"] is None

    strata.ingest("ev", _body("00:00", "03:00", "10:00"))
    progress = strata.client.get("/streams/ev").json()["progress"]
    assert progress["watermark"] == "2024-07-01T00:09:00+00:00"  # latest event minus delay
    assert (progress["late_rows"], progress["late_runs"], progress["rows"]) == (0, 0, 3)

    # Three rows behind the watermark (two in 00:05, one in 00:08), one ahead of it.
    strata.ingest("ev", _body("05:10", "05:50", "08:59", "12:00"))
    progress = strata.client.get("/streams/ev").json()["progress"]
    assert progress["watermark"] == "2024-07-01T00:11:00+00:00"
    assert (progress["late_rows"], progress["late_runs"]) == (3, 1)
    assert progress["max_lateness_seconds"] == 230.0  # 00:09:00 - 00:05:10
    assert progress["last_late_at"] is not None

    # Nothing is dropped: the view counts every row, late or not.
    assert strata.query("SELECT sum(c) FROM per_minute") == [(7,)]
    derived = strata.client.get("/streams/per_minute").json()["progress"]
    assert derived["watermark"] == "2024-07-01T00:11:00+00:00"
    assert (derived["late_rows"], derived["late_windows"]) == (3, 2)
    assert {w["window_start"]: w["late_rows"] for w in derived["latest_late_windows"]} == {
        "2024-07-01T00:05:00+00:00": 2,
        "2024-07-01T00:08:00+00:00": 1,
    }

    # On time again: the counters stay.
    strata.ingest("ev", _body("11:30"))
    assert strata.client.get("/streams/ev").json()["progress"]["late_rows"] == 3


def test_delay_must_be_an_interval(strata: Strata) -> None:
    response = strata.client.post(
        "/streams",
        json={"sql": "CREATE STREAM ev (t timestamptz) WITH (event_time = 't', delay = 'soon')"},
    )
    assert response.status_code == 400
