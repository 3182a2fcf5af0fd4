"""The messages between the budget broker and its workers, one JSON array per line.

A worker asks for a slot (`Acquire`), gives up asking (`Cancel`) and gives one back (`Release`);
the broker answers `Grant` or `Deny` and asks for slots back (`Reclaim`). Either side tells the
other what a worker learned about an origin (`Learned`, `Takes`). Pools are named by
`pool_name`, the same in every worker for the same pool id.

Lines rather than a binary framing: a message goes by per connection opened or closed (never per
request), and a line can be read in a log.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from reshape.upstream.pool import PoolKey, Proto


class MessageError(ValueError):
    """A line that is no message."""


@dataclass(frozen=True)
class Acquire:
    """Worker → broker: a slot of `pool`, whose cap is `cap`, for a connection about to open.
    `speculative` (a warm connection for requests not here yet): only a free slot, at once."""

    ticket: int
    pool: str
    cap: int
    speculative: bool = False


@dataclass(frozen=True)
class Cancel:
    """Worker → broker: the acquire `ticket` is no longer wanted (if still waiting)."""

    ticket: int


@dataclass(frozen=True)
class Release:
    """Worker → broker: a connection of `pool` is gone; its slot is free."""

    pool: str


@dataclass(frozen=True)
class Grant:
    """Broker → worker: the acquire `ticket` holds a slot of `pool` now. (A worker that gave up
    on the ticket meanwhile gives the slot back: it knows the pool.)"""

    ticket: int
    pool: str


@dataclass(frozen=True)
class Deny:
    """Broker → worker: no free slot for the speculative acquire `ticket`."""

    ticket: int


@dataclass(frozen=True)
class Reclaim:
    """Broker → worker: other workers wait for slots of `pool`. Hold at most `ceiling` of them
    (None: as many as the cap allows), and give back `idle` more as connections stay idle.
    Each one replaces the last; `Reclaim(pool, None, 0)` withdraws the request."""

    pool: str
    ceiling: int | None
    idle: int


@dataclass(frozen=True)
class Learned:
    """Either way: what a worker learned about an origin: the protocol it speaks, or that it
    breaks HTTP/1.1 pipelines (`proto` None)."""

    key: PoolKey
    proto: Proto | None


@dataclass(frozen=True)
class Takes:
    """Either way: how many requests an HTTP/1.1 origin takes on one connection, as it said
    (`Keep-Alive: max`, reshape/upstream/keep_alive.py)."""

    key: PoolKey
    count: int  # >= 1


type Fact = Learned | Takes
type Message = Acquire | Cancel | Release | Grant | Deny | Reclaim | Learned | Takes


def encode(message: Message) -> bytes:
    fields: list[object]
    match message:
        case Acquire(ticket, pool, cap, speculative):
            fields = ["acquire", ticket, pool, cap, speculative]
        case Cancel(ticket):
            fields = ["cancel", ticket]
        case Release(pool):
            fields = ["release", pool]
        case Grant(ticket, pool):
            fields = ["grant", ticket, pool]
        case Deny(ticket):
            fields = ["deny", ticket]
        case Reclaim(pool, ceiling, idle):
            fields = ["reclaim", pool, ceiling, idle]
        case Learned(key, proto):
            fields = [
                "learned",
                key.scheme,
                key.host,
                key.port,
                key.sni,
                proto.value if proto is not None else None,
            ]
        case Takes(key, count):
            fields = ["takes", key.scheme, key.host, key.port, key.sni, count]
    return json.dumps(fields, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes) -> Message:
    try:
        fields = json.loads(line)
        match fields:
            case ["acquire", int(ticket), str(pool), int(cap), bool(speculative)] if cap >= 1:
                return Acquire(ticket, pool, cap, speculative)
            case ["cancel", int(ticket)]:
                return Cancel(ticket)
            case ["release", str(pool)]:
                return Release(pool)
            case ["grant", int(ticket), str(pool)]:
                return Grant(ticket, pool)
            case ["deny", int(ticket)]:
                return Deny(ticket)
            case ["reclaim", str(pool), None, int(idle)] if idle >= 0:
                return Reclaim(pool, None, idle)
            case ["reclaim", str(pool), int(ceiling), int(idle)] if ceiling >= 0 and idle >= 0:
                return Reclaim(pool, ceiling, idle)
            case ["learned", str(scheme), str(host), int(port), sni, proto] if sni is None or (
                isinstance(sni, str)
            ):
                key = PoolKey(scheme, host, port, sni)
                return Learned(key, Proto(proto) if proto is not None else None)
            case ["takes", str(scheme), str(host), int(port), sni, int(count)] if count >= 1 and (
                sni is None or isinstance(sni, str)
            ):
                return Takes(PoolKey(scheme, host, port, sni), count)
    except ValueError as e:  # JSON, an unknown scheme or protocol
        raise MessageError(f"not a budget message: {line[:200]!r} ({e})") from None
    raise MessageError(f"not a budget message: {line[:200]!r}")
