"""reshape/features/client_errors/rules.py without sockets: classification of mitmproxy's error
messages, the head
checks, and the HTTP/2 flood meter (hypothesis over arbitrary inputs and frame sequences)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mitmproxy.net.http import http1, validate

from reshape.features.client_errors.rules import (
    CLIENT_ERROR_KINDS,
    FRAME_KINDS,
    FloodLimits,
    FloodMeter,
    bad_header_value,
    classify_flow_error,
    head_too_large,
)

SMUGGLING = "from client, refusing to prevent request smuggling attacks. Disable the ..."


@pytest.mark.parametrize(
    ("message", "complete", "kind"),
    [
        (
            f"Received message with both transfer-encoding and content-length headers {SMUGGLING}",
            True,
            "smuggling",
        ),
        (f"Received multiple content-length headers: [b'4', b'5'] {SMUGGLING}", False, "smuggling"),
        (f"Received unknown transfer-encoding header: b'xchunked' {SMUGGLING}", False, "smuggling"),
        (f"Received invalid header name: b'Bad Header' {SMUGGLING}", True, "malformed"),
        ("invalid content-length header: '4, 5'", False, "smuggling"),
        (
            "HTTP/1 protocol error: illegal chunk header: bytearray(b'zz\\r\\n')",
            False,
            "bad_chunked",
        ),
        (
            "HTTP/1 protocol error: peer closed connection without sending complete message body: "
            "received 1 bytes, expected 10",
            False,
            "incomplete_body",
        ),
        # The origin's faults and clients that leave after a whole request are not client errors.
        (
            "Received multiple content-length headers: [b'1', b'2'] from server, refusing to "
            "prevent request smuggling attacks.",
            True,
            None,
        ),
        ("HTTP/1 protocol error: illegal chunk header: bytearray(b'zz')", True, None),
        ("Client disconnected.", True, None),
        ("Connection refused", True, None),
        ("stream reset by client (CANCEL)", False, None),
    ],
)
def test_mitmproxy_errors_are_classified(message: str, complete: bool, kind: str | None) -> None:
    assert classify_flow_error(message, complete) == kind


@given(st.text(max_size=300), st.booleans())
def test_classification_is_total_and_bounded(message: str, complete: bool) -> None:
    assert classify_flow_error(message, complete) in (*CLIENT_ERROR_KINDS, None)


FIELD_VALUE = st.text(
    st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters=":"), max_size=12
)


@given(
    st.lists(
        st.tuples(st.sampled_from(["Content-Length", "Transfer-Encoding"]), FIELD_VALUE), max_size=3
    )
)
def test_every_framing_error_mitmproxy_raises_on_a_request_is_smuggling(
    fields: list[tuple[str, str]],
) -> None:
    # Whatever framing fields a client sends, mitmproxy either accepts them or raises a message
    # the classifier calls smuggling, on either path (sizing the body, or validating the head).
    lines = [b"POST http://a.example/ HTTP/1.1\r\n"]
    lines += [f"{name}: {value}\r\n".encode() for name, value in fields if value]
    request = http1.read_request_head(lines)
    try:
        http1.expected_http_body_size(request)
    except ValueError as e:
        assert classify_flow_error(str(e), False) == "smuggling"
    try:
        validate.validate_headers(request)
    except ValueError as e:
        message = f"Received {e} from client, refusing to prevent request smuggling attacks."
        assert classify_flow_error(message, False) == "smuggling"


@pytest.mark.parametrize(
    ("value", "bad"),
    [
        (b"text/html", False),
        (b"a\tb", False),  # tab is allowed in field values
        (b"a\x00b", True),
        (b"a\rb", True),
        (b"a\nb", True),
        (b"a\x7fb", True),
        ("é".encode(), False),  # obs-text: not ours to refuse
    ],
)
def test_control_characters_in_values(value: bytes, bad: bool) -> None:
    fields = ((b"Host", b"a.example"), (b"X-Test", value))
    assert bad_header_value(fields) == (b"X-Test" if bad else None)


@given(st.lists(st.tuples(st.binary(max_size=8), st.binary(max_size=20)), max_size=8))
def test_bad_header_value_names_a_field_with_a_control_character(
    fields: list[tuple[bytes, bytes]],
) -> None:
    name = bad_header_value(tuple(fields))
    controls = [n for n, v in fields if any(b < 32 and b != 9 or b == 127 for b in v)]
    assert name == (controls[0] if controls else None)


@given(st.integers(0, 10**6), st.one_of(st.none(), st.integers(0, 10**6)), st.integers(1, 10**5))
def test_head_size(buffered: int, head_end: int | None, limit: int) -> None:
    measured = buffered if head_end is None else head_end
    assert head_too_large(buffered, head_end, limit) == (measured > limit)


def test_a_browser_passes_the_meter() -> None:
    meter = FloodMeter()
    now = 1000.0
    # Two SETTINGS, a PING a second for a minute, 150 cancelled streams at once (a navigation).
    assert meter.allow("settings", now) and meter.allow("settings", now)
    assert all(meter.allow("reset", now) for _ in range(150))
    assert all(meter.allow("ping", now + s) for s in range(60))


@pytest.mark.parametrize("kind", FRAME_KINDS)
def test_a_flood_is_stopped_within_its_burst(kind: str) -> None:
    meter = FloodMeter(FloodLimits())
    allowed = 0
    for i in range(10_000):
        if not meter.allow(kind, 5.0 + i * 1e-5):  # 100,000 frames per second
            break
        allowed += 1
    assert allowed < 300


@given(
    st.lists(
        st.tuples(st.sampled_from(FRAME_KINDS), st.floats(-1.0, 10.0, allow_nan=False)),
        max_size=300,
    ),
    st.floats(1, 50),
    st.floats(0.5, 20),
)
def test_the_meter_never_allows_more_than_burst_plus_refill(
    frames: list[tuple[str, float]], burst: float, rate: float
) -> None:
    limits = FloodLimits(burst, rate, burst, rate, burst, rate)
    meter = FloodMeter(limits)
    now = 0.0
    allowed = dict.fromkeys(FRAME_KINDS, 0)
    first: dict[str, float] = {}
    latest: dict[str, float] = {}
    for kind, step in frames:
        now += step  # time may also go backwards a little: that must refill nothing
        first.setdefault(kind, now)
        latest[kind] = max(latest.get(kind, now), now)
        if meter.allow(kind, now):
            allowed[kind] += 1
    for kind in first:
        assert allowed[kind] <= burst + rate * (latest[kind] - first[kind]) + 1e-9


def test_unknown_frame_kinds_and_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown HTTP/2 frame kind"):
        FloodMeter().allow("data", 0.0)
    with pytest.raises(ValueError, match="ping_burst must be positive"):
        FloodLimits(ping_burst=0)
