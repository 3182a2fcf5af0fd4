"""A streamed request body as a connection driver reads it: chunk by chunk, the wait for the
client's next chunk given up as soon as the driver has no more use for it.

A client may pause its upload for any time (a slow link, a browser streaming a body as it makes
it). Meanwhile the origin may reset the stream, answer before the body's end, or close the
connection: the exchange must end then, so that the client gets its answer or its error at once,
not when (if ever) its next chunk comes. `async for chunk in body` cannot be interrupted so;
`BodyReader.next` waits for the next chunk and for the driver's event together.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, Callable


class BodyAbandoned(Exception):
    """The driver's `stopped()` held while the body was read: it is read no further."""


class BodyReader:
    """`waiting`, if given, is told True when a read has to wait for the client (no chunk is
    there yet) and False when that wait ends: the time between is the client's, not the
    origin's (`UpstreamRequest.waiting_for_client`)."""

    def __init__(
        self, body: AsyncIterable[bytes], waiting: Callable[[bool], None] | None = None
    ) -> None:
        self._chunks = aiter(body)
        self._step: asyncio.Future[bytes | None] | None = None
        self._waiting = waiting

    async def next(self, wake: asyncio.Event, stopped: Callable[[], bool]) -> bytes | None:
        """The next chunk, or None at the body's end; BodyAbandoned as soon as `stopped()`
        holds, checked first and each time `wake` is set while the chunk is awaited (`wake` is
        cleared before each wait: whatever sets it must set it again for each new occasion)."""
        if stopped():
            raise BodyAbandoned
        # Eager: a chunk already buffered (a client faster than the origin) comes back at once,
        # without a task switch or a wait (~2 us a chunk instead of ~15).
        step = self._step = asyncio.Task(
            anext(self._chunks, None), loop=asyncio.get_running_loop(), eager_start=True
        )
        if not step.done():
            await self._wait(step, wake, stopped)
        self._step = None
        return step.result()

    async def _wait(
        self, step: asyncio.Future[bytes | None], wake: asyncio.Event, stopped: Callable[[], bool]
    ) -> None:
        if self._waiting is not None:
            self._waiting(True)
        try:
            while not step.done():
                wake.clear()
                woken = asyncio.ensure_future(wake.wait())
                try:
                    await asyncio.wait((step, woken), return_when=asyncio.FIRST_COMPLETED)
                finally:
                    woken.cancel()
                if not step.done() and stopped():
                    raise BodyAbandoned
        finally:
            if self._waiting is not None:
                self._waiting(False)

    async def close(self) -> None:
        """Read no more: a wait for the client's next chunk is cancelled and the body closed
        (its source drops what the client still sends)."""
        step, self._step = self._step, None
        if step is not None:
            if not step.done():
                step.cancel()
                await asyncio.wait((step,))
            if not step.cancelled():
                step.exception()  # retrieved: the body's own failure no longer matters
        close = getattr(self._chunks, "aclose", None)
        if close is not None:
            await close()
