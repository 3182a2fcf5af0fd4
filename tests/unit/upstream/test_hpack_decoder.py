"""reshape/upstream/hpack_decoder.py: the same headers, errors and table as hpack's decoder,
block after block, for well-formed and for arbitrary input."""

from __future__ import annotations

import random

import pytest
from hpack import Decoder, Encoder, HeaderTuple, NeverIndexedHeaderTuple, OversizedHeaderListError
from hpack.huffman import HuffmanEncoder
from hpack.huffman_constants import REQUEST_CODES, REQUEST_CODES_LENGTH
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reshape.upstream.hpack_decoder import HeadDecoder

HUFFMAN = HuffmanEncoder(REQUEST_CODES, REQUEST_CODES_LENGTH)

BROWSER = [
    (b":method", b"GET"),
    (b":authority", b"127.0.0.17:8443"),
    (b":scheme", b"https"),
    (b":path", b"/h2/app/tile-001.png"),
    (b"user-agent", b"Mozilla/5.0 (X11; Linux x86_64) HeadlessChrome/131.0.0.0 Safari/537.36"),
    (b"accept", b"image/avif,image/webp,image/apng,image/*,*/*;q=0.8"),
    (b"sec-fetch-dest", b"image"),
    (b"accept-encoding", b"gzip, deflate, br, zstd"),
    (b"accept-language", b"en-US"),
]


def outcome(decoder: Decoder, block: bytes) -> object:
    """What a decoder makes of a block: its headers (with their classes) or its error, and
    its table afterwards."""
    try:
        headers: object = [(type(h), tuple(h)) for h in decoder.decode(block, raw=True)]
    except Exception as e:  # noqa: BLE001 (the comparison is the point)
        headers = (type(e), str(e))
    return headers, list(decoder.header_table.dynamic_entries), decoder.header_table_size


def both(blocks: list[bytes], limit: int | None = None) -> None:
    """Ours decodes each block as hpack's does, but for a header list over the limit: hpack's
    stops there, ours decodes the block to its end all the same (RFC 9113 §10.5.1: the table
    stays the peer encoder's) and then raises. So ours is compared with hpack's without a limit,
    an OversizedHeaderListError in place of headers over it."""
    ours, hpacks = HeadDecoder(), Decoder()
    if limit is not None:
        ours.max_header_list_size = limit
    hpacks.max_header_list_size = 2**62
    for block in blocks:
        headers, *table = outcome(hpacks, block)
        if isinstance(headers, list) and list_size(headers) > ours.max_header_list_size:
            limit_passed = (
                f"A header list larger than {ours.max_header_list_size} has been received"
            )
            headers = (OversizedHeaderListError, limit_passed)
        assert outcome(ours, block) == (headers, *table)


def list_size(headers: list[tuple[type, tuple[bytes, bytes]]]) -> int:
    """A header list's size as RFC 7541 §4.1 counts it."""
    return sum(32 + len(name) + len(value) for _, (name, value) in headers)


@pytest.mark.parametrize("seed", range(30))
def test_well_formed_blocks_decode_as_hpacks(seed: int) -> None:
    """Browser-like heads and random fields through an encoder: indices (one byte and longer,
    static and dynamic), literals with and without indexing, never-indexed fields, evictions
    and size updates."""
    rng = random.Random(seed)
    encoder = Encoder()
    blocks = []
    for n in range(120):
        fields: list[tuple[bytes, bytes]] = [
            *BROWSER[:3],
            (b":path", b"/tile-%d.png" % rng.randrange(40)),
            *BROWSER[4:],
        ]
        for _ in range(rng.randrange(8)):
            name = b"x-%d" % rng.randrange(90)  # enough names to push indices past 126
            fields.append((name, b"v" * rng.choice([1, 10, 200])))
        if rng.random() < 0.2:
            fields.append(NeverIndexedHeaderTuple(b"cookie", b"id=%d" % n))
        if rng.random() < 0.05:
            encoder.header_table_size = rng.choice([0, 256, 4096])
        blocks.append(encoder.encode(fields))
    both(blocks)
    both(blocks, limit=2000)  # some blocks above the header list limit


def test_a_block_over_the_limit_is_decoded_to_its_end() -> None:
    # Its fields are discarded, and its table entries kept: the next block names them.
    encoder, decoder = Encoder(), HeadDecoder()
    decoder.max_header_list_size = 1_000
    fields = [(b"x-%d" % n, b"v" * 100) for n in range(20)]
    with pytest.raises(OversizedHeaderListError):
        decoder.decode(encoder.encode(fields), raw=True)
    assert [tuple(h) for h in decoder.decode(encoder.encode(fields[-3:]), raw=True)] == fields[-3:]


def test_static_and_dynamic_indices_come_back_as_header_tuples() -> None:
    encoder, decoder = Encoder(), HeadDecoder()
    decoder.decode(encoder.encode(BROWSER), raw=True)
    again = decoder.decode(encoder.encode(BROWSER), raw=True)
    assert [tuple(h) for h in again] == BROWSER
    assert all(type(h) is HeaderTuple and type(h[1]) is bytes for h in again)


@pytest.mark.parametrize(
    "block",
    [
        b"\x80",  # index 0
        b"\xff",  # a multi-byte index cut short
        b"\xbe",  # index 62 with an empty dynamic table
        b"\xff\x80\x01",  # index 255: beyond the tables
        b"\x82\x3f\xe1\x1f",  # a size update after a field
        b"\x3f\xe1\x1f\x82",  # a size update above the maximum
        b"\x40\x05ab",  # a literal cut short
        b"\x82" * 200,  # many fields
    ],
)
def test_malformed_blocks_fail_as_in_hpack(block: bytes) -> None:
    both([block])
    both([block], limit=100)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(max_size=40), min_size=1, max_size=6))
def test_arbitrary_bytes_decode_or_fail_as_in_hpack(blocks: list[bytes]) -> None:
    # After a valid block, so that the dynamic table holds entries.
    seeded = [Encoder().encode(BROWSER), *blocks]
    both(seeded)
    both(blocks, limit=64)


def _string(octets: bytes, huffman: bool) -> bytes:
    """A string literal (RFC 7541 §5.2) of up to 126 octets."""
    coded = HUFFMAN.encode(octets) if huffman else octets
    assert len(coded) < 0x7F
    return bytes([(0x80 if huffman else 0) | len(coded)]) + coded


def _literals() -> list[bytes]:
    """Literal fields of each kind (with and without indexing, never indexed), the name by a
    static index (the last is 61), the first dynamic one (62, the largest a one-byte prefix
    holds), an index in a second byte, or spelled out (Huffman or not), and values of 0 to 126
    octets (Huffman or not) and one of 127 (hpack's own way)."""
    fields = []
    for first, index_bits in ((0x40, 0x3F), (0x00, 0x0F), (0x10, 0x0F)):
        for name_index in (0, 4, 15, 61, 62, index_bits):
            if name_index > index_bits:
                continue
            for value in (b"", b"v", b"/tile-%d.png" % name_index, b"x" * 126, b"y" * 127):
                for huffman in (False, True):
                    head = bytes([first | name_index])
                    if name_index == index_bits:
                        head += b"\x00"  # the index continues in a second byte: 63 or 15
                    if not name_index:
                        head += _string(b"x-literal", huffman)
                    # 127 octets: the length continues in a second byte (0x7f, then 0).
                    long = len(value) >= 0x7F
                    fields.append(head + (b"\x7f\x00" + value if long else _string(value, huffman)))
    return fields


def test_literal_fields_decode_as_hpacks() -> None:
    """Each literal with an empty dynamic table, one entry in it and seven, then every prefix
    of it (cut in the name, its length, the value or its length) and every literal with a byte
    of its strings flipped (Huffman codes that fail)."""
    seeds = [Encoder().encode([(b"x-one", b"1")]), Encoder().encode(BROWSER)]
    for seed, entries in zip(seeds, (1, 7), strict=True):
        seeded = HeadDecoder()
        seeded.decode(seed, raw=True)
        assert len(seeded.header_table.dynamic_entries) == entries
    for field in _literals():
        both([field, field])
        for seed in seeds:
            both([seed, field, field])
        for cut in range(1, len(field)):
            both([seeds[1], field[:cut]])
        for position in range(1, len(field)):
            flipped = bytearray(field)
            flipped[position] ^= 0xFF
            both([seeds[1], bytes(flipped)])
