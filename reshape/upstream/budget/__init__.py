"""The per-host connection budget the workers of one `reshape run --workers N` share, and what
they learn about origins.

Each worker has its own engine and pools; without this, a cap of 2 connections per host would be
2 per worker. The pieces:

- ledger.py: who holds which slots of which cap, who waits, whom to ask for one back (sans-IO);
- facts.py: which origins speak HTTP/2, which break pipelines, how many requests each
  HTTP/1.1 origin takes on a connection (sans-IO);
- messages.py: what broker and workers say to each other, one JSON line each;
- broker.py: the asyncio server in the supervisor, over a unix socket;
- client.py: each worker's side, the `ConnectionBudget` its engine consults.

A single process (no --workers) has no budget: its engine's pools are the whole truth, and it
pays nothing for this.
"""

from __future__ import annotations

from typing import Protocol

from reshape.upstream.pool import PoolKey, Proto

# A pool's identity as the engine knows it (engine.PoolId), its destination first.
type PoolIdentity = tuple[object, ...]


class ConnectionBudget(Protocol):
    """What the engine asks of the budget shared with the other workers."""

    async def acquire(self, pool_id: PoolIdentity, cap: int, *, speculative: bool) -> bool:
        """A slot of the pool's cap before a connection opens: waits while the other workers
        hold them all (cancellable). Speculative (a warm connection): False at once instead."""
        ...

    def release(self, pool_id: PoolIdentity) -> None:
        """A connection that held a slot is gone (closed, failed, or abandoned)."""
        ...

    def protocol(self, key: PoolKey) -> Proto | None:
        """The protocol any worker last saw `key` speak."""
        ...

    def protocol_learned(self, key: PoolKey, proto: Proto) -> None: ...

    def breaks_pipelining(self, key: PoolKey) -> bool:
        """Whether any worker saw `key` break an HTTP/1.1 pipeline."""
        ...

    def pipelining_broke(self, key: PoolKey) -> None: ...

    def requests_per_connection(self, key: PoolKey) -> int | None:
        """How many requests any worker last heard `key` say it takes on a connection."""
        ...

    def requests_per_connection_learned(self, key: PoolKey, count: int) -> None: ...
