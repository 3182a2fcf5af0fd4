"""What the workers learned about origins: the protocol each spoke last, and which break HTTP/1.1
pipelines (sans-IO). The broker keeps one table for workers that start later; each worker keeps
one for the pools its engine creates. Bounded: the least recently learned are forgotten first."""

from __future__ import annotations

from collections import OrderedDict

from reshape.upstream.budget.messages import Learned
from reshape.upstream.pool import PoolKey, Proto

# As many as the engine remembers itself (reshape/upstream/engine.py REMEMBERED_ORIGINS).
REMEMBERED = 4096


class OriginFacts:
    def __init__(self, limit: int = REMEMBERED) -> None:
        self._limit = limit
        self._protocols: OrderedDict[PoolKey, Proto] = OrderedDict()
        self._broken: OrderedDict[PoolKey, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._protocols) + len(self._broken)

    def protocol(self, key: PoolKey) -> Proto | None:
        return self._protocols.get(key)

    def breaks_pipelining(self, key: PoolKey) -> bool:
        return key in self._broken

    def learn(self, fact: Learned) -> bool:
        """Record `fact`; whether it is news (then it is worth passing on)."""
        table: OrderedDict[PoolKey, Proto] | OrderedDict[PoolKey, None] = (
            self._protocols if fact.proto is not None else self._broken
        )
        news = fact.key not in table or (fact.proto is not None and table[fact.key] != fact.proto)
        if fact.proto is not None:
            self._protocols[fact.key] = fact.proto
        else:
            self._broken[fact.key] = None
        table.move_to_end(fact.key)
        while len(table) > self._limit:
            table.popitem(last=False)
        return news

    def all(self) -> list[Learned]:
        """Everything known, oldest first: what a worker that starts now is told."""
        return [Learned(key, proto) for key, proto in self._protocols.items()] + [
            Learned(key, None) for key in self._broken
        ]
