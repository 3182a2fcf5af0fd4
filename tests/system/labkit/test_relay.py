"""The lab's relay loses nothing a real link would deliver: an origin's answer that arrived
before its reset reaches the client, even when the relay's next write meets the reset first."""

from __future__ import annotations

import asyncio
import time

from labkit.relay import open_connection
from tests.support.resetting_origin import ANSWER, FIRST, SECOND, THIRD, resetting_origin


def test_a_stream_reads_what_arrived_before_a_reset_its_write_met() -> None:
    with resetting_origin() as port:

        async def main() -> bytes:
            reader, writer = await open_connection("127.0.0.1", port)
            writer.write(FIRST + SECOND)
            time.sleep(0.5)  # the answer and the reset arrive before the loop reads
            writer.write(THIRD)  # meets the reset
            received = await asyncio.wait_for(reader.read(), 5)  # to the end, no error
            writer.close()
            return received

        assert asyncio.run(main()) == ANSWER
