"""The README documents every setting and keeps its Quick start to two commands."""

from __future__ import annotations

import re
from pathlib import Path

from server.settings import Settings

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def test_every_setting_is_documented() -> None:
    for name, field in Settings.model_fields.items():
        assert field.description, f"setting {name} has no help text"
        assert f"`STRATA_{name.upper()}`" in README, f"STRATA_{name.upper()} missing from README"


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
