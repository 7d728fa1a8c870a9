"""The Flink side of bench.harness.flink, run by the Python of Flink's own virtual environment
(``.venv-flink``: PyFlink pins py4j, pandas and pyarrow below what Strata's environment
holds), never imported by Strata's: it needs nothing but the standard library and PyFlink.

    <.venv-flink>/bin/python bench/harness/flink_worker.py SPEC.json

SPEC.json: ``{"config": {key: value}, "jobs": [{"name", "statements", "inserts",
"outputs", "runs", "reset"}]}``. For each job, in a TableEnvironment of its own (streaming mode, a
local mini-cluster in this process's JVM, the one every job shares, so a later run finds
the JVM warm), the ``statements`` (CREATE TABLE ...) run once; then ``runs`` times, each
after emptying the sinks' ``outputs`` directories and running the ``reset`` statements
(DROP TABLE of a sink that CREATE TABLE ... AS SELECT makes): the ``inserts`` as one Flink
job (a statement set), submitted and awaited. Prints, as its last line, ``FLINK-RESULT`` and a
JSON object: for each job, per run the wall-clock seconds from submission to the job's end
(``wall_s``) and Flink's own net runtime of the job (``net_s``); or, for a job Flink
refused or failed, ``{"error": ...}`` (the other jobs still run).
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

MARK = "FLINK-RESULT "


def run_job(job: dict[str, Any], config: dict[str, str]) -> list[dict[str, float]]:
    from pyflink.table import (  # type: ignore[import-not-found]
        EnvironmentSettings,
        TableEnvironment,
    )

    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    for key, value in config.items():
        env.get_config().set(key, value)
    for statement in job["statements"]:
        env.execute_sql(statement)
    runs = []
    for _ in range(job["runs"]):
        for output in job["outputs"]:
            shutil.rmtree(output, ignore_errors=True)
            Path(output).mkdir(parents=True)
        for statement in job.get("reset", []):  # a sink that CREATE TABLE ... AS makes anew
            env.execute_sql(statement)
        started = time.perf_counter()
        if len(job["inserts"]) == 1:
            result = env.execute_sql(job["inserts"][0])
        else:
            statements = env.create_statement_set()
            for insert in job["inserts"]:
                statements.add_insert_sql(insert)
            result = statements.execute()
        result.wait()
        wall = time.perf_counter() - started
        done = result.get_job_client().get_job_execution_result().result()
        runs.append({"wall_s": wall, "net_s": done.get_net_runtime() / 1000})
        print(f"{job['name']}: {wall:.2f}s ({runs[-1]['net_s']:.2f}s net)", flush=True)
    return runs


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    results: dict[str, Any] = {}
    for job in spec["jobs"]:
        try:
            results[job["name"]] = run_job(job, spec["config"])
        except Exception as error:  # a statement Flink refuses: said, and the next job runs
            said = str(error).strip().splitlines()
            cause = [line for line in said if "Exception:" in line][-1:] or said[:1]
            results[job["name"]] = {"error": (cause[0] if cause else repr(error))[:500]}
            print(f"{job['name']}: failed: {results[job['name']]['error']}", flush=True)
    print(MARK + json.dumps(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
