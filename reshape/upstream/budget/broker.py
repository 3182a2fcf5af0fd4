"""The budget broker: one per `reshape run --workers N`, in the supervisor, on a unix socket.

Each worker connects once at start-up and is one holder of the ledger (ledger.py) for as long as
its connection lasts: when a worker dies, the kernel closes its socket (and its origin
connections), and every slot it held goes back at once. The broker also keeps what the workers
learned about origins (facts.py), tells it to each worker that connects, and passes on news to
the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections import defaultdict
from pathlib import Path

from reshape.upstream.budget.facts import OriginFacts
from reshape.upstream.budget.ledger import LedgerError, LedgerStats, Send, SlotLedger
from reshape.upstream.budget.messages import (
    Acquire,
    Cancel,
    Learned,
    Message,
    MessageError,
    Release,
    Takes,
    decode,
    encode,
)

log = logging.getLogger("reshape.upstream.budget")


class BudgetBroker:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.ledger = SlotLedger()
        self.facts = OriginFacts()
        self._writers: dict[int, asyncio.StreamWriter] = {}
        self._holders = itertools.count(1)
        self._server: asyncio.Server | None = None
        self._sessions: set[asyncio.Task[None]] = set()

    @property
    def stats(self) -> LedgerStats:
        return self.ledger.stats

    @property
    def workers(self) -> int:
        return len(self._writers)

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._serve, str(self.path))

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        # Closing a session's socket ends its reading (cancelling its task instead would make
        # asyncio's stream server log the cancellation as an error).
        for writer in self._writers.values():
            writer.close()
        await asyncio.gather(*self._sessions, return_exceptions=True)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._sessions.add(task)
        holder = next(self._holders)
        self._writers[holder] = writer
        writer.write(b"".join(encode(fact) for fact in self.facts.all()))
        try:
            async for line in reader:
                try:
                    message = decode(line)
                except MessageError as e:
                    log.error("budget: worker %d: %s", holder, e)
                    continue
                self._receive(holder, message)
        except (ConnectionError, OSError):
            pass  # a worker that dies mid-write: gone, as below
        finally:
            del self._writers[holder]
            self._dispatch(self.ledger.holder_gone(holder))
            writer.close()
            self._sessions.discard(task)

    def _receive(self, holder: int, message: Message) -> None:
        try:
            match message:
                case Acquire(ticket, pool, cap, speculative):
                    sends = self.ledger.acquire(holder, ticket, pool, cap, speculative=speculative)
                case Cancel(ticket):
                    sends = self.ledger.cancel(holder, ticket)
                case Release(pool):
                    sends = self.ledger.release(holder, pool)
                case Learned() | Takes():
                    if self.facts.learn(message):
                        line = encode(message)
                        for other, writer in self._writers.items():
                            if other != holder:
                                writer.write(line)
                    return
                case _:
                    log.error(
                        "budget: unexpected %s from worker %d", type(message).__name__, holder
                    )
                    return
        except LedgerError as e:
            # Our own worker's bookkeeping is off; dropping it would free slots it still uses.
            log.error("budget: worker %d: %s", holder, e)
            return
        self._dispatch(sends)

    def _dispatch(self, sends: list[Send]) -> None:
        """One write per worker for everything one event caused."""
        lines: defaultdict[int, list[bytes]] = defaultdict(list)
        for holder, message in sends:
            lines[holder].append(encode(message))
        for holder, encoded in lines.items():
            writer = self._writers.get(holder)
            if writer is not None:
                writer.write(b"".join(encoded))
