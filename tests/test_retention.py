"""Retention drops old raw rows in batches; the views keep counting them."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from server.workers.retention import Retention
from tests.conftest import Strata


def test_old_raw_rows_go_and_results_stay(strata: Strata) -> None:
    described = strata.create(
        "CREATE STREAM ev (k text, t timestamptz) WITH (event_time = 't', retention = '1 day')"
    )
    assert described["retention_seconds"] == 86400
    strata.create(
        "CREATE STREAM per_hour AS SELECT k, count(*) AS c, window_start "
        "FROM TUMBLE(ev, t, INTERVAL '1 hour') GROUP BY k, window_start"
    )
    now = datetime.now(UTC)
    old = [now - timedelta(days=3, minutes=m) for m in range(7)]
    recent = [now - timedelta(hours=1, minutes=m) for m in range(3)]
    body = "".join(json.dumps({"k": "a", "t": t.isoformat()}) + "\n" for t in old + recent)
    strata.ingest("ev", body)
    assert strata.query("SELECT count(*) FROM ev") == [(10,)]

    worker = Retention(strata.service.engine, strata.service.plans, max_rows=2)
    assert worker.run_once() == {"ev": 7}  # in batches of 2: 2 + 2 + 2 + 1
    assert strata.query("SELECT count(*) FROM ev") == [(3,)]
    assert strata.query("SELECT sum(c) FROM per_hour") == [(10,)]
    assert worker.run_once() == {"ev": 0}
