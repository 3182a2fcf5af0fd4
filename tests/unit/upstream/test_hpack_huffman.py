"""reshape/upstream/hpack_huffman.py: the same octets, and the same errors, as hpack's decoder."""

from __future__ import annotations

import pytest
from hpack.exceptions import HPACKDecodingError
from hpack.huffman import HuffmanEncoder
from hpack.huffman_constants import REQUEST_CODES, REQUEST_CODES_LENGTH
from hpack.huffman_table import decode_huffman as hpacks_decode
from hypothesis import given, settings
from hypothesis import strategies as st

from reshape.upstream.hpack_huffman import decode_huffman

ENCODER = HuffmanEncoder(REQUEST_CODES, REQUEST_CODES_LENGTH)


def outcome(decode: object, data: bytes) -> object:
    try:
        return decode(data)  # type: ignore[operator]
    except HPACKDecodingError as e:
        return type(e), str(e)


@settings(max_examples=3000, deadline=None)
@given(st.binary(max_size=300))
def test_every_string_comes_back(octets: bytes) -> None:
    assert decode_huffman(ENCODER.encode(octets)) == octets


@settings(max_examples=5000, deadline=None)
@given(st.binary(max_size=12))
def test_arbitrary_bytes_decode_or_fail_as_in_hpack(data: bytes) -> None:
    assert outcome(decode_huffman, data) == outcome(hpacks_decode, data)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\xff\xff\xff\xff", "Invalid Huffman string"),  # EOS (30 ones) inside the string
        (b"\x00", "Incomplete Huffman string"),  # '0' (5 bits) then 3 padding bits not all ones
        (b"\xfe", "Incomplete Huffman string"),  # 7 ones of a longer code: not padding
    ],
)
def test_malformed_codes_fail_with_hpacks_message(data: bytes, message: str) -> None:
    with pytest.raises(HPACKDecodingError, match=message):
        decode_huffman(data)
    assert outcome(hpacks_decode, data) == (HPACKDecodingError, message)


def test_every_byte_value_and_memoryviews() -> None:
    octets = bytes(range(256)) * 2
    coded = ENCODER.encode(octets)
    assert decode_huffman(memoryview(coded)) == octets == hpacks_decode(coded)
    assert decode_huffman(b"") == b"" == decode_huffman(None)
