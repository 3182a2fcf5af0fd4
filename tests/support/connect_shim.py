"""A listener that turns every connection into a CONNECT tunnel through a proxy, for clients
that cannot use a proxy themselves (h2spec): what they send reaches `target` through the proxy,
which answers the TLS handshake with a certificate of its own CA."""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Self


class ConnectShim:
    """On `host` (a free port, `port` once entered): each connection is relayed through
    `proxy` (host, port) with `CONNECT target`."""

    def __init__(self, proxy: tuple[str, int], target: str, host: str = "127.0.0.1") -> None:
        self.proxy = proxy
        self.target = target
        self._listener = socket.create_server((host, 0))
        self.host, self.port = self._listener.getsockname()[:2]
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopped.set()
        self._listener.close()
        self._thread.join(5)

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._tunnel, args=(client,), daemon=True).start()

    def _tunnel(self, client: socket.socket) -> None:
        with client, socket.create_connection(self.proxy, timeout=30) as upstream:
            upstream.sendall(
                f"CONNECT {self.target} HTTP/1.1\r\nHost: {self.target}\r\n\r\n".encode()
            )
            head = b""
            while b"\r\n\r\n" not in head:
                piece = upstream.recv(1)  # byte by byte: nothing after the head is consumed
                if not piece:
                    return
                head += piece
            if not head.startswith(b"HTTP/1.1 200"):
                return
            upstream.settimeout(None)
            done = threading.Event()
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pipe, args=(source, sink, done), daemon=True).start()
            done.wait()


def _pipe(source: socket.socket, sink: socket.socket, done: threading.Event) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)
    done.set()
