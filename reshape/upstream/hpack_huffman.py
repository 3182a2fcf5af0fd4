"""HPACK's Huffman code (RFC 7541 §5.2, Appendix B) decoded a byte at a time.

hpack 4.2's `decode_huffman` walks nghttp2's state machine a nibble at a time: per input byte,
two table lookups, two tuple unpackings and four flag tests, in Python. In py-spy's profile of the
lab's app page loads through the pool it was ~4% of the proxy's CPU: a browser's paths and an
origin's dates, lengths and tags arrive as Huffman-coded literals, on both ends of the proxy.
Here the same machine is folded into tables by state and whole byte, built once from hpack's
own (so both decode the same code, and fail on the same input): per byte, the next state and the
symbols it completes, each one lookup. About 2.3× faster on header values (a path, a date, a user
agent); the tables take ~2 MB and ~0.1 s to build, once per process. No maintained library
offers a faster decoder for Python (reshape/upstream/hpack_table.py says why jh2 is not one);
checked on the hpack releases in reshape/upstream/h2.py (`HPACK_CHECKED_ON`).
"""

from __future__ import annotations

from hpack.exceptions import HPACKDecodingError
from hpack.huffman_table import (
    HUFFMAN_COMPLETE,
    HUFFMAN_EMIT_SYMBOL,
    HUFFMAN_FAIL,
    HUFFMAN_TABLE,
)

# nghttp2's machine has 256 states; hpack's table has 16 transitions (one per nibble) for each.
_STATES = 256
assert len(HUFFMAN_TABLE) == _STATES * 16

# A state as the index of its first transition in the tables below (`state * 256`), made once so
# that the tables share these ints.
_STARTS = tuple(state * 256 for state in range(_STATES))
_FAILED = -1


def _byte_tables() -> tuple[list[int], list[bytes], frozenset[int]]:
    """By `state * 256 + byte`: the state the byte leads to (as its `_STARTS` entry; `_FAILED`
    where hpack's machine fails on either nibble) and the symbols it completes; and the states
    the code may end in. (Whether it may end depends on the state reached alone, as in hpack's
    table, checked as it is folded.)"""
    following = [_FAILED] * (_STATES * 256)
    completed = [b""] * (_STATES * 256)
    shared: dict[bytes, bytes] = {}
    accepting: dict[int, bool] = {}
    for state in range(_STATES):
        for byte in range(256):
            at, flags, symbols = state, 0, bytearray()
            for nibble in (byte >> 4, byte & 0x0F):
                at, flags, symbol = HUFFMAN_TABLE[at * 16 + nibble]
                if flags & HUFFMAN_FAIL:
                    break
                if flags & HUFFMAN_EMIT_SYMBOL:
                    symbols.append(symbol)
                may_end = bool(flags & HUFFMAN_COMPLETE)
                if accepting.setdefault(at, may_end) is not may_end:
                    raise AssertionError("hpack's Huffman table: completion not by state")
            else:
                index = state * 256 + byte
                following[index] = _STARTS[at]
                octets = bytes(symbols)
                completed[index] = shared.setdefault(octets, octets)
    return following, completed, frozenset(_STARTS[s] for s, ends in accepting.items() if ends)


_FOLLOWING, _COMPLETED, _ACCEPTING = _byte_tables()


def decode_huffman(data: bytes | bytearray | memoryview | None) -> bytes:
    """The octets `data` codes; the errors (and messages) of hpack's `decode_huffman`."""
    if not data:
        return b""
    following, completed = _FOLLOWING, _COMPLETED
    state = 0
    decoded = bytearray()
    for byte in data:
        index = state + byte
        state = following[index]
        if state < 0:
            raise HPACKDecodingError("Invalid Huffman string")
        decoded += completed[index]
    if state not in _ACCEPTING:
        raise HPACKDecodingError("Incomplete Huffman string")
    return bytes(decoded)
