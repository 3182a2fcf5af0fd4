"""The slot ledger of the workers' shared connection budget: examples, then random sequences of
events from several holders checked against a model of what each holder knows."""

from __future__ import annotations

from collections import defaultdict

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from reshape.upstream.budget.ledger import LedgerError, SlotLedger
from reshape.upstream.budget.messages import Deny, Grant, Reclaim

A, B, C = 1, 2, 3


def test_slots_up_to_the_cap_are_granted_at_once_then_acquires_wait() -> None:
    ledger = SlotLedger()
    assert ledger.acquire(A, 1, "p", 2) == [(A, Grant(1, "p"))]
    assert ledger.acquire(B, 1, "p", 2) == [(B, Grant(1, "p"))]
    # B waits; A waits for nothing, so its connection may be spare: it lends it once idle.
    assert ledger.acquire(B, 2, "p", 2) == [(A, Reclaim("p", None, 1))]
    assert ledger.held("p") == {A: 1, B: 1}
    assert ledger.waiting("p") == {B: [2]}
    assert ledger.release(A, "p") == [(B, Grant(2, "p")), (A, Reclaim("p", None, 0))]
    assert ledger.stats.granted == 3 and ledger.stats.waited == 1


def test_a_holder_of_every_slot_is_asked_for_one_by_a_holder_of_none() -> None:
    ledger = SlotLedger()
    ledger.acquire(A, 1, "p", 2)
    ledger.acquire(A, 2, "p", 2)
    # A holds both (idle or busy: the ledger cannot tell); B, holding none, waits. A is asked
    # to keep one: it closes an idle connection at once, or its next to fall idle.
    assert ledger.acquire(B, 1, "p", 2) == [(A, Reclaim("p", 1, 0))]
    assert ledger.release(A, "p") == [(B, Grant(1, "p")), (A, Reclaim("p", None, 0))]
    assert ledger.held("p") == {A: 1, B: 1}
    assert ledger.asked("p") == {}
    assert ledger.stats.reclaims == 1


def test_with_a_cap_of_one_the_slot_changes_hands() -> None:
    ledger = SlotLedger()
    ledger.acquire(A, 1, "p", 1)
    assert ledger.acquire(B, 1, "p", 1) == [(A, Reclaim("p", 0, 0))]
    ledger.release(A, "p")
    assert ledger.acquire(A, 2, "p", 1) == [(B, Reclaim("p", 0, 0))]


def test_a_busy_holder_keeps_an_even_share() -> None:
    ledger = SlotLedger()
    for holder in (A, B):
        for ticket in (1, 2):
            ledger.acquire(holder, ticket, "p", 4)
    # 2 against 2 + 1 is no unfair split: A only lends what it does not use.
    assert ledger.acquire(B, 3, "p", 4) == [(A, Reclaim("p", None, 1))]
    # Once A waits too, it is busy: nothing more is asked of it.
    assert ledger.acquire(A, 3, "p", 4) == [(A, Reclaim("p", None, 0))]


def test_a_busy_holder_with_two_more_than_the_waiter_gives_one_back() -> None:
    ledger = SlotLedger()
    for ticket in (1, 2, 3):
        ledger.acquire(A, ticket, "p", 4)
    ledger.acquire(B, 1, "p", 4)
    # A waits itself (it is busy); B, waiting for nothing, would lend it a spare connection.
    assert ledger.acquire(A, 4, "p", 4) == [(B, Reclaim("p", None, 1))]
    # C holds none: A, with three, is asked to keep two, and B's lending is off.
    assert ledger.acquire(C, 1, "p", 4) == [(A, Reclaim("p", 2, 0)), (B, Reclaim("p", None, 0))]
    # While under a ceiling A gets nothing: the slot it frees goes to C. A still waits with
    # two; B lends again.
    assert ledger.release(A, "p") == [
        (C, Grant(1, "p")),
        (A, Reclaim("p", None, 0)),
        (B, Reclaim("p", None, 1)),
    ]
    assert ledger.held("p") == {A: 2, B: 1, C: 1}


def test_a_free_slot_goes_to_the_holder_with_the_fewest() -> None:
    ledger = SlotLedger()
    ledger.acquire(A, 1, "p", 3)
    ledger.acquire(A, 2, "p", 3)
    ledger.acquire(C, 1, "p", 3)
    ledger.acquire(A, 3, "p", 3)  # older, but A has two already
    ledger.acquire(B, 1, "p", 3)
    assert ledger.release(C, "p")[0] == (B, Grant(1, "p"))


def test_an_asker_that_gives_up_withdraws_its_request() -> None:
    ledger = SlotLedger()
    ledger.acquire(A, 1, "p", 1)
    ledger.acquire(B, 7, "p", 1)
    assert ledger.cancel(B, 7) == [(A, Reclaim("p", None, 0))]
    assert ledger.cancel(B, 7) == []  # unknown by now: ignored
    assert ledger.waiting("p") == {}


def test_a_lending_holder_hears_the_count_again_after_each_slot_it_gives_back() -> None:
    ledger = SlotLedger()
    d, a, c, b = 1, 2, 3, 4
    for holder, slots in ((d, 2), (a, 2), (b, 1)):
        for ticket in range(slots):
            ledger.acquire(holder, ticket, "p", 5)
    ledger.acquire(d, 10, "p", 5)
    ledger.acquire(b, 10, "p", 5)
    ledger.acquire(c, 10, "p", 5)
    # C, holding none, takes from D (a ceiling); B's wait is served by A's spare connection.
    assert ledger.asked("p") == {d: (1, 0), a: (None, 1)}
    # A lends one (counting its own down to 0). The slot goes to C, and A is now to lend one
    # for B: the same request as before, which A hears again, or it would lend nothing.
    sends = ledger.release(a, "p")
    assert sends[0] == (c, Grant(10, "p"))
    assert (a, Reclaim("p", None, 1)) in sends


def test_a_dead_holders_slots_go_to_the_waiters() -> None:
    ledger = SlotLedger()
    ledger.acquire(A, 1, "p", 2)
    ledger.acquire(A, 2, "p", 2)
    ledger.acquire(A, 1, "q", 1)
    ledger.acquire(B, 1, "p", 2)
    assert ledger.holder_gone(A) == [(B, Grant(1, "p"))]
    assert ledger.held("p") == {B: 1}
    assert ledger.pools() == ["p"]  # nothing left of q
    assert ledger.holder_gone(A) == []


def test_speculative_acquires_take_a_free_slot_or_are_denied_and_ask_nobody() -> None:
    ledger = SlotLedger()
    assert ledger.acquire(A, 1, "p", 1, speculative=True) == [(A, Grant(1, "p"))]
    assert ledger.acquire(B, 1, "p", 1, speculative=True) == [(B, Deny(1))]
    assert ledger.asked("p") == {} and ledger.waiting("p") == {}
    assert ledger.stats.denied == 1


def test_bad_events_are_refused() -> None:
    ledger = SlotLedger()
    with pytest.raises(LedgerError, match="holds no slot"):
        ledger.release(A, "p")
    ledger.acquire(A, 1, "p", 1)
    ledger.acquire(A, 2, "p", 1)
    with pytest.raises(LedgerError, match="already waits"):
        ledger.acquire(A, 2, "p", 1)
    with pytest.raises(LedgerError, match="cap"):
        ledger.acquire(A, 3, "p", 0)
    assert "p 1/1 waiting=1" in repr(ledger)


# -- random sequences against a model

HOLDERS = st.integers(0, 2)  # an index into the live holders
POOLS = ("a", "b")


class LedgerMachine(RuleBasedStateMachine):
    """Several holders acquire, cancel, release and die at random; each obeys the requests it
    hears when the test says so. The model is what the holders know from the messages alone."""

    def __init__(self) -> None:
        super().__init__()
        self.ledger = SlotLedger()
        self.live = [1, 2, 3]
        self.next_holder = 4
        self.next_ticket = 0
        self.held: dict[tuple[int, str], int] = defaultdict(int)
        self.waiting: dict[int, tuple[int, str]] = {}  # ticket → (holder, pool)
        self.asked: dict[tuple[int, str], tuple[int | None, int]] = {}
        self.gone_held: dict[str, int] = defaultdict(int)

    @initialize(caps=st.tuples(st.integers(1, 3), st.integers(1, 2)))
    def start(self, caps: tuple[int, int]) -> None:
        self.caps = dict(zip(POOLS, caps, strict=True))

    def play(
        self, sends: list[tuple[int, Grant | Deny | Reclaim]], *, speculative: int = -1
    ) -> None:
        for holder, message in sends:
            assert holder in self.live, "nothing is sent to a holder that is gone"
            if isinstance(message, Grant):
                if message.ticket == speculative:
                    continue  # counted by the caller
                owner, pool = self.waiting.pop(message.ticket)
                assert owner == holder
                ceiling = self.asked.get((holder, pool), (None, 0))[0]
                assert ceiling is None, "no grant to a holder asked to hold fewer"
                self.held[(holder, pool)] += 1
            elif isinstance(message, Deny):
                assert message.ticket == speculative
            else:
                request = (message.ceiling, message.idle)
                if request == (None, 0):
                    self.asked.pop((holder, message.pool), None)
                else:
                    self.asked[(holder, message.pool)] = request

    def holding(self, pool: str) -> int:
        return sum(n for (h, p), n in self.held.items() if p == pool)

    def waiters(self, pool: str) -> set[int]:
        return {h for h, p in self.waiting.values() if p == pool}

    # events

    @rule(who=HOLDERS, pool=st.sampled_from(POOLS), speculative=st.booleans())
    def acquire(self, who: int, pool: str, speculative: bool) -> None:
        holder = self.live[who]
        self.next_ticket += 1
        ticket = self.next_ticket
        sends = self.ledger.acquire(holder, ticket, pool, self.caps[pool], speculative=speculative)
        if speculative:
            free = self.caps[pool] - self.holding(pool) > 0
            assert sends[0] == (holder, Grant(ticket, pool) if free else Deny(ticket))
            if free:
                self.held[(holder, pool)] += 1
            self.play(sends[1:], speculative=ticket)
        else:
            self.waiting[ticket] = (holder, pool)
            self.play(sends)

    @precondition(lambda self: self.waiting)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        ticket = data.draw(st.sampled_from(sorted(self.waiting)))
        holder, _ = self.waiting.pop(ticket)
        self.play(self.ledger.cancel(holder, ticket))
        assert self.ledger.cancel(holder, ticket) == []

    @precondition(lambda self: any(self.held.values()))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        holder, pool = data.draw(st.sampled_from(sorted(k for k, n in self.held.items() if n)))
        self._release(holder, pool)

    def _release(self, holder: int, pool: str) -> None:
        self.held[(holder, pool)] -= 1
        self.play(self.ledger.release(holder, pool))

    @rule(who=HOLDERS)
    def holder_dies(self, who: int) -> None:
        holder = self.live[who]
        self.live[who] = self.next_holder
        self.next_holder += 1
        for key in [k for k in self.held if k[0] == holder]:
            del self.held[key]
        for ticket in [t for t, (h, _) in self.waiting.items() if h == holder]:
            del self.waiting[ticket]
        for key in [k for k in self.asked if k[0] == holder]:
            del self.asked[key]
        self.play(self.ledger.holder_gone(holder))

    def _obey_once(self) -> bool:
        """One holder gives back one slot it was asked for, as its pool would: under a ceiling
        above which it holds, or for an idle connection (the model's connections all fall idle);
        its own count of idle ones goes down with it."""
        for (holder, pool), (ceiling, idle) in sorted(self.asked.items(), key=str):
            held = self.held[(holder, pool)]
            if ceiling is not None and held > ceiling:
                self._release(holder, pool)
                return True
            if idle and held:
                self.asked[(holder, pool)] = (ceiling, idle - 1)
                self._release(holder, pool)
                return True
        return False

    @rule()
    def obey_one(self) -> None:
        self._obey_once()

    @rule()
    def obey_everything(self) -> None:
        """Liveness and fairness: when every holder gives back what it is asked for, no waiting
        holder is left with nothing, nobody spare keeps a slot a waiter wants, and the holders
        that wait end up within one slot of each other."""
        for _ in range(100):
            if not self._obey_once():
                break
        else:
            raise AssertionError("requests for slots back never end")
        for pool in POOLS:
            waiters = self.waiters(pool)
            if not waiters:
                continue
            counts = {h: self.held[(h, pool)] for h in self.live}
            assert all(counts[h] >= 1 for h in waiters), counts
            assert all(counts[h] == 0 for h in self.live if h not in waiters), counts
            assert max(counts[h] for h in waiters) - min(counts[h] for h in waiters) <= 1

    # invariants

    @invariant()
    def never_above_the_cap_and_the_model_matches(self) -> None:
        for pool in POOLS:
            assert self.holding(pool) <= self.caps[pool]
            held = {h: n for (h, p), n in self.held.items() if p == pool and n}
            assert self.ledger.held(pool) == held
            assert sorted(t for ts in self.ledger.waiting(pool).values() for t in ts) == sorted(
                t for t, (_, p) in self.waiting.items() if p == pool
            )

    @invariant()
    def a_free_slot_means_nobody_waits(self) -> None:
        for pool in POOLS:
            if self.holding(pool) < self.caps[pool]:
                assert not self.waiters(pool)
                assert not any(p == pool for _, p in self.asked)

    @invariant()
    def requests_in_force_are_the_ledgers_and_only_while_someone_waits(self) -> None:
        for pool in POOLS:
            mine = {h: r for (h, p), r in self.asked.items() if p == pool}
            ledger = self.ledger.asked(pool)
            # A holder counts its idle ones down itself, and hears the count again from the
            # ledger after every slot it gives back: both agree.
            assert mine == ledger
            if mine:
                assert self.waiters(pool)
            for holder, (ceiling, idle) in ledger.items():
                assert holder not in self.waiters(pool) or not idle, "lend only when spare"
                if ceiling is None:
                    continue
                held = self.held[(holder, pool)]
                assert ceiling < held
                # Taken from a busy holder only for a fair split, never a mere swap.
                assert any(
                    self.held[(h, pool)] == 0 or self.held[(h, pool)] + 2 <= held
                    for h in self.waiters(pool) - {holder}
                )

    def teardown(self) -> None:
        for holder in list(self.live):
            self.ledger.holder_gone(holder)
        assert self.ledger.pools() == []


LedgerMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=60, deadline=None)
TestLedgerMachine = LedgerMachine.TestCase
