"""What the workers learned about origins: the protocol each spoke last, which break HTTP/1.1
pipelines, and how many requests each HTTP/1.1 origin said it takes on a connection (sans-IO).
The broker keeps one table for workers that start later; each worker keeps one for the pools its
engine creates. Bounded: the least recently learned are forgotten first, each table apart."""

from __future__ import annotations

from collections import OrderedDict

from reshape.upstream.budget.messages import Fact, Learned, Takes
from reshape.upstream.pool import PoolKey, Proto

# As many as the engine remembers itself (reshape/upstream/engine.py REMEMBERED_ORIGINS).
REMEMBERED = 4096


class OriginFacts:
    def __init__(self, limit: int = REMEMBERED) -> None:
        self._limit = limit
        self._protocols: OrderedDict[PoolKey, Proto] = OrderedDict()
        self._broken: OrderedDict[PoolKey, None] = OrderedDict()
        self._takes: OrderedDict[PoolKey, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._protocols) + len(self._broken) + len(self._takes)

    def protocol(self, key: PoolKey) -> Proto | None:
        return self._protocols.get(key)

    def breaks_pipelining(self, key: PoolKey) -> bool:
        return key in self._broken

    def requests_per_connection(self, key: PoolKey) -> int | None:
        return self._takes.get(key)

    def learn(self, fact: Fact) -> bool:
        """Record `fact`; whether it is news (then it is worth passing on)."""
        if isinstance(fact, Takes):
            return self._put(self._takes, fact.key, fact.count)
        if fact.proto is not None:
            return self._put(self._protocols, fact.key, fact.proto)
        return self._put(self._broken, fact.key, None)

    def _put[V](self, table: OrderedDict[PoolKey, V], key: PoolKey, value: V) -> bool:
        news = key not in table or table[key] != value
        table[key] = value
        table.move_to_end(key)
        while len(table) > self._limit:
            table.popitem(last=False)
        return news

    def all(self) -> list[Fact]:
        """Everything known, oldest first: what a worker that starts now is told."""
        return [
            *(Learned(key, proto) for key, proto in self._protocols.items()),
            *(Learned(key, None) for key in self._broken),
            *(Takes(key, count) for key, count in self._takes.items()),
        ]
