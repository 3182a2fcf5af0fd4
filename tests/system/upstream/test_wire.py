"""What an origin sent before it reset the connection is delivered, even when the reset is
first seen by a write (asyncio and uvloop then close the transport without reading on)."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable

import pytest
import uvloop

from reshape.upstream.tls import TlsClient, client_context
from reshape.upstream.wire import Wire, WireError
from tests.support.resetting_origin import ANSWER, FIRST, SECOND, THIRD, resetting_origin


@pytest.mark.parametrize(
    "loop_factory", [asyncio.new_event_loop, uvloop.new_event_loop], ids=["asyncio", "uvloop"]
)
def test_an_answer_that_arrived_before_a_reset_is_read_after_a_failed_write(
    loop_factory: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    with resetting_origin() as port:

        async def main() -> bytes:
            wire = await Wire.open("127.0.0.1", port, tls=None, timeout=5)
            wire.write(FIRST + SECOND)
            # Block the loop: the answer and the reset both arrive before it reads anything.
            time.sleep(0.5)
            wire.write(THIRD)  # meets the reset
            received = b""
            try:
                while chunk := await asyncio.wait_for(wire.read(), 5):
                    received += chunk
            except WireError:
                pass
            return received

        with asyncio.Runner(loop_factory=loop_factory) as runner:
            received = runner.run(main())
    assert received == ANSWER


@pytest.mark.parametrize(
    "loop_factory", [asyncio.new_event_loop, uvloop.new_event_loop], ids=["asyncio", "uvloop"]
)
def test_a_handshake_nobody_awaits_fails_without_a_logged_traceback(
    loop_factory: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    """A connection closed before its TLS handshake ended, its opener gone (cancelled inside
    `create_connection`, after `connection_made`): the handshake's failure is the connection's,
    not a "Future exception was never retrieved" traceback in the log."""

    async def main() -> list[dict[str, object]]:
        reported: list[dict[str, object]] = []
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _, context: reported.append(context))
        server = await asyncio.start_server(lambda _r, _w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        tls = TlsClient(client_context(None, ["http/1.1"]), "origin.test")
        transport, wire = await loop.create_connection(lambda: Wire(tls), "127.0.0.1", port)
        transport.close()  # as create_connection does when cancelled after connection_made
        await asyncio.sleep(0.05)  # connection_lost
        assert wire.is_closed
        del wire
        gc.collect()
        await asyncio.sleep(0)
        server.close()
        return reported

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        reported = runner.run(main())
    assert [context.get("message") for context in reported] == []
