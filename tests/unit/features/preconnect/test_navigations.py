"""NavigationTracker: requests grouped into page loads, without sockets."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reshape.features.preconnect.navigations import NavigationTracker, OriginUse

F = "https://news.test:443"
CDN = "https://cdn.test:443"
ADS = "https://ads.test:443"
IMG = "https://img.test:443"


def test_a_navigation_collects_resources_and_ends_with_the_next_one() -> None:
    tracker = NavigationTracker()
    assert tracker.document("c1", F, 0.0) == []
    for t in (0.1, 0.2):
        tracker.subresource("c1", CDN, F, t)
    tracker.subresource("c1", ADS, None, 0.3)  # no Referer: counted by timing alone
    tracker.subresource("c1", F, F, 0.3)  # the first party itself is not recorded
    [outcome] = tracker.document("c1", "https://other.test:443", 1.0)
    assert outcome.first_party == F
    assert outcome.origins == {CDN: OriginUse(2, 2), ADS: OriginUse(1, 1)}
    assert outcome.ended_at == 0.3


def test_peak_in_flight_counts_requests_at_once() -> None:
    tracker = NavigationTracker()
    tracker.document("c1", F, 0.0)
    first = tracker.subresource("c1", CDN, F, 0.1)
    second = tracker.subresource("c1", CDN, F, 0.1)
    assert first is not None and second is not None
    tracker.finished(first)
    tracker.finished(second)
    tracker.subresource("c1", CDN, F, 0.2)
    [outcome] = tracker.expire(100.0)
    assert outcome.origins[CDN] == OriginUse(3, 2)
    assert tracker.requests_in_flight == 0


def test_a_resource_referred_by_an_origin_of_the_navigation_counts() -> None:
    tracker = NavigationTracker()
    tracker.document("c1", F, 0.0)
    tracker.subresource("c1", CDN, F, 0.1)  # a stylesheet on the CDN
    assert tracker.subresource("c1", IMG, CDN, 0.2) is not None  # an image it names
    assert tracker.subresource("c1", ADS, "https://elsewhere.test:443", 0.3) is None
    [outcome] = tracker.expire(100.0)
    assert set(outcome.origins) == {CDN, IMG}


def test_clients_are_kept_apart() -> None:
    tracker = NavigationTracker()
    tracker.document("c1", F, 0.0)
    assert tracker.subresource("c2", CDN, F, 0.1) is None
    assert tracker.document("c2", F, 0.2) == []
    assert tracker.open_navigations == 2


@pytest.mark.parametrize(
    ("later", "counted"),
    [(4.9, True), (5.0, False)],  # quiet = 5 s after the last request
)
def test_a_quiet_navigation_is_over(later: float, counted: bool) -> None:
    tracker = NavigationTracker(quiet=5.0, window=30.0)
    tracker.document("c1", F, 0.0)
    assert (tracker.subresource("c1", CDN, F, later) is not None) is counted


def test_a_navigation_ends_after_its_window_however_busy() -> None:
    tracker = NavigationTracker(quiet=5.0, window=10.0)
    tracker.document("c1", F, 0.0)
    for t in range(10):
        assert tracker.subresource("c1", CDN, F, float(t)) is not None
    assert tracker.subresource("c1", CDN, F, 10.0) is None
    assert [o.first_party for o in tracker.expire(10.0)] == [F]
    assert tracker.expire(11.0) == []  # each outcome once


def test_finishing_an_unknown_handle_is_ignored() -> None:
    tracker = NavigationTracker()
    tracker.finished(12345)
    tracker.document("c1", F, 0.0)
    handle = tracker.subresource("c1", CDN, F, 0.1)
    tracker.document("c1", F, 0.2)  # ends the first navigation: its handle is gone
    assert handle is not None
    tracker.finished(handle)
    assert tracker.requests_in_flight == 0


def test_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError):
        NavigationTracker(window=0)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["doc", "sub", "fin", "wait"]),
            st.integers(0, 20),  # client
            st.integers(0, 30),  # origin
        ),
        max_size=200,
    )
)
def test_memory_stays_bounded(events: list[tuple[str, int, int]]) -> None:
    tracker = NavigationTracker(max_open=4, max_origins=5)
    now = 0.0
    handles: list[int] = []
    ended = 0
    started = 0
    for kind, client, origin in events:
        name = f"https://o{origin}.test:443"
        if kind == "doc":
            started += 1
            outcomes = tracker.document(f"c{client}", name, now)
            ended += len(outcomes)
            assert all(len(o.origins) <= 5 for o in outcomes)
        elif kind == "sub":
            handle = tracker.subresource(f"c{client}", name, None, now)
            if handle is not None:
                handles.append(handle)
        elif kind == "fin" and handles:
            tracker.finished(handles.pop(origin % len(handles)))
        else:
            now += origin / 4
            ended += len(tracker.expire(now))
        assert tracker.open_navigations <= 4
        assert tracker.open_navigations + ended == started


def test_a_worker_adopts_a_navigation_another_worker_saw_begin() -> None:
    tracker = NavigationTracker()
    assert tracker.adopt("c1", F, 10.0, 10.5) == []
    assert tracker.current("c1") == (F, 10.0)
    tracker.subresource("c1", CDN, F, 10.6)
    # The same navigation again, or an older one: nothing changes.
    assert tracker.adopt("c1", F, 10.0, 10.7) == []
    assert tracker.adopt("c1", F, 9.0, 10.7) == []
    # A newer one ends the part this worker saw.
    [part] = tracker.adopt("c1", F, 12.0, 12.1)
    assert (part.client, part.started, part.document) == ("c1", 10.0, False)
    assert part.origins == {CDN: OriginUse(1, 1)}


def test_a_navigation_too_old_to_follow_is_not_adopted() -> None:
    tracker = NavigationTracker(window=30.0)
    assert tracker.adopt("c1", F, 0.0, 30.0) == []
    assert tracker.current("c1") is None


def test_a_document_part_says_so() -> None:
    tracker = NavigationTracker()
    tracker.document("c1", F, 5.0)
    [outcome] = tracker.expire(100.0)
    assert (outcome.client, outcome.started, outcome.document) == ("c1", 5.0, True)
