"""NavigationParts: page loads put together from the parts several workers saw."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from reshape.features.preconnect.assembly import Learned, NavigationParts
from reshape.features.preconnect.navigations import NavigationOutcome, OriginUse

F = "https://news.test:443"


def part(client: str, started: float, document: bool, **origins: tuple[int, int]) -> Learned:
    uses = {f"https://{k}.test:443": OriginUse(*v) for k, v in origins.items()}
    return Learned(NavigationOutcome(F, uses, started + 2, client, started, document), 4)


def test_parts_of_one_navigation_are_combined_once_settled() -> None:
    parts = NavigationParts()
    parts.add(part("c", 10.0, True, cdn=(3, 2)))
    parts.add(part("c", 10.0, False, cdn=(1, 1), img=(4, 4)))
    parts.add(part("c", 50.0, True, cdn=(1, 1)))  # a later navigation
    assert parts.settled(20.0, 30.0) == []
    [learned] = parts.settled(40.0, 30.0)
    assert learned.outcome.origins == {
        "https://cdn.test:443": OriginUse(4, 3),
        "https://img.test:443": OriginUse(4, 4),
    }
    assert learned.outcome.document and learned.max_misses == 4
    assert len(parts) == 1


def test_a_navigation_without_its_document_part_is_dropped() -> None:
    parts = NavigationParts()
    parts.add(part("c", 10.0, False, cdn=(1, 1)))
    assert parts.settled(100.0, 30.0) == []
    assert len(parts) == 0


def test_different_clients_are_different_navigations() -> None:
    parts = NavigationParts()
    parts.add(part("a", 10.0, True, cdn=(1, 1)))
    parts.add(part("b", 10.0, True, img=(1, 1)))
    assert len(parts.settled(100.0, 30.0)) == 2


def test_json_round_trip_skips_malformed_parts() -> None:
    parts = NavigationParts()
    parts.add(part("c", 10.0, True, cdn=(3, 2)))
    data = json.loads(json.dumps(parts.to_json()))
    data.append({"first_party": F})  # malformed
    data.append("nonsense")
    again = NavigationParts.from_json(data)
    assert again.to_json() == parts.to_json()
    assert len(NavigationParts.from_json({"not": "a list"})) == 0


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.floats(0, 100), st.booleans()), max_size=50))
def test_parts_stay_bounded_and_each_is_used_once(events: list[tuple[int, float, bool]]) -> None:
    parts = NavigationParts(max_parts=10)
    for client, started, document in events:
        parts.add(part(f"c{client}", started, document, cdn=(1, 1)))
        assert len(parts) <= 10
    total = len(parts)
    learned = parts.settled(1000.0, 30.0)
    assert len(parts) == 0
    assert sum(x.outcome.origins["https://cdn.test:443"].resources for x in learned) <= total
