"""reshape/mitm/patches/h2_header_validation.py: h2's verdict on every header block, faster.

The one-pass check may only answer "valid" when h2's own chain does; for anything else h2's
chain runs and raises its own error. Compared here with h2's chain on hand-picked and
generated blocks: the same fields come out, or the same ProtocolError message.
"""

from __future__ import annotations

import h2.config
import h2.connection
import h2.events
import h2.stream
import h2.utilities
import pytest
from h2.exceptions import ProtocolError
from hpack.struct import HeaderTuple, NeverIndexedHeaderTuple
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reshape.mitm.patches import PatchError, Patches
from reshape.mitm.patches.h2_header_validation import ValidateH2HeadersInOnePass, validate_headers

Flags = h2.utilities.HeaderValidationFlags
REQUEST = Flags(is_client=False, is_trailer=False, is_response_header=False, is_push_promise=False)
RESPONSE = Flags(is_client=True, is_trailer=False, is_response_header=True, is_push_promise=False)
TRAILER = Flags(is_client=True, is_trailer=True, is_response_header=False, is_push_promise=False)
FLAGS = [
    REQUEST,
    RESPONSE,
    TRAILER,
    Flags(is_client=False, is_trailer=True, is_response_header=False, is_push_promise=False),
    Flags(is_client=True, is_trailer=False, is_response_header=False, is_push_promise=True),
]

GET = [(b":method", b"GET"), (b":scheme", b"https"), (b":authority", b"a.example")]
BROWSER_GET = [
    *GET,
    (b":path", b"/tiles/1.png"),
    (b"sec-ch-ua", b'"Chromium";v="131", "Not_A Brand";v="24"'),
    (b"user-agent", b"Mozilla/5.0 (X11; Linux x86_64) HeadlessChrome/131.0.0.0 Safari/537.36"),
    (b"accept", b"image/avif,image/webp,*/*;q=0.8"),
    (b"referer", b"https://a.example/app.html"),
    (b"accept-language", b"en-US,en;q=0.9"),
    (b"te", b"trailers"),
    (b"cookie", b""),
]


def h2_verdict(block: list, flags: Flags) -> object:
    """What h2's own chain makes of a block: the fields it passes on, or its error."""
    try:
        return list(h2.utilities.validate_headers(iter(block), flags))
    except ProtocolError as e:
        return ("refused", str(e))


def patched_verdict(block: list, flags: Flags) -> object:
    try:
        return list(validate_headers(iter(block), flags))
    except ProtocolError as e:
        return ("refused", str(e))


VALID = [
    (BROWSER_GET, REQUEST),
    ([(b":status", b"200"), (b"content-type", b"text/html"), (b"server", b"nginx")], RESPONSE),
    ([(b"grpc-status", b"0"), (b"x-empty", b"")], TRAILER),
    ([*GET, (b":path", b"/"), (b"host", b"a.example")], REQUEST),
    (
        [
            (b":method", b"CONNECT"),
            (b":protocol", b"websocket"),
            (b":scheme", b"https"),
            (b":path", b"/chat"),
            (b":authority", b"a.example"),
        ],
        REQUEST,
    ),
]
INVALID = [
    ([*GET, (b":path", b"/"), (b"User-Agent", b"x")], REQUEST),  # upper case
    ([*GET, (b":path", b"/"), (b"x y", b"1")], REQUEST),
    ([*GET, (b":path", b"/"), (b"x:y", b"1")], REQUEST),
    ([*GET, (b":path", b"/"), (b"", b"1")], REQUEST),
    ([*GET, (b":path", b"/"), (b"x", b"a\r\nx-smuggled: 1")], REQUEST),
    ([*GET, (b":path", b"/"), (b"x", b"a\0")], REQUEST),
    ([*GET, (b":path", b"/"), (b"x", b" padded")], REQUEST),
    ([*GET, (b":path", b"/"), (b"x", b"padded\t")], REQUEST),
    ([*GET, (b":path", b"/"), (b"te", b"gzip")], REQUEST),
    ([*GET, (b":path", b"/"), (b"connection", b"close")], REQUEST),
    ([*GET, (b":path", b"/"), (b"transfer-encoding", b"chunked")], REQUEST),
    ([*GET, (b":path", b"")], REQUEST),
    ([*GET, (b":path", b"/"), (b":path", b"/again")], REQUEST),
    ([(b":method", b"GET"), (b"x", b"1"), (b":path", b"/")], REQUEST),
    ([*GET, (b":path", b"/"), (b":custom", b"1")], REQUEST),
    ([*GET, (b":path", b"/"), (b":status", b"200")], REQUEST),
    ([*GET], REQUEST),  # no :path
    ([*GET, (b":path", b"/"), (b":protocol", b"websocket")], REQUEST),  # not CONNECT
    ([(b":method", b"GET"), (b":scheme", b"https"), (b":path", b"/")], REQUEST),  # no host
    ([*GET, (b":path", b"/"), (b"host", b"b.example")], REQUEST),  # mismatch
    ([(b"content-type", b"text/html")], RESPONSE),  # no :status
    ([(b":status", b"200"), (b":path", b"/")], RESPONSE),
    ([(b":status", b"200"), (b"grpc-status", b"0")], TRAILER),
    ([(b":", b"1"), (b":status", b"200")], RESPONSE),
    ([(b"\xc3\xa9", b"1"), (b":status", b"200")], RESPONSE),
    ([(b":status", b"200"), (b"x\x7f", b"1")], RESPONSE),
    ([(b":method", b"CONNECT"), (b":authority", b"a.example:443")], REQUEST),  # h2 wants :path
]


@pytest.mark.parametrize(("block", "flags"), VALID)
def test_a_valid_block_passes_as_the_same_fields(block: list, flags: Flags) -> None:
    fields = [NeverIndexedHeaderTuple(*f) if f[0] == b"cookie" else HeaderTuple(*f) for f in block]
    out = list(validate_headers(iter(fields), flags))
    assert out == h2_verdict(fields, flags) == fields
    assert all(a is b for a, b in zip(out, fields, strict=True))  # the same objects, in order


@pytest.mark.parametrize(("block", "flags"), INVALID)
def test_an_invalid_block_is_refused_with_h2s_own_error(block: list, flags: Flags) -> None:
    expected = h2_verdict(block, flags)
    assert isinstance(expected, tuple) and expected[0] == "refused"
    assert patched_verdict(block, flags) == expected


NAMES = st.one_of(
    st.sampled_from(
        [
            b":method",
            b":scheme",
            b":authority",
            b":path",
            b":status",
            b":protocol",
            b":x",
            b":",
            b"host",
            b"te",
            b"connection",
            b"keep-alive",
            b"user-agent",
            b"Accept",
            b"x:y",
            b"",
            b"cookie",
            b"x y",
            b"x\x00",
            b"\xff",
        ]
    ),
    st.binary(max_size=6),
)
VALUES = st.one_of(
    st.sampled_from([b"", b"GET", b"CONNECT", b"/", b"a.example", b"trailers", b"200", b"1xx"]),
    st.binary(max_size=8),
)
BLOCKS = st.lists(st.tuples(NAMES, VALUES), max_size=8)


TEMPLATES = {
    REQUEST: [*BROWSER_GET, (b"host", b"a.example")],
    RESPONSE: [(b":status", b"200"), (b"content-type", b"text/html"), (b"content-length", b"3")],
    TRAILER: [(b"grpc-status", b"0"), (b"grpc-message", b"ok")],
}


@st.composite
def near_valid_blocks(draw: st.DrawFn) -> tuple[list, Flags]:
    """A valid block of a random kind with up to three random edits: half stay valid."""
    flags = draw(st.sampled_from(FLAGS))
    kind = REQUEST if not flags.is_trailer and not flags.is_response_header else flags
    block = list(TEMPLATES.get(kind, TEMPLATES[TRAILER]))
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(block)))
        edit = draw(st.sampled_from(["insert", "name", "value", "delete", "repeat"]))
        if edit == "insert":
            block.insert(at, (draw(NAMES), draw(VALUES)))
        elif block and at < len(block):
            name, value = block[at]
            if edit == "name":
                block[at] = (draw(NAMES), value)
            elif edit == "value":
                block[at] = (name, draw(VALUES))
            elif edit == "delete":
                del block[at]
            else:
                block.insert(at, block[at])
    return block, flags


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(block=BLOCKS, flags=st.sampled_from(FLAGS), prefix=st.sampled_from([[], GET, GET[:2]]))
def test_any_block_gets_h2s_verdict(block: list, flags: Flags, prefix: list) -> None:
    block = prefix + block
    assert patched_verdict(block, flags) == h2_verdict(block, flags)


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=near_valid_blocks())
def test_blocks_near_the_boundary_get_h2s_verdict(case: tuple[list, Flags]) -> None:
    block, flags = case
    assert patched_verdict(block, flags) == h2_verdict(block, flags)


def _receive(headers: list[tuple[bytes, bytes]]) -> list:
    """A real h2 server connection receiving one request head: the events or the error."""
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    client.send_headers(1, headers, end_stream=True)
    server = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=False, validate_inbound_headers=True)
    )
    server.initiate_connection()
    try:
        return [type(e).__name__ for e in server.receive_data(client.data_to_send())]
    except ProtocolError as e:
        return ["refused", str(e)]


def test_h2s_streams_validate_through_it_and_uninstall_restores_h2s_own() -> None:
    good = [*BROWSER_GET[:4], (b"accept", b"*/*")]
    bad = [*BROWSER_GET[:4], (b"x", b"a\nb")]
    before_good, before_bad = _receive(good), _receive(bad)
    assert "RequestReceived" in before_good and before_bad[0] == "refused"
    with Patches([ValidateH2HeadersInOnePass()]):
        assert h2.stream.validate_headers is validate_headers
        assert _receive(good) == before_good
        assert _receive(bad) == before_bad
    assert h2.stream.validate_headers is h2.utilities.validate_headers


def test_an_h2_release_it_was_not_checked_on_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "version", lambda name: "9.9.9")
    with pytest.raises(PatchError, match="checked on h2 4.3.0, not 9.9.9"):
        ValidateH2HeadersInOnePass().install()
    assert h2.stream.validate_headers is h2.utilities.validate_headers


def test_the_names_it_remembers_are_bounded_in_number_and_length() -> None:
    from reshape.mitm.patches import h2_header_validation as module

    long_name = b"x-" + b"a" * module.KNOWN_GOOD_NAME_BYTES
    block = [(b":status", b"200"), (long_name, b"1")]
    assert list(validate_headers(block, RESPONSE)) == block
    assert long_name not in module._KNOWN_GOOD_NAMES
    for i in range(module.KNOWN_GOOD_NAMES_KEPT + 100):
        name = b"x-%d" % i
        assert list(validate_headers([(b":status", b"200"), (name, b"1")], RESPONSE))
    assert len(module._KNOWN_GOOD_NAMES) == module.KNOWN_GOOD_NAMES_KEPT  # names past it: matched
