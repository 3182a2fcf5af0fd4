"""reshape/features/request_framing/rules.py: which requests are refused, the Host they leave
with, and the hop-by-hop fields removed (RFC 9112 §3.2, §3.2.2; RFC 9110 §7.6.1)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reshape.features.request_framing.rules import (
    HOP_BY_HOP,
    MAX_CONTENT_LENGTH,
    RequestHead,
    end_to_end,
    refusal,
    with_host,
)


def head(
    *fields: tuple[str, str],
    version: str = "HTTP/1.1",
    method: str = "GET",
    target: str | None = "origin.test:8080",
) -> RequestHead:
    return RequestHead(
        version,
        method,
        target.encode() if target is not None else None,
        [(n.encode(), v.encode()) for n, v in fields],
    )


def kinds(request: RequestHead) -> str | None:
    refused = refusal(request)
    return refused.kind if refused else None


@pytest.mark.parametrize(
    ("request_head", "kind"),
    [
        (head(("Host", "a"), ("Host", "b")), "malformed"),
        (head(("Host", "a"), ("host", "a")), "malformed"),  # even when they agree
        (head(("host", "a"), ("host", "a"), version="HTTP/2.0"), "malformed"),
        (head(target=None), "malformed"),  # HTTP/1.1 origin-form without Host
        (head(("Host", "a b"), target=None), "malformed"),
        (head(("Host", "a/b"), target=None), "malformed"),
        (head(("Host", "a:8o"), target=None), "malformed"),
        (head(("Content-Length", str(10**26))), "smuggling"),
        (head(("Content-Length", str(MAX_CONTENT_LENGTH + 1))), "smuggling"),
        (head(("Content-Length", "9" * 5000)), "smuggling"),  # beyond int()'s digit limit
        (head(("Content-Length", str(10**26)), version="HTTP/2.0"), "smuggling"),
        (head(("Connection", "close, Content-Length"), ("Content-Length", "3")), "smuggling"),
        (head(("Connection", "transfer-encoding")), "smuggling"),
        (head(("Connection", "Host")), "smuggling"),
        # Accepted:
        (head(), None),  # absolute-form: the Host is generated
        (head(version="HTTP/1.0", target=None), None),  # HTTP/1.0 needs no Host
        (head(("Host", ""), target=None), None),  # an empty authority is a valid Host
        (head(("Host", "[::1]:8080"), target=None), None),
        (head(("Host", "xn--bcher-kva.example"), target=None), None),
        (head(("Host", "a b")), None),  # absolute-form: the Host is ignored and replaced
        (head(("Content-Length", str(MAX_CONTENT_LENGTH))), None),
        (head(("Content-Length", "00000000000000000000003")), None),
        (head(method="CONNECT", target=None), None),
        (head(("Connection", "keep-alive, x-foo")), None),
        (head(version="HTTP/2.0", target="origin.test"), None),
    ],
)
def test_refusals(request_head: RequestHead, kind: str | None) -> None:
    assert kinds(request_head) == kind


@pytest.mark.parametrize("coding", ["gzip, chunked", "Deflate,chunked", "compress ,\tchunked"])
def test_a_transfer_coding_before_chunked_is_not_implemented(coding: str) -> None:
    refused = refusal(head(("Transfer-Encoding", coding)))
    assert refused is not None
    assert refused.status == 501 and refused.kind is None  # not the client's error
    name = coding.split(",")[0].strip().lower()
    assert refused.message == f"Transfer coding {name} is not implemented."


@pytest.mark.parametrize(
    "fields",
    [
        [("Transfer-Encoding", "chunked")],
        # mitmproxy's own check refuses these as smuggling (400), after this one:
        [("Transfer-Encoding", "gzip")],
        [("Transfer-Encoding", "xchunked")],
        [("Transfer-Encoding", "gzip, chunked"), ("Content-Length", "3")],
        [("Transfer-Encoding", "gzip, chunked"), ("Transfer-Encoding", "chunked")],
    ],
)
def test_other_transfer_encodings_are_left_to_mitmproxy(fields: list[tuple[str, str]]) -> None:
    assert refusal(head(*fields)) is None


def hosts(fields: list[tuple[bytes, bytes]]) -> list[bytes]:
    return [value for name, value in fields if name.lower() == b"host"]


def test_absolute_form_takes_the_targets_authority() -> None:
    assert hosts(with_host(head(("Host", "other.example")))) == [b"origin.test:8080"]
    assert hosts(with_host(head())) == [b"origin.test:8080"]
    assert hosts(with_host(head(version="HTTP/1.0"))) == [b"origin.test:8080"]
    # The client's field keeps its place and its spelling; only the value changes.
    fields = with_host(head(("X-A", "1"), ("HOST", "x"), ("X-B", "2")))
    assert fields == [(b"X-A", b"1"), (b"HOST", b"origin.test:8080"), (b"X-B", b"2")]


def test_origin_form_keeps_its_host_or_takes_the_tunnels() -> None:
    tunnel = b"origin.test:443"
    assert hosts(with_host(head(("Host", "vhost.test"), target=None), tunnel)) == [b"vhost.test"]
    assert hosts(with_host(head(version="HTTP/1.0", target=None), tunnel)) == [tunnel]
    assert hosts(with_host(head(version="HTTP/1.0", target=None))) == []  # nowhere to take it
    assert with_host(head(version="HTTP/2.0", target="a")) == []  # :authority is HTTP/2's Host
    assert with_host(head(method="CONNECT")) == []


def names(fields: list[tuple[bytes, bytes]]) -> list[bytes]:
    return [name.lower() for name, _ in fields]


def value(fields: list[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    return next((v for n, v in fields if n.lower() == name), None)


def test_hop_by_hop_fields_and_connection_options_are_removed() -> None:
    fields = end_to_end(
        head(
            ("Host", "origin.test"),
            ("Connection", "X-Secret, keep-alive"),
            ("Connection", "x-other"),
            ("X-Secret", "s"),
            ("X-Other", "o"),
            ("Keep-Alive", "timeout=5"),
            ("Proxy-Connection", "keep-alive"),
            ("Proxy-Authorization", "Basic eDp5"),
            ("Upgrade", "h2c"),
            ("TE", "gzip"),
            ("Content-Length", "3"),
            ("X-Kept", "1"),
        )
    )
    assert names(fields) == [b"host", b"content-length", b"x-kept"]


def test_reshape_says_for_its_own_hop_what_the_client_said_for_its() -> None:
    close = end_to_end(head(("Connection", "Close"), ("TE", "trailers;q=1, gzip")))
    assert value(close, b"connection") == b"close, te"
    assert value(close, b"te") == b"trailers"
    keep = end_to_end(head(("Connection", "keep-alive"), version="HTTP/1.0"))
    assert value(keep, b"connection") == b"keep-alive"
    assert value(end_to_end(head(("Connection", "keep-alive"))), b"connection") is None
    upgrade = end_to_end(head(("Connection", "Upgrade"), ("Upgrade", "websocket")))
    assert value(upgrade, b"connection") == b"upgrade"
    assert value(upgrade, b"upgrade") == b"websocket"
    h2 = end_to_end(head(("te", "trailers"), version="HTTP/2.0"))
    assert h2 == [(b"TE", b"trailers")]


field_names = st.sampled_from(
    [b"Host", b"Connection", b"Keep-Alive", b"TE", b"Upgrade", b"Content-Length", b"X-A", b"x-b"]
    + [name.title() for name in HOP_BY_HOP]
)
field_values = st.binary(max_size=40) | st.sampled_from(
    [b"close", b"keep-alive", b"x-a, X-B", b"upgrade", b"te", b"trailers", b"chunked", b"3"]
)
heads = st.builds(
    RequestHead,
    st.sampled_from(["HTTP/1.0", "HTTP/1.1", "HTTP/2.0"]),
    st.sampled_from(["GET", "POST", "CONNECT"]),
    st.none() | st.binary(max_size=20),
    st.lists(st.tuples(field_names, field_values), max_size=12),
)


@given(heads)
def test_what_leaves_has_no_hop_by_hop_field_but_reshapes_own(request_head: RequestHead) -> None:
    if refusal(request_head) is not None:
        return
    fields = end_to_end(request_head)
    options = {
        token.strip().lower()
        for name, v in request_head.fields
        if name.lower() == b"connection"
        for token in v.split(b",")
    }
    generated = {b"connection", b"te", b"upgrade"}
    for name, v in fields:
        lowered = name.lower()
        assert lowered not in (HOP_BY_HOP | options) - generated or lowered in {
            b"host",
            b"content-length",
        }, (name, v)
    # Framing and Host are never removed.
    for kept in (b"host", b"content-length", b"transfer-encoding"):
        assert names(fields).count(kept) == names(list(request_head.fields)).count(kept)
    if request_head.is_http1 and request_head.method != "CONNECT" and request_head.target_authority:
        assert hosts(with_host(request_head)) == [request_head.target_authority]
