"""Network helpers shared by the server, the benchmarks and the tests."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port of ``host`` that nothing listens on now. The socket is closed before the
    caller binds the port, so another process may take it in between: a caller that cannot
    afford that (the embedded PostgreSQL) checks again when it binds."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
