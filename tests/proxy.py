"""A TCP proxy a test controls, for the links between cluster nodes: ``pass`` forwards,
``drop`` closes every connection and refuses new ones, ``blackhole`` accepts and forwards
nothing (a peer that went silent: requests time out), ``delay`` forwards each chunk
``seconds`` late."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

from server.net import free_port


class TcpProxy:
    def __init__(self, target_port: int, host: str = "127.0.0.1") -> None:
        self.target = (host, target_port)
        self.port = free_port()
        self.mode = "pass"
        self.delay = 0.0
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._listener = socket.create_server((host, self.port), reuse_port=False)
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set(self, mode: str, delay: float = 0.0) -> None:
        assert mode in ("pass", "drop", "blackhole", "delay"), mode
        with self._lock:
            self.mode, self.delay = mode, delay
            if mode == "drop":  # a blackhole keeps connections open, silent
                for sock in self._open:
                    _close(sock)
                self._open.clear()

    def close(self) -> None:
        self._closed = True
        self.set("drop")
        _close(self._listener)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            mode = self.mode
            if mode == "drop":
                _close(client)
                continue
            if mode == "blackhole":
                with self._lock:
                    self._open.add(client)  # held open, silent, until the mode changes
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                _close(client)
                continue
            upstream.settimeout(None)
            with self._lock:
                self._open.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                mode, delay = self.mode, self.delay
                if mode == "drop":
                    break
                if mode == "blackhole":
                    continue  # swallowed: the other side hears nothing
                if mode == "delay" and delay:
                    time.sleep(delay)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            _close(source)
            _close(sink)
            with self._lock:
                self._open.discard(source)
                self._open.discard(sink)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
