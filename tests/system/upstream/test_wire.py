"""What an origin sent before it reset the connection is delivered, even when the reset is
first seen by a write (asyncio and uvloop then close the transport without reading on)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

from reshape.upstream.wire import Wire, WireError

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
FIRST = b"GET /1 HTTP/1.1\r\nHost: o\r\n\r\n"
SECOND = b"GET /2 HTTP/1.1\r\nHost: o\r\n\r\n"


def answer_then_reset(listener: socket.socket) -> None:
    """Read the first request, answer it, and close with the second one unread: a reset."""
    conn, _ = listener.accept()
    with conn:
        assert conn.recv(len(FIRST), socket.MSG_WAITALL) == FIRST
        conn.sendall(ANSWER)
        time.sleep(0.1)


def run(
    loop_factory: Callable[[], asyncio.AbstractEventLoop], main: Coroutine[Any, Any, bytes]
) -> bytes:
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(main)


@pytest.mark.parametrize(
    "loop_factory", [asyncio.new_event_loop, uvloop.new_event_loop], ids=["asyncio", "uvloop"]
)
def test_an_answer_that_arrived_before_a_reset_is_read_after_a_failed_write(
    loop_factory: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        # The origin leaves a request unread when it closes, so the kernel resets the connection.
        origin = threading.Thread(target=answer_then_reset, args=(listener,))
        origin.start()
        port = listener.getsockname()[1]

        async def main() -> bytes:
            wire = await Wire.open("127.0.0.1", port, tls=None, timeout=5)
            wire.write(FIRST + SECOND)
            # Block the loop: the answer and the reset both arrive before it reads anything.
            time.sleep(0.5)
            wire.write(b"GET /3 HTTP/1.1\r\nHost: o\r\n\r\n")  # fails on the reset
            received = b""
            try:
                while chunk := await asyncio.wait_for(wire.read(), 5):
                    received += chunk
            except WireError:
                pass
            return received

        received = run(loop_factory, main())
        origin.join(5)
    assert received == ANSWER
