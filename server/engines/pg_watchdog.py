"""The watchdog that stops an embedded PostgreSQL nobody uses any more.

The embedded PostgreSQL outlives a kill -9 of the server that started it, so that a restart
finds it running and reuses it. Without a restart it would run forever: this process,
started beside it, stops it once no process has held the data dir's in-use lock
(EmbeddedPostgres holds it, shared, from `start()` to `stop()`) for `linger` seconds. The
kernel drops a lock with the process that held it, however that process ended, so an empty
lock means exactly "every user is gone".

    python -m server.engines.pg_watchdog DATA_DIR LINGER

It detaches at once (a session of its own, not its starter's child) and ignores SIGINT and
SIGTERM, which reach it with a terminal's Ctrl-C or `systemctl stop`: its own job is to
stop once nothing is left to watch - the server stopped, and no process uses the data dir.
It takes the in-use lock exclusively whenever it decides, so a server starting meanwhile
waits for that decision (and then starts PostgreSQL anew if it was stopped).
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import IO

from server.engines.embedded_pg import IN_USE_LOCK, WATCHDOG_LOCK, EmbeddedPostgres

log = logging.getLogger("strata.pg_watchdog")

POLL_SECONDS = 0.5


def _try_lock(handle: IO[str]) -> bool:
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def watch(server: EmbeddedPostgres, in_use: IO[str], linger: float) -> None:
    """Return once the server is stopped and unused, stopping it after `linger` seconds
    unused; returns holding the in-use lock, so that no server starts until we let go."""
    unused_since: float | None = None
    while True:
        if _try_lock(in_use):
            if not server.running():
                log.info("PostgreSQL on %s is stopped and unused", server.pgdata)
                return
            now = time.monotonic()
            if unused_since is None:
                unused_since = now
                log.info(
                    "No process uses PostgreSQL on %s; stopping it in %gs unless one starts",
                    server.pgdata,
                    linger,
                )
            elif now - unused_since >= linger:
                log.info("PostgreSQL on %s unused for %gs: stopping it", server.pgdata, linger)
                server.stop()
                return
            fcntl.flock(in_use, fcntl.LOCK_UN)
        elif unused_since is not None:
            log.info("PostgreSQL on %s is in use again", server.pgdata)
            unused_since = None
        time.sleep(POLL_SECONDS)


def main(argv: list[str]) -> int:
    data_dir, linger = Path(argv[0]), float(argv[1])
    lock = open(data_dir / WATCHDOG_LOCK, "a")  # noqa: SIM115 - held for our lifetime
    if not _try_lock(lock):
        return 0  # another watchdog watches this data dir
    # Detach: the child keeps the lock (flock belongs to the open file, which it shares),
    # and our starter, waiting for us, goes on once we exit here.
    if os.fork() > 0:
        os._exit(0)
    os.setsid()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s watchdog[{os.getpid()}] %(levelname)s: %(message)s",
    )
    in_use = open(data_dir / IN_USE_LOCK, "a")  # noqa: SIM115 - closed last, below
    try:
        watch(EmbeddedPostgres(data_dir), in_use, linger)
    except Exception:
        log.exception("The watchdog failed; PostgreSQL on %s is no longer watched", data_dir)
        return 1
    finally:
        # The watchdog lock first: a server that waited for the in-use lock then finds no
        # watchdog and starts a new one.
        lock.close()
        in_use.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
