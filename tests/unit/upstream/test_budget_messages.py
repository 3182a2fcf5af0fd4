"""The budget's messages survive the line they travel as; anything else is refused."""

from __future__ import annotations

import pytest

from reshape.upstream.budget.messages import (
    Acquire,
    Cancel,
    Deny,
    Grant,
    Learned,
    Message,
    MessageError,
    Reclaim,
    Release,
    Takes,
    decode,
    encode,
)
from reshape.upstream.pool import PoolKey, Proto

KEY = PoolKey("https", "origin.test", 443, "origin.test")


@pytest.mark.parametrize(
    "message",
    [
        Acquire(7, "http://a:80#0011", 6, False),
        Acquire(8, "p", 1, True),
        Cancel(7),
        Release("p"),
        Grant(7, "p"),
        Deny(8),
        Reclaim("p", 2, 0),
        Reclaim("p", None, 3),
        Reclaim("p", 0, 1),
        Learned(KEY, Proto.H2),
        Learned(PoolKey("http", "::1", 8080, None), Proto.H1),
        Learned(KEY, None),
        Takes(PoolKey("http", "origin.test", 80, None), 101),
    ],
)
def test_every_message_goes_as_one_line_and_comes_back(message: Message) -> None:
    line = encode(message)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert decode(line) == message


@pytest.mark.parametrize(
    "line",
    [
        b"",
        b"not json\n",
        b'{"acquire": 1}\n',
        b'["acquire", 1, "p", 0, false]\n',  # a cap of 0
        b'["acquire", "1", "p", 2, false]\n',
        b'["release"]\n',
        b'["reclaim", "p", -1, 0]\n',
        b'["reclaim", "p", null, -2]\n',
        b'["learned", "ftp", "h", 21, null, "h1"]\n',  # no such scheme
        b'["learned", "http", "h", 80, null, "h3"]\n',  # no such protocol
        b'["learned", "http", "h", 80, 5, "h1"]\n',
        b'["takes", "http", "h", 80, null, 0]\n',  # a connection takes one at least
        b'["takes", "http", "h", 80, null, "3"]\n',
        b'["shout", 1]\n',
        b"\xff\xfe\n",
    ],
)
def test_a_line_that_is_no_message_is_refused(line: bytes) -> None:
    with pytest.raises(MessageError, match="not a budget message"):
        decode(line)
