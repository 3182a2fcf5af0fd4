"""A worker's side of the shared connection budget (the `ConnectionBudget` its engine consults).

Before the engine opens a connection it asks the broker for a slot of the pool's cap and waits
for the grant (the request meanwhile waits in its pool's queue, under its queue timeout); when a
connection that held a slot is gone, the slot goes back. The broker's requests for slots back
(`Reclaim`) become the pool's ceiling and lending (reshape/upstream/pool.py `set_ceiling`,
`lend`). What the engine learns about origins goes to the broker, and what the other workers
learned comes back, for the pools this engine creates.

If the broker goes away (it lives in the supervisor, so only when that is stopping or broken),
the worker carries on with its own caps and says so in the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from reshape.upstream.budget import PoolIdentity
from reshape.upstream.budget.facts import OriginFacts
from reshape.upstream.budget.messages import (
    Acquire,
    Cancel,
    Deny,
    Grant,
    Learned,
    Message,
    MessageError,
    Reclaim,
    Release,
    Takes,
    decode,
    encode,
)
from reshape.upstream.pool import PoolKey, Proto

log = logging.getLogger("reshape.upstream.budget")

# How long a connection stays idle before it goes to another worker that waits for a slot: long
# enough to keep it through the gaps between one page's requests, short enough that the waiting
# worker's request is not held long.
LEND_AFTER_IDLE = 0.25


class SharedPools(Protocol):
    """What the client asks of the engine: give slots back."""

    def limit_pool(self, pool_id: PoolIdentity, ceiling: int | None) -> None: ...

    def lend_from_pool(self, pool_id: PoolIdentity, count: int, after: float) -> None: ...

    def pipelining_broken_elsewhere(self, key: PoolKey) -> None: ...


def pool_name(pool_id: PoolIdentity) -> str:
    """A pool's name in the broker: the same in every worker for the same pool id (its repr is
    made of frozen dataclasses of plain values), and readable in a log."""
    digest = hashlib.blake2b(repr(pool_id).encode(), digest_size=8).hexdigest()
    return f"{pool_id[0]}#{digest}"


@dataclass(eq=False)
class _PoolState:
    """This worker's slots of one pool, and what the broker asks of it."""

    pool_id: PoolIdentity
    name: str
    held: int = 0  # slots granted, not yet released
    waiting: int = 0  # acquires waiting for the broker (their connections count in the pool)
    ceiling: int | None = None  # as the broker asked: slots to hold at most
    applied: int | None = None  # the pool's ceiling as last set
    lending: bool = False

    @property
    def unused(self) -> bool:
        return not self.held and not self.waiting and self.ceiling is None and not self.lending


class BudgetClient:
    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pools: SharedPools
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._pools = pools
        self._facts = OriginFacts()
        self._tickets = itertools.count(1)
        self._waiting: dict[int, tuple[asyncio.Future[bool], _PoolState]] = {}
        self._by_id: dict[PoolIdentity, _PoolState] = {}
        self._by_name: dict[str, _PoolState] = {}
        self._closing = False
        self._alone = False  # the broker went away: the engine's own caps from then on
        self._task = asyncio.get_running_loop().create_task(self._read(), name="budget client")

    @classmethod
    async def connect(cls, path: Path, pools: SharedPools) -> BudgetClient:
        reader, writer = await asyncio.open_unix_connection(str(path))
        return cls(reader, writer, pools)

    async def close(self) -> None:
        self._closing = True
        self._writer.close()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    # ConnectionBudget

    async def acquire(self, pool_id: PoolIdentity, cap: int, *, speculative: bool) -> bool:
        if self._alone:
            return True
        state = self._state(pool_id)
        ticket = next(self._tickets)
        future = asyncio.get_running_loop().create_future()
        self._waiting[ticket] = (future, state)
        state.waiting += 1
        # The pool counts this connection already: so does its ceiling.
        self._apply_ceiling(state)
        self._send(Acquire(ticket, state.name, cap, speculative))
        try:
            return await future
        except asyncio.CancelledError:
            if self._waiting.pop(ticket, None) is not None:
                self._send(Cancel(ticket))
            elif future.done() and not future.cancelled() and future.result():
                self._release_now(pool_id)  # granted just as the connect was called off
            raise
        finally:
            # The ceiling is not lowered to match here (a denied connect is still in the pool
            # until the engine drops it): one too high lets the pool open a connect that waits.
            state.waiting -= 1
            self._forget_if_unused(state)

    def release(self, pool_id: PoolIdentity) -> None:
        # On the next turn of the loop: the connection's socket closes in a callback that its
        # transport's close() scheduled before this, so the origin sees it closed before the
        # broker can hand the slot to another worker.
        asyncio.get_running_loop().call_soon(self._release_now, pool_id)

    def protocol(self, key: PoolKey) -> Proto | None:
        return self._facts.protocol(key)

    def protocol_learned(self, key: PoolKey, proto: Proto) -> None:
        self._share(Learned(key, proto))

    def breaks_pipelining(self, key: PoolKey) -> bool:
        return self._facts.breaks_pipelining(key)

    def pipelining_broke(self, key: PoolKey) -> None:
        self._share(Learned(key, None))

    def requests_per_connection(self, key: PoolKey) -> int | None:
        return self._facts.requests_per_connection(key)

    def requests_per_connection_learned(self, key: PoolKey, count: int) -> None:
        self._share(Takes(key, count))

    # plumbing

    def _share(self, fact: Learned | Takes) -> None:
        if self._facts.learn(fact):
            self._send(fact)

    def _state(self, pool_id: PoolIdentity) -> _PoolState:
        state = self._by_id.get(pool_id)
        if state is None:
            state = _PoolState(pool_id, pool_name(pool_id))
            self._by_id[pool_id] = self._by_name[state.name] = state
        return state

    def _forget_if_unused(self, state: _PoolState) -> None:
        if state.unused:
            self._by_id.pop(state.pool_id, None)
            self._by_name.pop(state.name, None)

    def _release_now(self, pool_id: PoolIdentity) -> None:
        if self._alone or self._closing:
            return
        state = self._by_id.get(pool_id)
        if state is None:  # not the engine's way: give the broker what it counts anyway
            log.error("budget: a slot released that was never granted (%s)", pool_id[0])
            self._send(Release(pool_name(pool_id)))
            return
        state.held -= 1
        self._send(Release(state.name))
        self._forget_if_unused(state)

    def _apply_ceiling(self, state: _PoolState) -> None:
        """The pool's ceiling: the slots the broker lets this worker keep, plus the connections
        that wait for a slot (which the pool counts, and the broker does not)."""
        ceiling = None if state.ceiling is None else state.ceiling + state.waiting
        if ceiling != state.applied:
            state.applied = ceiling
            self._pools.limit_pool(state.pool_id, ceiling)

    def _send(self, message: Message) -> None:
        if not self._alone and not self._writer.is_closing():
            self._writer.write(encode(message))

    async def _read(self) -> None:
        try:
            async for line in self._reader:
                try:
                    self._receive(decode(line))
                except MessageError as e:
                    log.error("budget: %s", e)
        except (ConnectionError, OSError) as e:
            if not self._closing:
                log.error("budget broker connection broke: %s", e)
        if not self._closing:
            self._go_alone()

    def _receive(self, message: Message) -> None:
        match message:
            case Grant(ticket, pool):
                entry = self._waiting.pop(ticket, None)
                if entry is None or entry[0].done():  # its connect was called off meanwhile
                    self._send(Release(pool))
                    return
                future, state = entry
                state.held += 1
                future.set_result(True)
            case Deny(ticket):
                entry = self._waiting.pop(ticket, None)
                if entry is not None and not entry[0].done():
                    entry[0].set_result(False)
            case Reclaim(pool, ceiling, idle):
                asked = self._by_name.get(pool)
                if asked is None:
                    return  # nothing held there any more
                asked.ceiling = ceiling
                self._apply_ceiling(asked)
                if idle or asked.lending:
                    asked.lending = idle > 0
                    self._pools.lend_from_pool(asked.pool_id, idle, LEND_AFTER_IDLE)
                self._forget_if_unused(asked)
            case Learned(key, proto):
                self._facts.learn(message)
                if proto is None:
                    self._pools.pipelining_broken_elsewhere(key)
            case Takes():
                self._facts.learn(message)  # for the pools that open from now on
            case _:
                log.error("budget: unexpected %s from the broker", type(message).__name__)

    def _go_alone(self) -> None:
        log.error(
            "budget broker gone: this worker keeps its own per-host caps from now on, "
            "which no longer hold across workers"
        )
        self._alone = True
        for future, _ in self._waiting.values():
            if not future.done():
                future.set_result(True)
        self._waiting.clear()
        for state in self._by_id.values():
            if state.applied is not None:
                self._pools.limit_pool(state.pool_id, None)
            if state.lending:
                self._pools.lend_from_pool(state.pool_id, 0, LEND_AFTER_IDLE)
        self._by_id.clear()
        self._by_name.clear()
