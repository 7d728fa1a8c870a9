"""The soak of bench/soak.py, shortened for CI: ingest of on-time and late runs with ten
clients querying the views; throughput holds, memory stays flat, nothing is lost."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import soak
from tests.test_e2e import Server

# A soak: with the slow tests (python3 dev.py test --slow), to keep CI under 30 minutes.
pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_short_soak(tmp_path: Path) -> None:
    server = Server(tmp_path / "data", env={"STRATA_REDUCE_INTERVAL": "2"})
    server.start()
    try:
        assert server.process is not None
        config = soak.SoakConfig(seconds=30, writers=3, run_rows=2000, sample=5, think=0.2)
        report = soak.soak(server.url, server.database_url, server.process.pid, config)
        soak.print_report(report)
    finally:
        server.close()
    assert report.problems == []
    assert report.rows_lost == 0
    assert report.failed_requests == 0 and report.failed_queries == 0
    assert report.late_runs > 0 and report.queries > 0
    # Ingest never stalls: runs commit in either half of the soak.
    half = len(report.samples) // 2
    first, second = (
        report.samples[half - 1].runs,
        report.samples[-1].runs - report.samples[half - 1].runs,
    )
    assert first > 0 and second > 0, report.samples
    # Memory stays flat: the server process grows by less than half.
    assert report.samples[-1].server_rss_mb < 1.5 * report.samples[0].server_rss_mb + 100
