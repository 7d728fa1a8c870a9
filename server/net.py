"""Network helpers shared by the server, the benchmarks and the tests."""

from __future__ import annotations

import random
import socket
from pathlib import Path

# Linux hands out the local port of every outgoing connection from this range. A port
# chosen in it can be taken by any connection (to PostgreSQL, between Spark's parts)
# between a server's stop and its restart on the same port: a listener chosen below it
# cannot.
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 10_000


def _ephemeral_low() -> int:
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default; other systems use 49152 and up


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port of ``host`` that nothing listens on now, below the range the system takes
    outgoing connections' ports from, so the port stays free for a restart. The socket is
    closed before the caller binds the port, so another process may take it in between: a
    caller that cannot afford that (the embedded PostgreSQL) checks again when it binds."""
    high = _ephemeral_low()
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(_LOWEST, high) if high > _LOWEST else 0
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
