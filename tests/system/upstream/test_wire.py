"""What an origin sent before it reset the connection is delivered, even when the reset is
first seen by a write (asyncio and uvloop then close the transport without reading on)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
import uvloop

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
