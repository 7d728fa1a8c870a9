"""The `strata` command: `strata up` runs everything, `strata info` says where it is."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from pathlib import Path

from server.settings import Settings


def _settings(args: argparse.Namespace) -> Settings:
    overrides: dict[str, object] = {}
    if getattr(args, "port", None) is not None:
        overrides["port"] = args.port
    if getattr(args, "host", None) is not None:
        overrides["host"] = args.host
    if args.data_dir is not None:
        overrides["data_dir"] = Path(args.data_dir)
    return Settings(**overrides)  # type: ignore[arg-type]


def _shutting_down(signum: int, _frame: object) -> None:
    logging.getLogger("strata").info("%s: shutting down", signal.Signals(signum).name)


def up(args: argparse.Namespace) -> int:
    import uvicorn

    from server.api.app import create_app
    from server.runtime import running

    settings = _settings(args)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)
    with running(settings) as runtime:
        details = runtime.info()
        app = create_app(runtime.service, settings, details)
        print(json.dumps(details), flush=True)
        # uvicorn turns SIGINT/SIGTERM into a graceful shutdown and, once done, raises
        # the signal again for the handler it found installed. That handler must not end
        # the process: `running` still has to stop the worker, Spark and PostgreSQL.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, _shutting_down)
        uvicorn.run(app, host=settings.host, port=settings.port, log_level="info")
    return 0


def info(args: argparse.Namespace) -> int:
    from server.runtime import stored_info

    print(json.dumps(stored_info(_settings(args)), indent=2))
    return 0


def backfill_status(args: argparse.Namespace) -> int:
    """Print each derived stream's back-fill as a progress bar (asks the running server)."""
    import httpx

    from server.runtime import stored_info

    base = str(stored_info(_settings(args)).get("http") or "http://127.0.0.1:8080")
    streams = httpx.get(f"{base}/streams", timeout=30).json()
    for stream in streams:
        if stream["kind"] == "raw":
            continue
        progress = httpx.get(f"{base}/streams/{stream['name']}", timeout=30).json()["progress"]
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="strata", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser("up", help="start PostgreSQL, Spark and the HTTP API")
    start.add_argument("--port", type=int, help="HTTP port (default 8080, STRATA_PORT)")
    start.add_argument("--host", help="HTTP address (default 127.0.0.1, STRATA_HOST)")
    start.add_argument("--data-dir", help="data directory (default ./.strata, STRATA_DATA_DIR)")
    start.set_defaults(run=up)
    show = commands.add_parser("info", help="print database_url and more as JSON")
    show.add_argument("--data-dir", help="data directory (default ./.strata, STRATA_DATA_DIR)")
    show.set_defaults(run=info)
    status = commands.add_parser(
        "backfill-status", help="progress of back-fills of new streams over history"
    )
    status.add_argument("--data-dir", help="data directory (default ./.strata, STRATA_DATA_DIR)")
    status.set_defaults(run=backfill_status)
    args = parser.parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
