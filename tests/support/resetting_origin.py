"""An origin that answers one request and resets the connection, with a second request unread
(the kernel resets a connection closed with unread input): what an origin that drops a
pipeline does. `FIRST` gets `ANSWER`; `SECOND` is never read."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
FIRST = b"GET /1 HTTP/1.1\r\nHost: o\r\n\r\n"
SECOND = b"GET /2 HTTP/1.1\r\nHost: o\r\n\r\n"
THIRD = b"GET /3 HTTP/1.1\r\nHost: o\r\n\r\n"


def _answer_then_reset(listener: socket.socket) -> None:
    conn, _ = listener.accept()
    with conn:
        assert conn.recv(len(FIRST), socket.MSG_WAITALL) == FIRST
        conn.sendall(ANSWER)
        time.sleep(0.1)


@contextmanager
def resetting_origin() -> Iterator[int]:
    """Serves one connection on 127.0.0.1; yields its port."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        origin = threading.Thread(target=_answer_then_reset, args=(listener,))
        origin.start()
        try:
            yield listener.getsockname()[1]
        finally:
            origin.join(5)
