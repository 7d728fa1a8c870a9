"""The `strata` command: `strata up` runs everything, `strata info` says where it is,
`strata cluster` runs a Spark standalone cluster on this machine."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from server.settings import Settings

if TYPE_CHECKING:  # imported when needed: `strata info` need not load them
    import uvicorn

    from server.runtime import Runtime
    from server.shutdown import Shutdown


def _settings(args: argparse.Namespace) -> Settings:
    overrides: dict[str, object] = {}
    if getattr(args, "port", None) is not None:
        overrides["port"] = args.port
    if getattr(args, "host", None) is not None:
        overrides["host"] = args.host
    if getattr(args, "pg_port", None) is not None:
        overrides["pg_port"] = args.pg_port
    if args.data_dir is not None:
        overrides["data_dir"] = Path(args.data_dir)
    for name in ("node", "ddl_owner", "min_copies"):
        if getattr(args, name, None) is not None:
            overrides[name] = getattr(args, name)
    if getattr(args, "peers", None) is not None:
        overrides["peers"] = tuple(u.strip() for u in args.peers.split(",") if u.strip())
    return Settings(**overrides)  # type: ignore[arg-type]


def up(args: argparse.Namespace) -> int:
    from server.errors import SecretSettingError, SqlPortError
    from server.runtime import running
    from server.security import Tokens, secret
    from server.shutdown import Shutdown, ShutdownRequested  # noqa: F811

    settings = _settings(args)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        # Secrets are checked before anything starts: a token file that is missing fails fast.
        tokens = Tokens.from_settings(settings)
        secret(settings, "reader_password")
    except SecretSettingError as exc:
        print(f"strata: {exc}", file=sys.stderr)
        return 2
    problem = settings.cluster_problem() or settings.sharing_problem()
    if problem is not None:
        print(f"strata: {problem}", file=sys.stderr)
        return 2
    if not tokens.enabled and settings.host not in ("127.0.0.1", "localhost", "::1"):
        logging.getLogger("strata").warning(
            "no API token is set (STRATA_API_TOKEN): every endpoint is open to whoever "
            "reaches %s:%d",
            settings.host,
            settings.port,
        )
    # From here on SIGINT and SIGTERM stop everything in order (server/shutdown.py).
    shutdown = Shutdown(settings.shutdown_timeout)
    shutdown.install_handlers()
    try:
        with running(settings, shutdown) as runtime:
            _serve(runtime, settings, shutdown)
    except ShutdownRequested:
        pass  # a signal during start-up: `running` stopped what had started
    except SqlPortError as exc:
        print(f"strata: {exc}", file=sys.stderr)
        return 2
    # Everything is stopped. The interpreter's own teardown (freeing every module's objects:
    # pyspark, pyarrow, ...) takes seconds of a busy machine and would count against the
    # time `docker stop` gives us, for nothing: the kernel releases what is left.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _serve(runtime: Runtime, settings: Settings, shutdown: Shutdown) -> None:
    import uvicorn

    from server.api.app import create_app
    from server.security import redacted_url
    from server.shutdown import HTTP_SHARE

    details = runtime.info()
    app = create_app(runtime.service, settings, details)
    # The console is a log: no password of the database URLs (GET /info has them).
    shown = details | {
        key: redacted_url(str(details[key]))
        for key in ("database_url", "psql_url")
        if details.get(key)
    }
    print(json.dumps(shown), flush=True)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level="info",
        timeout_graceful_shutdown=max(1, int(settings.shutdown_timeout * HTTP_SHARE)),
        # The app has no startup or shutdown handlers (the runtime starts and stops around
        # it): without the lifespan protocol, a stop cannot cancel its waiting task and
        # log that as an error (fastapi 0.165's lifespan did, once in a CI-sized run).
        lifespan="off",
    )
    server = _http_server(config, shutdown)
    shutdown.on_request(lambda: setattr(server, "should_exit", True))
    shutdown.serving()
    server.run()


def _http_server(config: uvicorn.Config, shutdown: Shutdown) -> uvicorn.Server:
    import uvicorn

    class HttpServer(uvicorn.Server):
        """uvicorn's server, whose signal handler (installed while it runs) also starts
        Strata's stop at once: the workers and Spark need not wait for HTTP to drain."""

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            shutdown.handle_signal(sig, frame)
            super().handle_exit(sig, frame)
            # Our handler has seen it: uvicorn must not raise it again once it is done.
            self._captured_signals.clear()

    return HttpServer(config)


def info(args: argparse.Namespace) -> int:
    from server.runtime import stored_info

    print(json.dumps(stored_info(_settings(args)), indent=2))
    return 0


def backfill_status(args: argparse.Namespace) -> int:
    """Print each derived stream's back-fill as a progress bar (asks the running server)."""
    import httpx

    from server.runtime import stored_info
    from server.security import secret

    settings = _settings(args)
    base = str(stored_info(settings).get("http") or "http://127.0.0.1:8080")
    # The same environment as `strata up`: its full or read token, if any.
    token = secret(settings, "api_token") or secret(settings, "read_token")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = httpx.get(f"{base}/streams", headers=headers, timeout=30)
    if response.status_code in (401, 403):
        print(
            f"strata: {response.json().get('error')} (set STRATA_API_TOKEN or STRATA_READ_TOKEN)",
            file=sys.stderr,
        )
        return 1
    streams = response.json()
    for stream in streams:
        if stream["kind"] == "raw":
            continue
        progress = httpx.get(
            f"{base}/streams/{stream['name']}", headers=headers, timeout=30
        ).json()["progress"]
        altering = progress.get("alter")
        if altering and altering["state"] == "building":
            print(
                f"{stream['name']:<30} ALTER STREAM to version {altering['version']}: "
                f"{altering['rows_done']:,}/{altering['rows_total']:,} rows back-filled into "
                f"{', '.join(altering['building'])}; swapped in once caught up"
            )
        backfill = progress.get("backfill")
        if backfill is None:
            continue
        total = backfill["rows_total"] or 1
        share = min(backfill["rows_done"] / total, 1.0) if backfill["rows_total"] else 1.0
        bar = "#" * round(share * 30)
        eta = backfill["eta_seconds"]
        print(
            f"{stream['name']:<30} [{bar:<30}] {share:6.1%} "
            f"{backfill['rows_done']:,}/{backfill['rows_total']:,} rows "
            f"{backfill['rows_per_second']:,} rows/s "
            f"{backfill['state']}{'' if eta in (0, None) else f', ETA {eta:.0f} s'}"
        )
    return 0


def _ingest_target(args: argparse.Namespace) -> tuple[list[str], str | None]:
    """The nodes ``--nodes`` names, and the token of this environment that may post runs
    (STRATA_API_TOKEN or STRATA_INGEST_TOKEN, as `strata up` reads them)."""
    from server.security import secret

    settings = Settings()  # type: ignore[call-arg]  # from the environment
    token = secret(settings, "api_token") or secret(settings, "ingest_token")
    return [u.strip() for u in args.nodes.split(",") if u.strip()], token


def post(args: argparse.Namespace) -> int:
    """Post a file (or stdin) as one run, to the first of ``--nodes`` that acknowledges it
    (server/client.py: on a connection error, a timeout or a 5xx, the next node, same run
    id)."""
    import hashlib

    from server.client import FailoverClient, NoNodeAnswered, RunRefused

    data = sys.stdin.buffer.read() if args.file == "-" else Path(args.file).read_bytes()
    csv = args.format == "csv" or (args.format is None and str(args.file).endswith(".csv"))
    # By default the run id is the content's hash: posting the same file again is the
    # same run, which no node makes twice.
    run_id = args.run_id or "sha256-" + hashlib.sha256(data).hexdigest()[:32]
    nodes, token = _ingest_target(args)
    try:
        with FailoverClient(nodes, token=token, deadline=args.deadline) as client:
            answer = client.post_run(
                args.stream,
                data,
                run_id=run_id,
                content_type="text/csv" if csv else "application/x-ndjson",
                wait=args.wait,
            )
    except RunRefused as refused:
        print(f"strata: {refused}", file=sys.stderr)
        return 1
    except NoNodeAnswered as unanswered:
        print(f"strata: {unanswered}", file=sys.stderr)
        return 3
    print(json.dumps(answer))
    return 0


def load(args: argparse.Namespace) -> int:
    """Load files, directories, globs or stdin as runs (server/loader.py)."""
    from server.client import NoNodeAnswered
    from server.loader import LoadFailed
    from server.loader import load as load_runs

    nodes, token = _ingest_target(args)
    try:
        done = load_runs(
            args.stream,
            args.paths,
            nodes,
            fmt=args.format,
            run_rows=args.run_rows,
            concurrency=args.concurrency,
            token=token,
            wait_commit=args.wait,
            quiet=args.quiet,
        )
    except LoadFailed as failed:
        print(f"\nstrata load: {failed}", file=sys.stderr)
        return 1
    except NoNodeAnswered as unanswered:
        print(f"\nstrata load: {unanswered}", file=sys.stderr)
        return 3
    print(json.dumps({"runs": done.runs, "rows": done.rows}))
    return 0


def cluster(args: argparse.Namespace) -> int:
    """Run a Spark standalone cluster on loopback until Ctrl-C (or SIGTERM)."""
    from server.engines.cluster import LocalCluster

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.default_int_handler)
    directory = Path(args.dir) if args.dir else None
    local = LocalCluster(
        args.workers,
        cores=args.cores,
        memory=args.memory,
        port=args.port,
        webui_port=args.webui_port,
        directory=directory,
        join=args.join,
    )
    try:
        with local:
            print(
                json.dumps(
                    {
                        "master": local.master_url,
                        "web_ui": None if args.join else local.web_url,
                        "workers": len(local.workers),
                        "logs": str(local.directory / "logs"),
                    }
                ),
                flush=True,
            )
            if not args.join:
                print(f"export STRATA_SPARK_MASTER={local.master_url}", flush=True)
            while all(d.running() for d in [local.master, *local.workers] if d is not None):
                time.sleep(1)
            print("strata: a Spark daemon exited; stopping the cluster", file=sys.stderr)
            return 1
    except KeyboardInterrupt:
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="strata", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser("up", help="start PostgreSQL, Spark, the HTTP API and the SQL port")
    start.add_argument("--port", type=int, help="HTTP port (default 8080, STRATA_PORT)")
    start.add_argument("--host", help="HTTP address (default 127.0.0.1, STRATA_HOST)")
    start.add_argument(
        "--pg-port", type=int, help="SQL port (PostgreSQL protocol; default 5433, STRATA_PG_PORT)"
    )
    start.add_argument("--data-dir", help="data directory (default ./.strata, STRATA_DATA_DIR)")
    start.add_argument("--node", help="this node's name in a cluster (STRATA_NODE)")
    start.add_argument("--peers", help="the other nodes' HTTP URLs, comma-separated (STRATA_PEERS)")
    start.add_argument("--ddl-owner", help="the node that orders DDL (STRATA_DDL_OWNER)")
    start.add_argument(
        "--min-copies",
        type=int,
        help="nodes a run is durable on before it is acknowledged (default 1, STRATA_MIN_COPIES)",
    )
    start.set_defaults(run=up)
    show = commands.add_parser("info", help="print database_url and more as JSON")
    show.add_argument("--data-dir", help="data directory (default ./.strata, STRATA_DATA_DIR)")
    show.set_defaults(run=info)
    status = commands.add_parser(
        "backfill-status", help="progress of back-fills of new streams over history"
    )
    status.add_argument("--data-dir", help="data directory (default ./.strata, STRATA_DATA_DIR)")
    status.set_defaults(run=backfill_status)
    send = commands.add_parser(
        "post", help="post a file (or stdin) as one run, failing over between nodes"
    )
    send.add_argument("stream", help="the raw stream")
    send.add_argument("file", nargs="?", default="-", help="NDJSON or CSV file (- : stdin)")
    send.add_argument(
        "--nodes",
        default="http://127.0.0.1:8080",
        help="the nodes' HTTP URLs, comma-separated, tried in turn (default: this machine)",
    )
    send.add_argument("--run-id", help="the run id (default: the hash of the content)")
    send.add_argument("--format", choices=["ndjson", "csv"], help="default: by file name")
    send.add_argument("--wait", action="store_true", help="answer once committed")
    send.add_argument("--deadline", type=float, default=120.0, help="seconds to keep trying (120)")
    send.set_defaults(run=post)
    loader = commands.add_parser(
        "load",
        help="load files, directories, globs or stdin as runs (a re-run loads nothing twice)",
    )
    loader.add_argument("stream", help="the raw stream")
    loader.add_argument("paths", nargs="+", help="files, directories, globs, or - for stdin")
    loader.add_argument(
        "--nodes",
        default="http://127.0.0.1:8080",
        help="the nodes' HTTP URLs, comma-separated, tried in turn (default: this machine)",
    )
    loader.add_argument("--format", choices=["ndjson", "csv"], help="default: by file name")
    loader.add_argument("--run-rows", type=int, default=20_000, help="rows per run (20000)")
    loader.add_argument("--concurrency", type=int, default=4, help="runs in flight at once (4)")
    loader.add_argument("--wait", action="store_true", help="each run answered once committed")
    loader.add_argument("--quiet", action="store_true", help="no progress line")
    loader.set_defaults(run=load)
    spark = commands.add_parser(
        "cluster", help="run a Spark standalone cluster on 127.0.0.1 (for STRATA_SPARK_MASTER)"
    )
    spark.add_argument("--workers", type=int, default=2, help="number of workers (2)")
    spark.add_argument("--cores", type=int, default=1, help="cores of each worker (1)")
    spark.add_argument("--memory", default="1g", help="memory of each worker (1g)")
    spark.add_argument("--port", type=int, default=7077, help="master port (7077)")
    spark.add_argument("--webui-port", type=int, default=8081, help="master web UI port (8081)")
    spark.add_argument("--dir", help="logs and work dirs (default: a temp dir, removed)")
    spark.add_argument(
        "--join",
        metavar="MASTER",
        help="add the workers to the running cluster of this master (spark://host:port) "
        "instead of starting one; they leave it when this command stops",
    )
    spark.set_defaults(run=cluster)
    args = parser.parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
