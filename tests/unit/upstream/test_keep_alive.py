"""An origin's `Keep-Alive` terms (reshape/upstream/keep_alive.py), as Apache and Node.js state
them."""

from __future__ import annotations

import pytest

from reshape.upstream.keep_alive import MARGIN_SECONDS, Terms, idle_limit, parse


def field(value: bytes) -> list[tuple[bytes, bytes]]:
    return [(b"Content-Type", b"text/plain"), (b"Keep-Alive", value)]


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (field(b"timeout=5, max=100"), (5, 100)),  # Apache
        (field(b"timeout=5"), (5, None)),  # Node.js without maxRequestsPerSocket, nginx
        (field(b'Timeout = "15" ,MAX=20'), (15, 20)),  # quoted, spaced, any case
        (field(b"timeout=5, max=100") + field(b"timeout=3"), (3, 100)),  # the lowest counts
        (field(b"max=0"), (None, 0)),
        ([(b"keep-alive", b"timeout=5, max=100")], (5, 100)),  # the name in any case
        ([(b"Connection", b"keep-alive")], (None, None)),
        (field(b""), (None, None)),
        (field(b"timeout=0, max=-1"), (0, None)),  # Apache's sub-second timeout; -1 no count
        (field(b"timeout=5s, max=1e3, foo=1"), (None, None)),  # not numbers; unknown names
        (field(b"timeout=99999999999, max=99999999999"), (None, None)),  # past any limit
        (field(b"timeout=5; max=100"), (None, None)),  # not this field's list syntax
    ],
)
def test_the_field_is_read_and_what_does_not_parse_is_absent(
    fields: list[tuple[bytes, bytes]], expected: tuple[int | None, int | None]
) -> None:
    assert parse(fields) == expected


def test_the_pool_closes_a_second_before_the_origin_or_halfway_for_a_short_timeout() -> None:
    assert MARGIN_SECONDS == 1.0
    assert idle_limit(5) == 4.0
    assert idle_limit(2) == 1.0
    assert idle_limit(1) == 0.5
    # Apache's `KeepAliveTimeout 500ms` says timeout=0: kept for requests already waiting.
    assert idle_limit(0) == 0.001


def test_apaches_count_down_is_read_as_the_requests_left_after_each_response() -> None:
    # httpd with MaxKeepAliveRequests 100: max=100 on the first response, one less on each
    # next; the response that says max=1 is followed by one more request, which closes.
    terms = Terms()
    # The first says too little to tell a count from a total: one short of Apache's count.
    assert terms.response(field(b"timeout=5, max=100")) == (4.0, 99)
    assert terms.response(field(b"timeout=5, max=99")) == (4.0, 99)
    assert terms.response(field(b"timeout=5, max=98")) == (4.0, 98)
    for left in range(97, 0, -1):
        assert terms.response(field(b"timeout=5, max=%d" % left)) == (4.0, left)


def test_a_count_down_is_followed_across_a_response_that_did_not_say() -> None:
    terms = Terms()
    terms.response(field(b"max=10"))
    terms.response(field(b"max=9"))
    assert terms.response([]) == (None, None)
    assert terms.response(field(b"max=7")) == (None, 7)


def test_nodes_repeated_total_is_read_as_a_total() -> None:
    # Node.js 20 with server.maxRequestsPerSocket = 3 says max=3 on each response, then closes
    # after the third (measured: tests/system/upstream/test_engine_origin_keep_alive.py).
    terms = Terms()
    assert terms.response(field(b"timeout=5, max=3")) == (4.0, 2)
    assert terms.response(field(b"timeout=5, max=3")) == (4.0, 1)


def test_a_max_that_fits_neither_reading_is_taken_at_its_lowest() -> None:
    terms = Terms()
    terms.response(field(b"max=10"))
    terms.response(field(b"max=9"))  # a count, so far
    assert terms.response(field(b"max=50")) == (None, 47)  # 50 less the 3 served
    assert terms.response(field(b"max=2")) == (None, 0)  # never below none
