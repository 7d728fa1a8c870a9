"""The web console (/console) in a real headless Chromium driven by Playwright, against a
real server (uvicorn on a port, real PostgreSQL, real Spark): the streams are listed, a
stream's live chart follows its change feed as runs commit and marks a late revision with
what changed, by how much and how late, and the SQL box runs read-only statements as the
reader role. The chart's expectations come from plain PostgreSQL over the raw rows, not
from the view. Screenshots are kept in the test's directory.

Chromium comes from Debian (``apt install chromium``; .ci/run installs it): without it the
browser tests are skipped, unless STRATA_REQUIRE_BROWSER=1 (CI) makes that a failure."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pyspark.sql import SparkSession

from server.console.query import QueryRefused, run_read_only
from server.security import configure_reader
from tests.conftest import Strata, strata_client
from tests.test_feed import serving

READER_PASSWORD = "console-reader-pw"
RAW = "con_imps"
VIEW = "con_imps_1m"
STREAMS = [
    f"CREATE STREAM {RAW} (campaign text, price numeric(12,4), t timestamptz) "
    "WITH (event_time = 't')",
    f"CREATE STREAM {VIEW} AS SELECT campaign, count(*) AS c, sum(price) AS revenue, "
    f"window_end AS t FROM TUMBLE({RAW}, t, INTERVAL '1 minute') GROUP BY campaign, window_end",
]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SCREENSHOT = Path(__file__).resolve().parent.parent / "docs" / "screenshots" / "console.png"


def _run(minute: int, rows: list[tuple[str, str]]) -> str:
    """CSV of (campaign, price) rows at 2026-11-20 10:<minute>:xx."""
    lines = ["campaign,price,t"]
    lines += [f"{c},{p},2026-11-20T10:{minute:02d}:{k % 60:02d}Z" for k, (c, p) in enumerate(rows)]
    return "\n".join(lines) + "\n"


def _oracle(database_url: str) -> dict[str, Any]:
    """Per window end, the count of raw rows (plain PostgreSQL over the archive)."""
    query = (
        f"SELECT date_bin('1 minute', t, '1970-01-01') + interval '1 minute', count(*) "
        f"FROM {RAW} GROUP BY 1 ORDER BY 1"
    )
    with psycopg.connect(database_url) as conn:
        return {row[0].isoformat(): row[1] for row in conn.execute(query)}  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def console(
    pg_url: str, spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Strata, str]]:
    from tests.conftest import new_database

    with (
        new_database(pg_url) as url,
        strata_client(
            url, spark, tmp_path_factory.mktemp("console"), reader_password=READER_PASSWORD
        ) as strata,
    ):
        configure_reader(strata.service.engine, READER_PASSWORD)
        for statement in STREAMS:
            strata.create(statement)
        with serving(strata.client.app) as base:  # type: ignore[arg-type]
            yield strata, base


@pytest.fixture
def browser() -> Iterator[Any]:
    """Headless Chromium, per test: Playwright's synchronous API holds an event loop in this
    thread while it runs, which a Strata started meanwhile in the same thread cannot share."""
    if CHROMIUM is None:
        if os.environ.get("STRATA_REQUIRE_BROWSER") == "1":
            pytest.fail("STRATA_REQUIRE_BROWSER=1 but no chromium on PATH (apt install chromium)")
        pytest.skip("no chromium on PATH: apt install chromium to run the console's browser tests")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        try:
            yield launched
        finally:
            launched.close()


def _wait_attribute(page: Any, name: str, expected: str, timeout_ms: int = 30_000) -> None:
    page.wait_for_function(
        "([name, expected]) => document.getElementById('chart').getAttribute(name) === expected",
        arg=[name, expected],
        timeout=timeout_ms,
    )


def test_console_lists_streams_and_the_chart_follows_late_revisions(
    console: tuple[Strata, str], browser: Any, tmp_path: Path
) -> None:
    strata, base = console
    strata.ingest(RAW, _run(1, [("shoes", "1.5"), ("hats", "2")] * 3), csv=True, run_id="r1")

    page = browser.new_page(viewport={"width": 1200, "height": 900})
    page.goto(f"{base}/console")
    listed = page.eval_on_selector_all(
        "#streams tbody tr", "rows => rows.map(r => r.dataset.stream)"
    )
    assert listed == sorted([RAW, VIEW])
    page.screenshot(path=str(tmp_path / "streams.png"), full_page=True)

    page.goto(f"{base}/console/streams/{VIEW}")
    _wait_attribute(page, "data-caught-up", "true")
    oracle = _oracle(strata.database_url)
    assert page.get_attribute("#chart", "data-windows") == str(len(oracle))
    assert page.get_attribute("#chart", "data-late-revisions") == "0"

    # A run of a later minute moves the chart on (and the watermark past minute 1).
    strata.ingest(RAW, _run(5, [("shoes", "3")] * 4), csv=True, run_id="r2")
    oracle = _oracle(strata.database_url)
    latest = max(oracle)
    _wait_attribute(page, "data-windows", str(len(oracle)))
    _wait_attribute(page, "data-latest-value", str(oracle[latest]))
    assert page.get_attribute("#chart", "data-late-revisions") == "0"

    # A late run revises minute 1: marked with what changed, by how much, how late (the
    # newest event time before it, read from the raw rows, past the window's end).
    newest = strata.query(f"SELECT max(t) FROM {RAW}")[0][0]
    strata.ingest(RAW, _run(1, [("shoes", "9")] * 2), csv=True, run_id="late-1")
    _wait_attribute(page, "data-late-revisions", "1")
    revision = page.locator("#revisions li").first
    window = min(_oracle(strata.database_url))
    assert revision.get_attribute("data-delta") == "2"  # two more rows of shoes in minute 1
    assert revision.get_attribute("data-window").replace("Z", "+00:00") == window
    lateness = (newest - datetime.fromisoformat(window)).total_seconds()
    assert float(revision.get_attribute("data-lateness")) == pytest.approx(lateness)
    assert "late-1" in revision.inner_text() and "min late" in revision.inner_text()

    # The window status table (rendered with the page) lists the stream's windows, latest
    # first, with the late rows of the revised one.
    page.reload()
    cells = page.eval_on_selector_all(
        "table.windows tbody tr", "rows => rows.map(r => [...r.cells].map(c => c.innerText))"
    )
    oracle = _oracle(strata.database_url)
    assert [(row[1].replace(" ", "T"), int(row[2])) for row in cells] == sorted(
        oracle.items(), reverse=True
    )
    assert [int(row[3]) for row in cells] == [0, 2]  # late rows: the late run's two
    # The reloaded page starts from the feed's snapshot (no revision yet), and marks the
    # next late run.
    _wait_attribute(page, "data-caught-up", "true")
    assert page.get_attribute("#chart", "data-late-revisions") == "0"
    strata.ingest(RAW, _run(1, [("hats", "4")]), csv=True, run_id="late-2")
    _wait_attribute(page, "data-late-revisions", "1")
    assert page.locator("#revisions li").first.get_attribute("data-delta") == "1"
    page.screenshot(path=str(tmp_path / "stream.png"), full_page=True)
    if os.environ.get("STRATA_CONSOLE_SCREENSHOT") == "1":  # docs/screenshots/console.png
        page.screenshot(path=str(SCREENSHOT), full_page=True)
    page.close()


def test_the_sql_box_runs_read_only_as_the_reader(
    console: tuple[Strata, str], browser: Any
) -> None:
    strata, base = console
    page = browser.new_page()
    page.goto(f"{base}/console")
    page.fill("#sql textarea", f"SELECT campaign, sum(c) FROM {VIEW} GROUP BY 1 ORDER BY 1")
    page.click("#sql button")
    page.wait_for_selector("#sql-rows")
    shown = page.eval_on_selector_all(
        "table.result tbody tr", "rows => rows.map(r => [...r.cells].map(c => c.innerText))"
    )
    expected = strata.query(f"SELECT campaign, count(*) FROM {RAW} GROUP BY 1 ORDER BY 1")
    assert shown == [[c, str(n)] for c, n in expected]
    for statement, message in (
        ("CREATE TABLE console_t (a int)", "read-only transaction"),
        ("SELECT 1; SELECT 2", "multiple commands"),
        ("SELECT rolpassword FROM pg_authid", "permission denied"),
    ):
        page.fill("#sql textarea", statement)
        page.click("#sql button")
        page.wait_for_selector("#sql-error")
        assert message in page.inner_text("#sql-error"), statement
    page.close()


def test_the_sql_box_without_a_reader_password_says_how_to_enable_it() -> None:
    with pytest.raises(QueryRefused, match="STRATA_READER_PASSWORD"):
        run_read_only("postgresql://nobody@127.0.0.1:1/none", None, "SELECT 1")


def test_pages_of_streams_without_a_chart_and_unknown_streams(
    console: tuple[Strata, str],
) -> None:
    strata, _ = console
    page = strata.client.get(f"/console/streams/{RAW}")
    assert page.status_code == 200 and "id='no-chart'" in page.text
    assert "aggregate streams" in page.text
    missing = strata.client.get("/console/streams/nope")
    assert missing.status_code == 404 and "does not exist" in missing.text
    static = strata.client.get("/console/static/LICENSE.uPlot.txt")
    assert static.status_code == 200 and "MIT" in static.text


def test_with_tokens_the_console_signs_in_with_a_cookie(
    fresh_db: str, spark: SparkSession, tmp_path: Path
) -> None:
    with strata_client(fresh_db, spark, tmp_path, api_token="console-token-1") as strata:
        client = strata.client
        assert client.get("/console").status_code == 401
        assert client.get("/console/login").status_code == 200
        refused = client.post("/console/login", content="token=wrong", follow_redirects=False)
        assert refused.status_code == 401
        signed = client.post(
            "/console/login",
            content="token=console-token-1",
            headers={"content-type": "application/x-www-form-urlencoded"},
            follow_redirects=False,
        )
        assert signed.status_code == 303
        cookie = signed.cookies.get("strata_token")
        assert cookie == "console-token-1"
        assert "httponly" in signed.headers["set-cookie"].lower()
        assert "samesite=strict" in signed.headers["set-cookie"].lower()
        client.cookies.set("strata_token", cookie)
        assert client.get("/console").status_code == 200
        assert client.get("/streams").status_code == 200  # the cookie is a token like any
