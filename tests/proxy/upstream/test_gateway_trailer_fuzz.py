"""Fuzzing the gateway's trailer filter: whatever trailer fields an origin sends, what the gateway
passes on is accepted by h11 at the end of a chunked response — a refusal there would break the
connection after the whole body had been relayed."""

from __future__ import annotations

import h11
from hypothesis import given
from hypothesis import strategies as st

from reshape.upstream.gateway import _trailer_fields

names = st.one_of(
    st.sampled_from(
        [
            b"content-digest",
            b"grpc-status",
            b"Content-Length",
            b"Transfer-Encoding",
            b"connection",
            b"te",
            b"x-checksum",
            b"Trailer",
            b"",
        ]
    ),
    st.binary(max_size=12),
)
values = st.one_of(
    st.sampled_from([b"sha-256=:abc=:", b" padded ", b"a\r\nb", b"\x00"]), st.binary(max_size=24)
)


def sent_with(trailers: list[tuple[bytes, bytes]]) -> bytes:
    server = h11.Connection(h11.SERVER)
    server.receive_data(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert isinstance(server.next_event(), h11.Request)
    server.next_event()  # EndOfMessage of the request
    out = server.send(h11.Response(status_code=200, headers=[]))  # chunked: no length
    out = (out or b"") + (server.send(h11.Data(data=b"body")) or b"")
    return out + (server.send(h11.EndOfMessage(headers=trailers)) or b"")


@given(st.lists(st.tuples(names, values), max_size=8))
def test_passed_trailers_are_always_sendable(fields: list[tuple[bytes, bytes]]) -> None:
    kept = _trailer_fields(fields)
    wire = sent_with(kept)  # raises h11.LocalProtocolError if a field is refused
    assert wire.endswith(b"\r\n\r\n")
    for name, _ in kept:
        assert name.lower() not in (b"content-length", b"transfer-encoding", b"connection", b"te")


def test_valid_fields_pass_unchanged_but_trimmed() -> None:
    fields = [(b"Content-Digest", b" sha-256=:x=: "), (b"grpc-status", b"0")]
    assert _trailer_fields(fields) == [(b"Content-Digest", b"sha-256=:x=:"), (b"grpc-status", b"0")]
