"""What the workers learned about origins: news is told once, the table stays bounded."""

from __future__ import annotations

from reshape.upstream.budget.facts import OriginFacts
from reshape.upstream.budget.messages import Learned, Takes
from reshape.upstream.pool import PoolKey, Proto


def key(n: int) -> PoolKey:
    return PoolKey("https", f"o{n}.test", 443, f"o{n}.test")


def test_news_is_news_once_and_a_changed_protocol_is_news_again() -> None:
    facts = OriginFacts()
    assert facts.learn(Learned(key(1), Proto.H2))
    assert not facts.learn(Learned(key(1), Proto.H2))
    assert facts.learn(Learned(key(1), Proto.H1))  # the origin changed its mind
    assert facts.protocol(key(1)) is Proto.H1
    assert facts.learn(Learned(key(1), None))
    assert not facts.learn(Learned(key(1), None))
    assert facts.breaks_pipelining(key(1)) and not facts.breaks_pipelining(key(2))
    assert facts.protocol(key(2)) is None
    assert facts.all() == [Learned(key(1), Proto.H1), Learned(key(1), None)]


def test_an_origins_requests_per_connection_is_news_when_it_changes() -> None:
    facts = OriginFacts()
    assert facts.requests_per_connection(key(1)) is None
    assert facts.learn(Takes(key(1), 101))
    assert not facts.learn(Takes(key(1), 101))
    assert facts.learn(Takes(key(1), 3))
    assert facts.requests_per_connection(key(1)) == 3
    facts.learn(Learned(key(1), Proto.H1))
    assert facts.all() == [Learned(key(1), Proto.H1), Takes(key(1), 3)]
    assert len(facts) == 2


def test_the_least_recently_learned_are_forgotten_first() -> None:
    facts = OriginFacts(limit=2)
    for n in (1, 2, 3):
        facts.learn(Learned(key(n), Proto.H1))
    facts.learn(Learned(key(2), Proto.H1))  # learned again: the most recent now
    facts.learn(Learned(key(4), Proto.H1))
    assert [f.key for f in facts.all()] == [key(2), key(4)]
    assert len(facts) == 2
