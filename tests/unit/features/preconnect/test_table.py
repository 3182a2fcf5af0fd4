"""OriginTable: hits, misses, confidence, decay, bounds and its JSON form."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reshape.features.preconnect.navigations import NavigationOutcome, OriginUse
from reshape.features.preconnect.table import OriginTable, Prediction, connections_wanted

F = "https://news.test:443"
CDN = "https://cdn.test:443"
ADS = "https://ads.test:443"
DAY = 86400.0


def load(at: float, *origins: str, resources: int = 4, peak: int = 2) -> NavigationOutcome:
    return NavigationOutcome(F, {o: OriginUse(resources, peak) for o in origins}, at)


def test_one_load_makes_its_origins_confident() -> None:
    table = OriginTable()
    table.learn(load(0.0, CDN, ADS), max_misses=3)
    predicted = table.predict(F, min_confidence=0.75)
    assert {p.origin for p in predicted} == {CDN, ADS}
    assert all(p.confidence == 1.0 for p in predicted)
    assert table.predict("https://unknown.test:443", min_confidence=0.75) == []


def test_confidence_is_hits_over_hits_and_misses() -> None:
    table = OriginTable(half_life=math.inf)  # nothing fades
    for at, origins in enumerate([(CDN, ADS), (CDN, ADS), (CDN, ADS), (CDN,)]):
        table.learn(load(float(at), *origins), max_misses=3)
    stats = table.origins(F)[ADS]
    assert (stats.hits, stats.misses, stats.misses_in_a_row) == (3, 1, 1)
    assert stats.confidence == 0.75
    # Strictly above min_confidence: 0.75 is not enough at the default.
    assert [p.origin for p in table.predict(F, min_confidence=0.75)] == [CDN]
    assert {p.origin for p in table.predict(F, min_confidence=0.7)} == {CDN, ADS}


@pytest.mark.parametrize("max_misses", [1, 2, 3, 5])
def test_an_origin_missed_max_misses_loads_in_a_row_is_forgotten(max_misses: int) -> None:
    table = OriginTable()
    for at in range(5):
        table.learn(load(float(at), CDN, ADS), max_misses=max_misses)
    for n in range(max_misses):
        assert ADS in table.origins(F)
        table.learn(load(10.0 + n, CDN), max_misses=max_misses)
    assert ADS not in table.origins(F)
    assert CDN in table.origins(F)


def test_a_hit_resets_the_misses_in_a_row() -> None:
    table = OriginTable()
    sequence = [(CDN, ADS), (CDN,), (CDN,), (CDN, ADS), (CDN,), (CDN,)]
    for at, origins in enumerate(sequence):
        table.learn(load(float(at), *origins), max_misses=3)
    assert table.origins(F)[ADS].misses_in_a_row == 2


def test_old_evidence_fades() -> None:
    table = OriginTable(half_life=DAY)
    for at in range(4):
        table.learn(load(float(at), CDN, ADS), max_misses=10)
    table.learn(load(10 * DAY, CDN), max_misses=10)
    stats = table.origins(F)[ADS]
    # Four hits ten half-lives ago weigh less than one miss now.
    assert stats.hits == pytest.approx(4 / 1024, rel=1e-3)
    assert stats.confidence < 0.01


def test_moving_averages_of_resources_and_connections() -> None:
    table = OriginTable()
    table.learn(load(0.0, CDN, resources=8, peak=4), max_misses=3)
    table.learn(load(1.0, CDN, resources=4, peak=2), max_misses=3)
    [p] = table.predict(F, min_confidence=0.5)
    assert (p.resources, p.connections) == (6.0, 3.0)


@pytest.mark.parametrize(
    ("rule", "resources", "connections", "cap", "wanted"),
    [
        ("history", 10, 3.0, 6, 3),
        ("history", 10, 2.2, 6, 3),  # rounded up
        ("history", 10, 5.0, 2, 2),  # capped
        ("half_resources", 7, 1.0, 6, 4),  # ceil(7 / 2)
        ("half_resources", 1, 1.0, 6, 1),
        ("half_resources", 40, 1.0, 4, 4),
        ("history", 0.1, 0.1, 6, 1),  # at least one
    ],
)
def test_connections_wanted(
    rule: str, resources: float, connections: float, cap: int, wanted: int
) -> None:
    prediction = Prediction(CDN, 1.0, resources, connections)
    assert connections_wanted(prediction, rule, cap) == wanted  # type: ignore[arg-type]


def test_json_round_trip() -> None:
    table = OriginTable()
    table.learn(load(0.0, CDN, ADS), max_misses=3)
    table.learn(load(1.0, CDN), max_misses=3)
    again = OriginTable.from_json(json.loads(json.dumps(table.to_json())))
    assert again.origins(F) == table.origins(F)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "not a JSON object"),
        ({"version": 99, "first_parties": []}, "format version"),
        ({"version": 1, "first_parties": {}}, "not a list"),
        ({"version": 1, "first_parties": [{"origin": 5}]}, "no valid origin"),
        ({"version": 1, "first_parties": [{"origin": F, "updated": 0}]}, "origins is not a list"),
        (
            {
                "version": 1,
                "first_parties": [
                    {"origin": F, "updated": 0, "origins": [{"origin": CDN, "hits": "x"}]}
                ],
            },
            "hits is not a finite number",
        ),
        (
            {
                "version": 1,
                "first_parties": [
                    {
                        "origin": F,
                        "updated": 0,
                        "origins": [
                            {
                                "origin": CDN,
                                "hits": -1,
                                "misses": 0,
                                "misses_in_a_row": 0,
                                "resources": 1,
                                "connections": 1,
                            }
                        ],
                    }
                ],
            },
            "hits is negative",
        ),
    ],
)
def test_malformed_json_is_refused(data: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        OriginTable.from_json(data)


OUTCOMES = st.lists(
    st.tuples(
        st.integers(0, 12),  # first party
        st.sets(st.integers(0, 15), max_size=8),  # origins needed
        st.floats(0, 10 * DAY),  # time step
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(outcomes=OUTCOMES, max_misses=st.integers(1, 4))
def test_memory_bounds_and_confidence_rules_hold(
    outcomes: list[tuple[int, set[int], float]], max_misses: int
) -> None:
    table = OriginTable(max_first_parties=5, max_origins=4, half_life=DAY)
    now = 0.0
    streak: dict[tuple[str, str], int] = {}  # misses in a row, by our own count
    for first_party, needed, step in outcomes:
        now += step
        fp = f"https://fp{first_party}.test:443"
        origins = {f"https://o{o}.test:443": OriginUse(1 + o, 1 + o % 3) for o in needed}
        known = set(table.origins(fp))
        table.learn(NavigationOutcome(fp, origins, now), max_misses=max_misses)
        after = table.origins(fp)
        assert len(table) <= 5
        assert len(after) <= 4
        for origin in known - set(origins):
            streak[(fp, origin)] = streak.get((fp, origin), 0) + 1
            # Missed max_misses times in a row: gone. Otherwise kept (or pushed out by newer).
            if streak[(fp, origin)] >= max_misses:
                assert origin not in after
        for origin in origins:
            streak[(fp, origin)] = 0
        for origin, stats in after.items():
            assert 0.0 <= stats.confidence <= 1.0
            assert stats.misses_in_a_row < max_misses
            if origin in origins:
                assert stats.misses_in_a_row == 0
        for p in table.predict(fp, min_confidence=0.75):
            assert p.confidence > 0.75 and math.isfinite(p.resources)
