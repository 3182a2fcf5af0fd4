"""reshape/upstream/hpack_table.py: the same answers and the same header blocks as hpack's own
table, without walking it."""

from __future__ import annotations

import random

import pytest
from hpack import Decoder, Encoder, NeverIndexedHeaderTuple
from hpack.table import HeaderTable

from reshape.upstream.hpack_table import IndexedHeaderTable

NAMES = [b":path", b":authority", b"accept", b"user-agent", b"x-a", b"x-b", b"cookie", b"referer"]


def field(rng: random.Random) -> tuple[bytes, bytes]:
    name = rng.choice(NAMES)
    # Few values per name, so that entries repeat, shadow older ones and get evicted; now and
    # then one larger than a small table.
    size = rng.choice([1, 2, 3, 40, 300])
    return name, b"v%d-" % rng.randrange(6) + b"x" * size


@pytest.mark.parametrize("seed", range(40))
def test_every_search_answers_as_hpack_does(seed: int) -> None:
    rng = random.Random(seed)
    ours, theirs = IndexedHeaderTable(), HeaderTable()
    for _ in range(600):
        roll = rng.random()
        if roll < 0.45:
            name, value = field(rng)
            ours.add(name, value)
            theirs.add(name, value)
        elif roll < 0.5:
            size = rng.choice([0, 64, 256, 1024, 4096])
            ours.maxsize = theirs.maxsize = size
        else:
            name, value = field(rng) if rng.random() < 0.8 else (b"accept", b"*/*")  # static
            assert ours.search(name, value) == theirs.search(name, value)
        assert list(ours.dynamic_entries) == list(theirs.dynamic_entries)


def test_a_name_whose_entries_are_all_evicted_is_not_found() -> None:
    table = IndexedHeaderTable()
    table.maxsize = 100  # two entries of ~45 bytes
    table.add(b"x-a", b"1")
    table.add(b"x-b", b"2")
    assert table.search(b"x-a", b"1") == (HeaderTable.STATIC_TABLE_LENGTH + 2, b"x-a", b"1")
    table.add(b"x-c", b"3")  # evicts x-a
    assert table.search(b"x-a", b"1") is None
    assert table.search(b"x-b", b"9") == (HeaderTable.STATIC_TABLE_LENGTH + 2, b"x-b", None)


@pytest.mark.parametrize("seed", range(5))
def test_an_encoder_with_it_writes_the_same_bytes(seed: int) -> None:
    rng = random.Random(seed)
    ours, theirs, decoder = Encoder(), Encoder(), Decoder()
    ours.header_table = IndexedHeaderTable()
    for _ in range(200):
        block = [field(rng) for _ in range(rng.randrange(1, 12))]
        if rng.random() < 0.2:
            block.append(NeverIndexedHeaderTuple(b"authorization", b"secret"))
        if rng.random() < 0.05:
            ours.header_table_size = theirs.header_table_size = rng.choice([512, 4096])
        encoded = ours.encode(block)
        assert encoded == theirs.encode(block)
        assert [tuple(f) for f in decoder.decode(encoded, raw=True)] == [tuple(f) for f in block]
