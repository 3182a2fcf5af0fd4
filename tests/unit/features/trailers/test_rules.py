"""reshape/features/trailers/rules.py: the per-response decisions, without sockets."""

from __future__ import annotations

import base64
import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reshape.features.telemetry import metrics
from reshape.features.trailers.rules import (
    ACTIONS,
    ContentDigest,
    Delivery,
    TrailerPlan,
    client_carries_trailers,
    client_takes_trailers,
    may_promote,
    plan_for,
    settle,
)
from reshape.policy.schema import FORBIDDEN_TRAILER_FIELDS, TrailerKnobs

H1, H2 = "HTTP/1.1", "HTTP/2.0"


@pytest.mark.parametrize(
    ("version", "te", "takes"),
    [
        ("HTTP/2.0", "", True),
        ("HTTP/3", "", True),
        ("HTTP/1.1", "trailers", True),
        ("HTTP/1.1", "gzip, Trailers", True),
        ("HTTP/1.1", "deflate;q=0.5, trailers;q=1", True),
        ("HTTP/1.1", "", False),
        ("HTTP/1.1", "gzip", False),
        ("HTTP/1.1", "x-trailers", False),
        ("HTTP/1.0", "trailers", False),  # no chunked coding, no trailers
    ],
)
def test_who_takes_trailers(version: str, te: str, takes: bool) -> None:
    assert client_takes_trailers(version, te) is takes


def test_http_1_0_cannot_carry_trailers() -> None:
    assert client_carries_trailers("HTTP/1.1") and client_carries_trailers("HTTP/2.0")
    assert not client_carries_trailers("HTTP/1.0")


@pytest.mark.parametrize(
    ("mode", "version", "te", "delivery"),
    [
        ("auto", H2, "", Delivery.FORWARD),
        ("auto", H1, "trailers", Delivery.FORWARD),
        ("auto", H1, "", Delivery.STRIP),
        ("forward", H1, "", Delivery.FORWARD),
        ("forward", "HTTP/1.0", "", Delivery.STRIP),
        ("strip", H2, "", Delivery.STRIP),
        ("strip", H1, "trailers", Delivery.STRIP),
        ("promote", H2, "", Delivery.FORWARD),
        ("promote", H1, "trailers", Delivery.FORWARD),
        ("promote", H1, "", Delivery.PROMOTE),
        ("promote", "HTTP/1.0", "", Delivery.PROMOTE),
    ],
)
def test_plan_follows_the_mode_table(mode: str, version: str, te: str, delivery: Delivery) -> None:
    plan = plan_for(TrailerKnobs(mode=mode), version, te)  # type: ignore[arg-type]
    assert plan.delivery is delivery
    assert not plan.synthesize_digest


def test_a_digest_is_synthesized_only_for_clients_that_get_trailers() -> None:
    knobs = TrailerKnobs(synthesize=("content-digest",))
    assert plan_for(knobs, H2, "").synthesize_digest
    assert plan_for(knobs, H1, "trailers").synthesize_digest
    assert not plan_for(knobs, H1, "").synthesize_digest
    strip = TrailerKnobs(mode="strip", synthesize=("content-digest",))
    assert not plan_for(strip, H2, "").synthesize_digest


def test_may_promote_up_to_the_buffer_limit() -> None:
    knobs = TrailerKnobs(max_promote_buffer=100)
    assert may_promote(knobs, None)  # unknown: held until it passes a limit
    assert may_promote(knobs, 100)
    assert not may_promote(knobs, 101)


FORWARD = TrailerPlan(Delivery.FORWARD, False)
STRIP = TrailerPlan(Delivery.STRIP, False)
PROMOTE = TrailerPlan(Delivery.PROMOTE, False)
RECEIVED = [("Server-Timing", "db;dur=5"), ("Set-Cookie", "a=1"), ("Content-Length", "9")]


def test_forward_passes_allowed_fields_and_never_forbidden_ones() -> None:
    outcome = settle(FORWARD, TrailerKnobs(), RECEIVED)
    assert outcome.trailers == (("Server-Timing", "db;dur=5"), ("Set-Cookie", "a=1"))
    assert outcome.promoted == ()
    assert outcome.actions == ("forwarded", "stripped")  # Content-Length was dropped


def test_forward_without_room_for_trailers_strips() -> None:
    outcome = settle(FORWARD, TrailerKnobs(), RECEIVED[:1], can_carry=False)
    assert outcome.trailers == () and outcome.actions == ("stripped",)


def test_strip_sends_nothing_and_counts_it() -> None:
    outcome = settle(STRIP, TrailerKnobs(), RECEIVED[:2])
    assert (outcome.trailers, outcome.promoted, outcome.actions) == ((), (), ("stripped",))


def test_nothing_received_nothing_counted() -> None:
    assert settle(STRIP, TrailerKnobs(), []).actions == ()
    assert settle(FORWARD, TrailerKnobs(), []).actions == ()


def test_promote_moves_allowed_fields_of_a_held_body() -> None:
    knobs = TrailerKnobs(mode="promote", promote_fields=("set-cookie",), max_promote_buffer=10)
    outcome = settle(PROMOTE, knobs, RECEIVED, held_bytes=10)
    assert outcome.promoted == (("Set-Cookie", "a=1"),)
    assert outcome.trailers == ()
    # Server-Timing is not in promote_fields and Content-Length is forbidden: both dropped.
    assert outcome.actions == ("stripped", "promoted")


@pytest.mark.parametrize("held", [None, 11])
def test_promote_of_a_streamed_or_too_large_body_strips(held: int | None) -> None:
    knobs = TrailerKnobs(mode="promote", promote_fields=("Set-Cookie",), max_promote_buffer=10)
    outcome = settle(PROMOTE, knobs, RECEIVED[1:2], held_bytes=held)
    assert (outcome.promoted, outcome.actions) == ((), ("stripped",))


def test_the_synthesized_digest_replaces_the_origins_and_is_counted() -> None:
    plan = TrailerPlan(Delivery.FORWARD, True)
    received = [("content-digest", "sha-256=:old:"), ("Server-Timing", "x")]
    outcome = settle(plan, TrailerKnobs(), received, digest="sha-256=:new:")
    assert outcome.trailers == (("Server-Timing", "x"), ("Content-Digest", "sha-256=:new:"))
    assert outcome.actions == ("forwarded", "synthesized")
    alone = settle(plan, TrailerKnobs(), [], digest="sha-256=:new:")
    assert alone.actions == ("synthesized",)


def test_content_digest_is_rfc_9530_sha_256() -> None:
    body = b"hello world"
    expected = base64.b64encode(hashlib.sha256(body).digest()).decode()
    assert ContentDigest([body]).value() == f"sha-256=:{expected}:"
    # RFC 9530 appendix: {"hello": "world"} → sha-256=:X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=:
    assert ContentDigest([b'{"hello": "world"}']).value() == (
        "sha-256=:X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=:"
    )


@given(st.lists(st.binary(max_size=64), max_size=20))
def test_content_digest_does_not_depend_on_how_the_body_is_cut(pieces: list[bytes]) -> None:
    streamed = ContentDigest()
    for piece in pieces:
        streamed.update(piece)
    assert streamed.value() == ContentDigest([b"".join(pieces)]).value()


field_names = st.one_of(
    st.sampled_from(sorted(FORBIDDEN_TRAILER_FIELDS)).map(str.title),
    st.sampled_from(["Server-Timing", "Set-Cookie", "Content-Digest", "X-Checksum"]),
)
fields = st.lists(st.tuples(field_names, st.text("abc=;", max_size=5)), max_size=8)
plans = st.builds(TrailerPlan, st.sampled_from(Delivery), st.booleans())
knobs_ = st.builds(
    TrailerKnobs,
    mode=st.sampled_from(["auto", "forward", "strip", "promote"]),
    promote_fields=st.lists(st.sampled_from(["Set-Cookie", "Server-Timing"]), max_size=2).map(
        tuple
    ),
    max_promote_buffer=st.integers(0, 100),
)


@given(
    plans,
    knobs_,
    fields,
    st.one_of(st.none(), st.just("sha-256=:x:")),
    st.booleans(),
    st.one_of(st.none(), st.integers(0, 200)),
)
def test_settle_invariants(
    plan: TrailerPlan,
    knobs: TrailerKnobs,
    received: list[tuple[str, str]],
    digest: str | None,
    can_carry: bool,
    held: int | None,
) -> None:
    outcome = settle(plan, knobs, received, digest=digest, can_carry=can_carry, held_bytes=held)
    sent = [*outcome.trailers, *outcome.promoted]
    # Forbidden fields go nowhere; promoted ones are allowed ones; nothing is sent twice.
    assert not any(name.lower() in FORBIDDEN_TRAILER_FIELDS for name, _ in sent)
    allowed = {name.lower() for name in knobs.promote_fields}
    assert all(name.lower() in allowed for name, _ in outcome.promoted)
    assert not (outcome.trailers and outcome.promoted)
    if plan.delivery is not Delivery.FORWARD or not can_carry:
        assert outcome.trailers == ()
    if plan.delivery is not Delivery.PROMOTE:
        assert outcome.promoted == ()
    # Every received field is either sent on or counted as stripped.
    sent_count = len([f for f in sent if digest is None or f[0] != "Content-Digest"])
    if sent_count < len([f for f in received if digest is None or f[0] != "Content-Digest"]):
        assert "stripped" in outcome.actions
    assert ("synthesized" in outcome.actions) == (("Content-Digest", digest) in outcome.trailers)
    assert list(outcome.actions) == [a for a in ACTIONS if a in outcome.actions]


def test_actions_are_the_metric_labels() -> None:
    assert ACTIONS == metrics.TRAILER_ACTIONS
