"""reshape/upstream/body_reader.py: a streamed body read until the driver has no use for it."""

from __future__ import annotations

import asyncio

import pytest

from reshape.upstream.body_reader import BodyAbandoned, BodyReader


class Upload:
    """A client's body: chunks sent one at a time; `closed` once its reader closes it (as
    reshape/mitm/engine_channel.py's `_BodyStream`, its own iterator)."""

    def __init__(self) -> None:
        self.sent: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.closed = False

    def __aiter__(self) -> Upload:
        return self

    async def __anext__(self) -> bytes:
        chunk = await self.sent.get()
        if chunk is None:
            raise StopAsyncIteration
        return chunk

    async def aclose(self) -> None:
        self.closed = True


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


async def test_the_chunks_then_the_end() -> None:
    upload = Upload()
    for chunk in (b"a", b"b", None):
        upload.sent.put_nowait(chunk)
    reader = BodyReader(upload)
    wake = asyncio.Event()
    assert [await reader.next(wake, lambda: False) for _ in range(3)] == [b"a", b"b", None]
    await reader.close()
    assert upload.closed


async def test_a_driver_done_with_the_body_reads_none_of_it() -> None:
    upload = Upload()
    upload.sent.put_nowait(b"a")
    reader = BodyReader(upload)
    with pytest.raises(BodyAbandoned):
        await reader.next(asyncio.Event(), lambda: True)
    await reader.close()
    assert upload.closed and upload.sent.qsize() == 1


async def test_the_wait_for_a_paused_client_ends_when_the_driver_is_done() -> None:
    # Each wake asks the driver again; only its "done" ends the wait, and the pending read of
    # the client's next chunk is cancelled, the body closed.
    upload = Upload()
    reader = BodyReader(upload)
    wake = asyncio.Event()
    done = False
    asked = 0

    def stopped() -> bool:
        nonlocal asked
        asked += 1
        return done

    waiting = asyncio.ensure_future(reader.next(wake, stopped))
    for _ in range(3):
        await settle()
        wake.set()  # something arrived that does not end it (an interim response, say)
    await settle()
    assert not waiting.done() and asked == 4  # once at first, once per wake: no busy loop
    done = True
    wake.set()
    with pytest.raises(BodyAbandoned):
        await waiting
    await reader.close()
    assert upload.closed
    upload.sent.put_nowait(b"late")  # nobody reads it


async def test_a_chunk_sent_before_the_wake_is_read() -> None:
    upload = Upload()
    reader = BodyReader(upload)
    wake = asyncio.Event()
    waiting = asyncio.ensure_future(reader.next(wake, lambda: False))
    await settle()
    upload.sent.put_nowait(b"a")
    wake.set()
    assert await waiting == b"a"
    await reader.close()


async def test_only_a_wait_for_the_client_is_reported() -> None:
    # A chunk already there is no wait (the origin's clock goes on); an empty buffer is one,
    # from the read's start to the chunk's coming, and so is the wait the driver ends.
    upload = Upload()
    upload.sent.put_nowait(b"a")
    told: list[bool] = []
    reader = BodyReader(upload, told.append)
    wake = asyncio.Event()
    assert await reader.next(wake, lambda: False) == b"a"
    assert told == []
    waiting = asyncio.ensure_future(reader.next(wake, lambda: False))
    await settle()
    assert told == [True]
    upload.sent.put_nowait(b"b")
    assert await waiting == b"b"
    assert told == [True, False]
    done = False
    abandoned = asyncio.ensure_future(reader.next(wake, lambda: done))
    await settle()
    done = True
    wake.set()
    with pytest.raises(BodyAbandoned):
        await abandoned
    assert told == [True, False, True, False]
    await reader.close()
