"""The request fields the engine hands h2, whose own outbound checks are off (upstream/h2.py)."""

import pytest
from hpack import Encoder, NeverIndexedHeaderTuple

from reshape.upstream.h2 import outbound_fields
from reshape.upstream.http2 import ProtocolError


def test_names_lower_case_values_trimmed() -> None:
    assert outbound_fields([(b"Accept", b" text/html\t"), (b"X-A", b"1")]) == [
        (b"accept", b"text/html"),
        (b"x-a", b"1"),
    ]


def test_connection_specific_and_pseudo_fields_never_sent() -> None:
    fields = [
        (b"Connection", b"close"),
        (b"Keep-Alive", b"5"),
        (b"Proxy-Connection", b"keep-alive"),
        (b"Transfer-Encoding", b"chunked"),
        (b"Upgrade", b"h2c"),
        (b"TE", b"gzip"),
        (b":path", b"/evil"),
        (b"accept", b"*/*"),
    ]
    assert outbound_fields(fields) == [(b"accept", b"*/*")]


def test_credentials_and_short_cookies_kept_out_of_the_shared_table() -> None:
    ready = outbound_fields(
        [
            (b"Authorization", b"Bearer abc"),
            (b"cookie", b"sid=1"),
            (b"cookie", b"prefs=" + b"x" * 40),
        ]
    )
    assert isinstance(ready[0], NeverIndexedHeaderTuple)
    assert isinstance(ready[1], NeverIndexedHeaderTuple)
    assert not isinstance(ready[2], NeverIndexedHeaderTuple)
    # What an HPACK encoder makes of them: only the long cookie enters the shared table.
    encoder = Encoder()
    encoder.encode(ready)
    assert [name for name, _ in encoder.header_table.dynamic_entries] == [b"cookie"]


@pytest.mark.parametrize("value", [b"a\r\nb: c", b"a\nb", b"a\0b"])
def test_line_breaks_and_nul_refused(value: bytes) -> None:
    with pytest.raises(ProtocolError):
        outbound_fields([(b"x-injected", value)])


@pytest.mark.parametrize("name", [b"x-a\r\nb", b"x\nb", b"x\0b"])
def test_line_breaks_and_nul_in_names_refused(name: bytes) -> None:
    with pytest.raises(ProtocolError):
        outbound_fields([(name, b"1")])


@pytest.mark.parametrize("value", [b"\x01\x7f\xff obs-text", b"a\tb", b"\xc3\xa9"])
def test_other_bytes_in_values_pass(value: bytes) -> None:
    assert outbound_fields([(b"x-a", value)]) == [(b"x-a", value)]
