"""The tests' Spark drivers start from the class-data archive conftest.py gave them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

STARTS_A_DRIVER = """
from server.engines.spark import create_spark_session, stop_spark_session
stop_spark_session(create_spark_session("local[1]"))
"""


def test_a_driver_maps_spark_classes_from_the_archive(tmp_path: Path) -> None:
    options = os.environ["JAVA_TOOL_OPTIONS"]
    if "-XX:SharedArchiveFile=" not in options:
        pytest.skip("this JDK made no class-data archive (see tests/jvm_archive.py)")
    # Each JVM (the launcher, then the driver) logs where it took each class from.
    logged = f"-Xlog:class+load=info:file={tmp_path}/classes-%p.log"
    subprocess.run(
        [sys.executable, "-c", STARTS_A_DRIVER],
        env=os.environ | {"JAVA_TOOL_OPTIONS": f"{options} {logged}"},
        cwd=Path(__file__).resolve().parent.parent,
        check=True,
        capture_output=True,
        timeout=300,
    )
    sources = {
        found.group(1)
        for log in tmp_path.glob("classes-*.log")
        for found in re.finditer(r" org\.apache\.spark\.SparkContext source: (.+)", log.read_text())
    }
    assert sources == {"shared objects file (top)"}
