"""The documentation cannot rot: the site builds strictly, the README stays a front page with
its two Quick start commands, every setting is documented, and every SQL example of docs/
runs against a real server and answers what the page says.

Examples, per page of docs/, in the order they appear, against one fresh Strata per page:

* a ```` ```sql ```` block is run by the real psql through the SQL port. A comment line
  ``-- ...`` right after a statement (a line ending in ``;``, or COPY data's ``\\.``), and
  those right after it, are what psql answers: when a block has any, psql's output must be
  exactly those lines (``-- ERROR:  ...`` lines are the errors it prints; one ending in
  ``...`` matches any line that starts with the text before). A block without any must run
  without an error. So a refused statement is shown with the error it gets.
* a ```` ```sql {.synopsis} ```` block is grammar, not an example: it must hold a
  placeholder (``...``, ``[optional]`` or ``name``).
* a ```` ```sh {.run} ```` block is run by bash, with ``localhost:8080`` pointing at the
  page's server; ``# ...`` lines after its commands are their output, as above; a block
  without them must print no ``"error"``.

``STRATA_UPDATE_DOCS=1`` writes what psql answers into the pages' SQL blocks instead of
comparing (as ``STRATA_UPDATE_GOLDENS=1`` does for the rewrite fixtures): after a deliberate
change, run it, then read the diff.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import uvicorn

from server.engines.embedded_pg import POSTGRES_BIN_PATH
from server.net import free_port
from server.settings import Settings
from tests.conftest import Strata

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text()
FENCE = re.compile(r"^```(\w+)[ ]*(\{[^}\n]*\})?[ ]*\n(.*?)^```[ ]*$", re.M | re.S)
PAGES = sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.relative_to(DOCS).parts)
# The README's taste of SQL runs too: it is the first example a newcomer copies.
EXAMPLE_SOURCES = [ROOT / "README.md", *PAGES]


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    language: str
    classes: frozenset[str]
    text: str


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    found = []
    for match in FENCE.finditer(text):
        classes = frozenset(re.findall(r"\.([\w-]+)", match.group(2) or ""))
        line = text.count("\n", 0, match.start()) + 1
        found.append(Block(page, line, match.group(1), classes, match.group(3)))
    return found


def runnable(block: Block) -> bool:
    if block.language == "sql":
        return "synopsis" not in block.classes
    return block.language == "sh" and "run" in block.classes


def expected_output(script: str, comment: str, ends_command: re.Pattern[str]) -> list[str]:
    """The comment lines that follow a command's last line: what the command prints."""
    shown, answering = [], False
    for line in script.splitlines():
        if answering and (line.startswith(comment + " ") or line == comment):
            shown.append(line[len(comment) + 1 :].rstrip())
            continue
        answering = bool(ends_command.search(line.rstrip()))
    return shown


def same_lines(got: list[str], expected: list[str]) -> bool:
    if len(got) != len(expected):
        return False
    return all(
        g.startswith(e[:-3]) if e.endswith("...") else g == e
        for g, e in zip(got, expected, strict=True)
    )


SQL_ENDS = re.compile(r"(;|^\\\.)$")
UPDATE = os.environ.get("STRATA_UPDATE_DOCS") == "1"
SHOWN_ERROR_CHARACTERS = 100
SH_ENDS = re.compile(r"^\s*(EOF|curl .*[^\\|])$")


def psql(
    script: str, psql_url: str, *, stop: bool
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """psql run on ``script``, and the errors it printed (from ``ERROR:`` on)."""
    command = [str(POSTGRES_BIN_PATH / "psql"), psql_url, "-X", "-f", "-"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    if stop:
        command += ["-v", "ON_ERROR_STOP=1"]
    result = subprocess.run(
        command, input=script, capture_output=True, text=True, timeout=300, env=env
    )
    said = [line[line.index("ERROR:") :] for line in result.stderr.splitlines() if "ERROR:" in line]
    return result, said


def shortened(error: str) -> str:
    if len(error) <= SHOWN_ERROR_CHARACTERS:
        return error
    return error[: error.rindex(" ", 0, SHOWN_ERROR_CHARACTERS - 3)] + " ..."


def transcribed(script: str, psql_url: str) -> str:
    """``script`` with what psql answers after each of its statements that show an answer
    (STRATA_UPDATE_DOCS): each part up to an answer runs on its own, in order."""
    parts: list[tuple[list[str], bool]] = [([], False)]
    answering = False
    for line in script.splitlines(keepends=True):
        if answering and (line.startswith("-- ") or line.rstrip("\n") == "--"):
            parts[-1] = (parts[-1][0], True)
            continue
        if parts[-1][1]:
            parts.append(([], False))
        parts[-1][0].append(line)
        answering = bool(SQL_ENDS.search(line.rstrip()))
    text = ""
    for lines, answered in parts:
        text += "".join(lines)
        if answered:
            result, said = psql("".join(lines), psql_url, stop=False)
            printed = [line.rstrip() for line in result.stdout.splitlines() if line.strip()]
            text += "".join(f"-- {line}\n" for line in printed + [shortened(e) for e in said])
    return text


def run_sql(block: Block, psql_url: str) -> str:
    """Run ``block``; its text, with psql's answers written in under STRATA_UPDATE_DOCS."""
    where = f"{block.page.relative_to(ROOT)}:{block.line}"
    shown = expected_output(block.text, "--", SQL_ENDS)
    if shown and UPDATE:
        return transcribed(block.text, psql_url)
    result, said = psql(block.text, psql_url, stop=not shown)
    if not shown:
        assert result.returncode == 0 and not said, f"{where}: {result.stderr}"
        return block.text
    errors = [line for line in shown if line.startswith("ERROR:")]
    answers = [line for line in shown if not line.startswith("ERROR:")]
    printed = [line.rstrip() for line in result.stdout.splitlines() if line.strip()]
    assert same_lines(printed, answers), f"{where}: psql printed\n" + "\n".join(printed)
    assert same_lines(said, errors), f"{where}: psql said\n" + "\n".join(said)
    return block.text


def run_sh(block: Block, url: str) -> None:
    where = f"{block.page.relative_to(ROOT)}:{block.line}"
    shown = expected_output(block.text, "#", SH_ENDS)
    script = "set -eu\n" + block.text.replace("localhost:8080", url.removeprefix("http://"))
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{where}: {result.stderr}"
    printed = [line.rstrip() for line in result.stdout.splitlines() if line.strip()]
    if shown:
        assert same_lines(printed, shown), f"{where}: the commands printed\n" + "\n".join(printed)
    else:
        assert '"error"' not in result.stdout, f"{where}: {result.stdout}"


@pytest.fixture
def http_url(strata: Strata) -> Iterator[str]:
    """The page's server over real HTTP (the fixture's app, served by uvicorn)."""
    port = free_port()
    config = uvicorn.Config(
        strata.client.app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


EXAMPLE_PAGES = [page for page in EXAMPLE_SOURCES if any(runnable(b) for b in blocks(page))]


@pytest.mark.parametrize(
    "page", EXAMPLE_PAGES, ids=[str(p.relative_to(ROOT)) for p in EXAMPLE_PAGES]
)
def test_every_example_of_the_page_runs(page: Path, request: pytest.FixtureRequest) -> None:
    strata: Strata = request.getfixturevalue("strata")
    page_blocks = blocks(page)
    served = any(runnable(b) and b.language == "sh" for b in page_blocks)
    url = request.getfixturevalue("http_url") if served else ""
    texts = []
    for block in page_blocks:
        if block.language == "sql" and "synopsis" in block.classes:
            placeholder = any(p in block.text for p in ("...", "[", "name"))
            assert placeholder, f"{page}:{block.line}: a synopsis without a placeholder"
        elif block.language == "sql":
            texts.append(run_sql(block, strata.psql_url))
            continue
        elif runnable(block):
            run_sh(block, url)
        texts.append(block.text)
    if UPDATE:
        written = iter(texts)
        page.write_text(
            FENCE.sub(lambda m: m.group(0).replace(m.group(3), next(written)), page.read_text())
        )


def test_the_examples_are_found() -> None:
    """The pages the issue asks examples of have them (a fence the pattern missed would
    otherwise go untested)."""
    for name in ("getting-started/http.md", "getting-started/psql.md", "sql/create-stream.md"):
        assert DOCS / name in EXAMPLE_PAGES, name
    assert ROOT / "README.md" in EXAMPLE_PAGES
    fences = sum(text.count("\n```sql") for text in (p.read_text() for p in EXAMPLE_SOURCES))
    assert fences == sum(b.language == "sql" for p in EXAMPLE_SOURCES for b in blocks(p))


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built as `python3 dev.py docs` builds it, strictly: a broken link, a missing
    page or a page left out of the navigation fails."""
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=os.environ | {"NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-5000:]
    return out


def test_the_site_has_every_page(site: Path) -> None:
    for page in (
        "getting-started",
        "concepts",
        "sql",
        "sql/create-stream",
        "sql/alter-stream",
        "sql/windows",
        "sql/joins",
        "sql/functions/time",
        "http-api",
        "sql-port",
        "operations/configuration",
        "operations/metrics",
        "operations/security",
        "operations/upgrading",
        "operations/stopping",
        "scaling",
        "scaling/high-availability",
        "benchmarks",
        "architecture",
    ):
        assert (site / page / "index.html").exists(), page
    assert (site / "bench-summary.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_http_api_page_is_the_apps_schema(site: Path) -> None:
    from docs.hooks.generate import openapi_schema

    schema = openapi_schema()
    page = (site / "http-api" / "index.html").read_text()
    for path, methods in schema["paths"].items():
        for method in methods:
            assert f"{method.upper()} <code>{path}</code>" in page, (method, path)


def test_every_setting_is_documented(site: Path) -> None:
    page = (site / "operations" / "configuration" / "index.html").read_text()
    for name, field in Settings.model_fields.items():
        assert field.description, f"setting {name} has no help text"
        assert f"STRATA_{name.upper()}" in page, f"STRATA_{name.upper()} missing from the docs"


def test_every_metric_is_documented(site: Path) -> None:
    from docs.hooks.generate import metrics

    page = (site / "operations" / "metrics" / "index.html").read_text()
    found = metrics()
    assert {"strata_runs_committed_total", "strata_watermark_seconds"} <= {m["name"] for m in found}
    for metric in found:
        assert metric["name"] in page, metric


def test_the_readme_is_a_front_page() -> None:
    assert len(README.splitlines()) < 200
    for link in re.findall(r"\]\((docs/[^)#]+)", README):
        assert (ROOT / link).exists(), link


def test_quick_start_is_two_commands_and_ci_runs_the_test_command() -> None:
    section = README.split("## Quick start", 1)[1].split("##", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None
    commands = [line.split("#")[0].strip() for line in block.group(1).splitlines()]
    commands = [c for c in commands if c]
    assert commands == ["python3 dev.py up", "python3 dev.py test"]
    ci = (Path(__file__).resolve().parent.parent / ".ci" / "run").read_text()
    assert "python3 dev.py test" in ci


def test_strata_settings_are_read_in_settings_only() -> None:
    """Configuration is read once, in Settings: no other module of the server reads a
    STRATA_ variable (the crash tests' fault hook aside). Other environment variables the
    server touches are the child processes' own (JAVA_HOME, PYSPARK_PYTHON, PG*)."""
    root = Path(__file__).resolve().parent.parent / "server"
    allowed = {root / "settings.py", root / "faults.py"}
    readers = re.compile(
        r"(environ\.get|getenv)\(\s*[\"']STRATA_|environ\[\s*[\"']STRATA_\w*[\"']\](?!\s*=[^=])"
    )
    offenders = [
        f"{path.relative_to(root.parent)}:{number}"
        for path in sorted(root.rglob("*.py"))
        if path not in allowed
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if readers.search(line)
    ]
    assert not offenders, offenders
