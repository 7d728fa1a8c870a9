"""The console's pages as HTML, rendered on the server from plain data (no template engine,
no build step): every value goes through ``html.escape``."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from html import escape

from server.console.query import QueryResult

STATIC = "/console/static"


@dataclass(frozen=True)
class StreamSummary:
    """A line of the streams table: the stream and what strata_window_status says of it."""

    name: str
    kind: str
    sql: str
    windows: int
    rows: int
    late_rows: int
    revisions: int
    last_changed_at: datetime | None


@dataclass(frozen=True)
class ChartShape:
    """What the live chart of a followed stream plots: per value of ``window`` (a view
    column), the sum over the groups of the value column chosen among ``values``."""

    window: str
    keys: tuple[str, ...]
    values: tuple[str, ...]


@dataclass(frozen=True)
class WindowLine:
    window_start: datetime
    window_end: datetime
    rows: int
    late_rows: int
    revisions: int
    last_changed_at: datetime | None
    complete: bool


def _page(title: str, body: str) -> str:
    return (
        "<!doctype html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{escape(title)} · Strata</title>"
        f"<link rel='stylesheet' href='{STATIC}/uPlot.min.css'>"
        f"<link rel='stylesheet' href='{STATIC}/console.css'></head><body>"
        "<header><a href='/console'>Strata console</a></header>"
        f"<main>{body}</main></body></html>\n"
    )


def _text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.isoformat(sep=" ", timespec="seconds")
    return escape(str(value))


def _table(headers: Sequence[str], rows: Iterable[Sequence[object]], css: str) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_text(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table class='{css}'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def sql_box(query: str = "", result: QueryResult | None = None, error: str | None = None) -> str:
    """The read-only SQL form, with the last statement's result or error."""
    out = (
        "<section id='sql'><h2>SQL (read-only, as strata_reader)</h2>"
        "<form method='post' action='/console/sql'>"
        f"<textarea name='query' rows='4' cols='90'>{escape(query)}</textarea><br>"
        "<button type='submit'>Run</button></form>"
    )
    if error is not None:
        out += f"<p class='error' id='sql-error'>{escape(error)}</p>"
    if result is not None:
        out += _table(result.columns, result.rows, "result")
        shown = f"{len(result.rows)} row{'s' if len(result.rows) != 1 else ''}"
        out += f"<p id='sql-rows'>{shown}{' (first rows only)' if result.truncated else ''}</p>"
    return out + "</section>"


def index(streams: Sequence[StreamSummary]) -> str:
    """The streams, with their SQL, windows, late rows and revisions."""
    lines = "".join(
        f"<tr data-stream='{escape(s.name)}'>"
        f"<td><a href='/console/streams/{escape(s.name)}'>{escape(s.name)}</a></td>"
        f"<td>{escape(s.kind)}</td><td><pre>{escape(s.sql)}</pre></td>"
        f"<td>{s.windows}</td><td>{s.rows}</td><td>{s.late_rows}</td>"
        f"<td>{s.revisions}</td><td>{_text(s.last_changed_at)}</td></tr>"
        for s in streams
    )
    headers = ("stream", "kind", "SQL", "windows", "rows", "late rows", "revisions", "changed")
    table = (
        "<table id='streams'><thead><tr>"
        + "".join(f"<th>{h}</th>" for h in headers)
        + f"</tr></thead><tbody>{lines}</tbody></table>"
    )
    empty = "" if streams else "<p>No streams yet: CREATE STREAM over psql or POST /streams.</p>"
    return _page("Streams", f"<h1>Streams</h1>{table}{empty}{sql_box()}")


def stream(
    summary: StreamSummary,
    chart: ChartShape | None,
    why_no_chart: str | None,
    windows: Sequence[WindowLine],
) -> str:
    """A stream: its SQL, a live chart of its windows fed by the change feed (late revisions
    marked, and listed), and its window status table."""
    name = escape(summary.name)
    body = f"<h1>{name}</h1><pre id='stream-sql'>{escape(summary.sql)}</pre>"
    if chart is not None:
        options = "".join(f"<option>{escape(v)}</option>" for v in chart.values)
        attributes = {
            "stream": summary.name,
            "window": chart.window,
            "keys": json.dumps(list(chart.keys)),
            "value": chart.values[0],
            "position": "",
            "windows": "0",
            "late-revisions": "0",
            "latest-window": "",
            "latest-value": "",
            "caught-up": "false",
        }
        data = " ".join(f"data-{k}='{escape(v)}'" for k, v in attributes.items())
        body += (
            "<section><h2>Live</h2>"
            f"<label>value <select id='value'>{options}</select></label> "
            "(summed over the groups of each window; red points: late revisions)"
            f"<div id='chart' {data}></div>"
            "<h3>Late revisions</h3><ol id='revisions'></ol></section>"
            f"<script src='{STATIC}/uPlot.iife.min.js'></script>"
            f"<script src='{STATIC}/console.js'></script>"
        )
    else:
        body += f"<p id='no-chart'>No live chart: {escape(why_no_chart or '')}</p>"
    headers = ("window start", "window end", "rows", "late rows", "revisions", "changed")
    lines = [
        (w.window_start, w.window_end, w.rows, w.late_rows, w.revisions, w.last_changed_at)
        for w in windows
    ]
    body += (
        "<section><h2>Windows (latest first; strata_window_status)</h2>"
        + _table(
            [*headers, "complete"],
            [(*line, w.complete) for line, w in zip(lines, windows, strict=True)],
            "windows",
        )
        + "</section>"
    )
    return _page(summary.name, body + sql_box(f"SELECT * FROM {summary.name} LIMIT 100"))


def query_page(query: str, result: QueryResult | None, error: str | None) -> str:
    return _page("SQL", "<h1>SQL</h1>" + sql_box(query, result, error))


def login(error: str | None) -> str:
    """The sign-in form, when Strata has API tokens: the token is kept in a cookie."""
    problem = f"<p class='error'>{escape(error)}</p>" if error else ""
    return _page(
        "Sign in",
        "<h1>Sign in</h1><p>Strata has API tokens: give one with the read scope.</p>"
        f"{problem}<form method='post' action='/console/login'>"
        "<input type='password' name='token' size='50'> <button type='submit'>Sign in</button>"
        "</form>",
    )


def not_found(what: str) -> str:
    return _page("Not found", f"<h1>Not found</h1><p class='error'>{escape(what)}</p>")
