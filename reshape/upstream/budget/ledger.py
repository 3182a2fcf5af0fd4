"""Who holds which slots of which per-host cap among the workers of one `reshape run --workers
N`, who waits for one, and whom to ask for one back — as pure bookkeeping (sans-IO).

The broker (broker.py) feeds each worker's messages in and sends what comes out. A *holder* is
one worker (one connection to the broker); a *pool* is a pool id's name, the same in every
worker; a *slot* is the right to one origin connection, connecting or open. Every method returns
the messages to send, as (holder, message) pairs, in order.

1. Safety: the slots held in a pool never exceed its cap (the one the latest acquire named).
2. Grants: a free slot goes to the waiting holder that holds the fewest slots of the pool, and
   among equals to the oldest acquire: a worker with none is served before one with many.
3. Reclaim: a waiter that no free slot serves asks another holder for one, with `Reclaim`:
   - a *ceiling* (hold at most n: the holder closes an idle connection at once, or the next to
     fall idle, and opens none meanwhile) when the split is unfair: the donor keeps at least as
     many as the waiter will have (it holds two more), or the waiter holds none at all;
   - otherwise *idle* (give one back once a connection has stayed idle a moment), from a holder
     that waits for nothing itself: its spare connection is worth more to the waiter, its busy
     ones are not taken.
   The donor is the holder with the most slots not yet asked for. A holder under a ceiling gets
   no grant until it has paid; a holder that receives is not asked. Requests are recomputed from
   the state after every event and sent when they change (a holder that gave a slot back while
   asked for idle ones hears the current count again: it counts down its own).
4. A holder that is gone (its worker died; the broker saw its socket close) holds nothing and
   waits for nothing: its slots go to the waiters at once.
5. A speculative acquire (a warm connection for requests not here yet) takes a free slot or is
   denied at once: it never waits and never asks anyone.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from reshape.upstream.budget.messages import Deny, Grant, Reclaim

Holder = int
type Send = tuple[Holder, Grant | Deny | Reclaim]
# What a holder is asked for: (ceiling, idle), as in `Reclaim`.
type Request = tuple[int | None, int]

NOTHING: Request = (None, 0)


class LedgerError(ValueError):
    """An event the ledger's state does not allow (a release without a slot, a ticket twice)."""


@dataclass(frozen=True)
class LedgerStats:
    """Counts since start, for metrics."""

    granted: int = 0  # acquires granted, at once or after waiting
    waited: int = 0  # acquires that found no free slot and waited
    denied: int = 0  # speculative acquires without a free slot
    reclaims: int = 0  # requests for slots back sent to a holder
    waiting: int = 0  # acquires waiting now


@dataclass
class _Pool:
    cap: int
    held: dict[Holder, int] = field(default_factory=dict)  # holders with at least one slot
    # Waiting acquires per holder: ticket → arrival number, oldest first.
    waiting: dict[Holder, dict[int, int]] = field(default_factory=dict)
    asked: dict[Holder, Request] = field(default_factory=dict)  # as last sent; NOTHING omitted

    @property
    def free(self) -> int:
        return self.cap - sum(self.held.values())

    @property
    def unused(self) -> bool:
        return not self.held and not self.waiting and not self.asked


class SlotLedger:
    def __init__(self) -> None:
        self._pools: dict[str, _Pool] = {}
        self._tickets: dict[tuple[Holder, int], str] = {}  # waiting acquire → its pool
        self._arrivals = itertools.count()
        self._granted = self._waited = self._denied = self._reclaims = 0

    # views

    @property
    def stats(self) -> LedgerStats:
        return LedgerStats(
            self._granted, self._waited, self._denied, self._reclaims, len(self._tickets)
        )

    def pools(self) -> list[str]:
        return list(self._pools)

    def cap(self, pool: str) -> int:
        return self._pools[pool].cap if pool in self._pools else 0

    def held(self, pool: str) -> dict[Holder, int]:
        """Slots held per holder (holders with none omitted)."""
        return dict(self._pools[pool].held) if pool in self._pools else {}

    def waiting(self, pool: str) -> dict[Holder, list[int]]:
        """Waiting tickets per holder, oldest first."""
        p = self._pools.get(pool)
        return {h: list(tickets) for h, tickets in p.waiting.items()} if p else {}

    def asked(self, pool: str) -> dict[Holder, Request]:
        """The request in force per holder (holders asked for nothing omitted)."""
        return dict(self._pools[pool].asked) if pool in self._pools else {}

    def __repr__(self) -> str:
        parts = [
            f"{name} {sum(p.held.values())}/{p.cap}"
            f" waiting={sum(len(t) for t in p.waiting.values())} asked={len(p.asked)}"
            for name, p in self._pools.items()
        ]
        return f"<SlotLedger {'; '.join(parts) or 'empty'}>"

    # events

    def acquire(
        self, holder: Holder, ticket: int, pool: str, cap: int, *, speculative: bool = False
    ) -> list[Send]:
        """`holder` wants a slot of `pool` for the acquire `ticket` (unique per holder)."""
        if cap < 1:
            raise LedgerError(f"cap must be at least 1, not {cap}")
        if (holder, ticket) in self._tickets:
            raise LedgerError(f"holder {holder} already waits with ticket {ticket}")
        p = self._pools.setdefault(pool, _Pool(cap))
        p.cap = cap
        sends: list[Send]
        if speculative:
            # After settling, a free slot means nobody waits (rule 2 gave it away otherwise).
            if p.free > 0:
                p.held[holder] = p.held.get(holder, 0) + 1
                self._granted += 1
                sends = [(holder, Grant(ticket, pool))]
            else:
                self._denied += 1
                sends = [(holder, Deny(ticket))]
            return sends + self._settle(pool)
        p.waiting.setdefault(holder, {})[ticket] = next(self._arrivals)
        self._tickets[(holder, ticket)] = pool
        sends = self._settle(pool)
        if (holder, Grant(ticket, pool)) not in sends:
            self._waited += 1
        return sends

    def cancel(self, holder: Holder, ticket: int) -> list[Send]:
        """The acquire `ticket` is not wanted any more; ignored unless it still waits."""
        pool = self._tickets.pop((holder, ticket), None)
        if pool is None:
            return []
        p = self._pools[pool]
        del p.waiting[holder][ticket]
        if not p.waiting[holder]:
            del p.waiting[holder]
        return self._settle(pool)

    def release(self, holder: Holder, pool: str) -> list[Send]:
        """A connection of `holder` in `pool` is gone: its slot is free."""
        p = self._pools.get(pool)
        if p is None or holder not in p.held:
            raise LedgerError(f"holder {holder} holds no slot of {pool}")
        p.held[holder] -= 1
        if not p.held[holder]:
            del p.held[holder]
        return self._settle(pool, counting_down=holder)

    def holder_gone(self, holder: Holder) -> list[Send]:
        """The holder's worker is gone, and with it its connections: every slot it held is free,
        and it waits for nothing."""
        sends: list[Send] = []
        for name, p in list(self._pools.items()):
            tickets = p.waiting.pop(holder, {})
            for ticket in tickets:
                del self._tickets[(holder, ticket)]
            held = p.held.pop(holder, 0)
            asked = p.asked.pop(holder, None)
            if held or tickets or asked:
                sends += self._settle(name)
        return sends

    # the pure step

    def _settle(self, pool: str, *, counting_down: Holder | None = None) -> list[Send]:
        """Grant what can be granted, then recompute the requests for slots back; repeated
        until nothing changes (a request withdrawn can let its holder be granted)."""
        p = self._pools[pool]
        before = dict(p.asked)
        sends: list[Send] = []
        while True:
            sends += self._grant(pool, p)
            asked = self._plan(p)
            if asked == p.asked:
                break
            p.asked = asked
        for holder in sorted(before.keys() | p.asked.keys()):
            request = p.asked.get(holder, NOTHING)
            resend = holder == counting_down and request[1] > 0
            if request != before.get(holder, NOTHING) or resend:
                sends.append((holder, Reclaim(pool, *request)))
                if request != NOTHING:
                    self._reclaims += 1
        if p.unused:
            del self._pools[pool]
        return sends

    def _grant(self, pool: str, p: _Pool) -> list[Send]:
        sends: list[Send] = []
        while p.free > 0:
            eligible = [
                (p.held.get(h, 0), next(iter(tickets.values())), h)
                for h, tickets in p.waiting.items()
                if p.asked.get(h, NOTHING)[0] is None
            ]
            if not eligible:
                break
            _, _, holder = min(eligible)
            tickets = p.waiting[holder]
            ticket = next(iter(tickets))
            del tickets[ticket]
            if not tickets:
                del p.waiting[holder]
            del self._tickets[(holder, ticket)]
            p.held[holder] = p.held.get(holder, 0) + 1
            self._granted += 1
            sends.append((holder, Grant(ticket, pool)))
        return sends

    def _plan(self, p: _Pool) -> dict[Holder, Request]:
        """The requests for slots back that the waiting acquires call for (rule 3), from the
        state alone: the waiters are served in grant order, each by a free slot or a donor."""
        free = p.free
        will_hold = dict(p.held)  # after the planned transfers
        ceilings: dict[Holder, int] = {}  # slots asked back by ceiling, per donor
        idle: dict[Holder, int] = {}  # slots asked back from idle connections, per donor
        receiving: set[Holder] = set()
        stuck: set[Holder] = set()
        queues = {h: list(tickets.values()) for h, tickets in p.waiting.items()}

        def spare(donor: Holder) -> int:
            return p.held.get(donor, 0) - ceilings.get(donor, 0) - idle.get(donor, 0)

        while True:
            needers = [
                (will_hold.get(h, 0), arrivals[0], h)
                for h, arrivals in queues.items()
                if arrivals and h not in stuck and h not in ceilings and h not in idle
            ]
            if not needers:
                break
            has, _, holder = min(needers)
            queues[holder].pop(0)
            if free > 0:
                free -= 1
            else:
                donors = [d for d in p.held if d != holder and d not in receiving and spare(d)]
                unfair = [d for d in donors if has == 0 or spare(d) >= has + 2]
                idle_ones = [d for d in donors if d not in p.waiting]
                if unfair:
                    donor = max(unfair, key=lambda d: (spare(d), -d))
                    ceilings[donor] = ceilings.get(donor, 0) + 1
                elif idle_ones:
                    donor = max(idle_ones, key=lambda d: (spare(d), -d))
                    idle[donor] = idle.get(donor, 0) + 1
                else:
                    stuck.add(holder)
                    continue
            will_hold[holder] = has + 1
            receiving.add(holder)
        return {
            h: (p.held[h] - ceilings[h] if h in ceilings else None, idle.get(h, 0))
            for h in sorted(ceilings.keys() | idle.keys())
        }
