"""reshape/upstream/hpack_encoder.py: header blocks any HPACK decoder reads back as the fields
sent, paths kept out of the table, repeated fields as indices from the memo."""

from __future__ import annotations

import random

import pytest
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.events import RequestReceived
from h2.settings import SettingCodes
from hpack import Decoder, Encoder, HeaderTuple, NeverIndexedHeaderTuple
from hpack.hpack import decode_integer
from hpack.table import HeaderTable

from reshape.upstream.h2 import origin_connection
from reshape.upstream.hpack_encoder import (
    SEEN_LIMIT,
    TABLE_SIZE_LIMIT,
    IndexedEncoder,
    RequestHeadEncoder,
)
from reshape.upstream.http2 import ClientConnection

NAMES = [b":path", b":authority", b"accept", b"user-agent", b"x-a", b"x-b", b"cookie", b"referer"]
BROWSER = [
    (b":method", b"GET"),
    (b":scheme", b"https"),
    (b":authority", b"origin.test"),
    (b"user-agent", b"Mozilla/5.0 (X11; Linux x86_64) Chrome/131.0.0.0 Safari/537.36"),
    (b"accept", b"image/avif,image/webp,image/*,*/*;q=0.8"),
    (b"sec-fetch-dest", b"image"),
    (b"referer", b"https://origin.test/"),
]


def field(rng: random.Random) -> tuple[bytes, bytes]:
    name = rng.choice(NAMES)
    # Few values per name, so that entries repeat, shadow older ones and get evicted; now and
    # then one larger than a small table.
    size = rng.choice([1, 2, 3, 40, 300])
    return name, b"v%d-" % rng.randrange(6) + b"x" * size


def request(path: bytes) -> list[tuple[bytes, bytes]]:
    return [*BROWSER[:3], (b":path", path), *BROWSER[3:]]


@pytest.mark.parametrize("seed", range(40))
def test_every_block_decodes_to_the_fields_sent(seed: int) -> None:
    """Through memo hits and misses, additions, evictions, oversized fields, never-indexed
    ones and table size changes, a decoder fed every block in order keeps in step."""
    rng = random.Random(seed)
    encoder, decoder = RequestHeadEncoder(), Decoder()
    for _ in range(300):
        block = [field(rng) for _ in range(rng.randrange(1, 12))]
        if rng.random() < 0.3:
            block = [*request(b"/p%d" % rng.randrange(3)), *block]  # memo hits
        if rng.random() < 0.2:
            block.append(NeverIndexedHeaderTuple(b"authorization", b"secret"))
        if rng.random() < 0.05:
            encoder.header_table_size = rng.choice([0, 100, 512, 4096])
        encoded = encoder.encode(block)
        assert [tuple(f) for f in decoder.decode(encoded, raw=True)] == [tuple(f) for f in block]
        assert list(decoder.header_table.dynamic_entries) == list(
            encoder.header_table.dynamic_entries
        )


def test_paths_stay_out_of_the_table_and_repeated_fields_are_one_byte_each() -> None:
    encoder, decoder = RequestHeadEncoder(), Decoder()
    first = encoder.encode(request(b"/tile-0.png"))
    second = encoder.encode(request(b"/tile-1.png"))  # the fields seen again go in the table
    table = list(encoder.header_table.dynamic_entries)
    assert b":path" not in {name for name, _ in table}
    assert len(table) == 5  # authority, user agent, accept, sec-fetch-dest, referer
    again = encoder.encode(request(b"/tile-2.png"))
    assert list(encoder.header_table.dynamic_entries) == table  # nothing added, nothing moved
    # Every field but the path is an index (one byte here); the path a literal without
    # indexing (RFC 7541 §6.2.2: first byte 0000xxxx), its name the static table's :path.
    path_at = 3
    authority = 0x80 | (62 + table.index((b":authority", b"origin.test")))  # newest first
    assert again[:path_at] == bytes([0x82, 0x87, authority])
    assert again[path_at] == 0x04
    assert len(again) < len(first) // 3
    decoder.decode(first)
    decoder.decode(second)
    assert decoder.decode(again, raw=True)[3] == (b":path", b"/tile-2.png")


def test_the_memo_forgets_indices_once_an_addition_moves_them() -> None:
    encoder, decoder = RequestHeadEncoder(), Decoder()
    for path in (b"/a", b"/b"):
        decoder.decode(encoder.encode(request(path)))
    ua = (b"user-agent", BROWSER[3][1])
    before = encoder.encode([ua])
    encoder.encode([(b"x-new", b"1")])  # seen once: not added
    assert encoder.encode([ua]) == before
    encoder.encode([(b"x-new", b"1")])  # added: the user agent's entry is one further down
    after = encoder.encode([ua])
    assert after == bytes([before[0] + 1])
    assert encoder.header_table.search(*ua) == (after[0] & 0x7F, *ua)


def test_a_field_goes_into_the_table_the_second_time_it_is_sent() -> None:
    encoder, decoder = RequestHeadEncoder(), Decoder()
    trace = (b"traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
    once = encoder.encode([trace])
    assert once[0] & 0xF0 == 0x00  # a literal without indexing (RFC 7541 §6.2.2)
    assert list(encoder.header_table.dynamic_entries) == []
    twice = encoder.encode([trace])
    assert twice[0] & 0xC0 == 0x40  # a literal with incremental indexing (§6.2.1)
    assert list(encoder.header_table.dynamic_entries) == [trace]
    thrice = encoder.encode([trace])
    assert thrice == bytes([0x80 | 62])  # the dynamic table's first entry
    for block in (once, twice, thrice):
        assert decoder.decode(block, raw=True) == [trace]


def test_values_sent_once_leave_the_table_and_the_memo_as_they_were() -> None:
    """A POST's content-length, a trace id: each request's own value, and the browser's
    fields keep their one-byte indices from the memo."""
    encoder, decoder = RequestHeadEncoder(), Decoder()
    for path in (b"/a", b"/b"):
        decoder.decode(encoder.encode(request(path)))
    table = list(encoder.header_table.dynamic_entries)
    indexed = encoder.encode(request(b"/c"))
    for n in range(200):
        fields = [*request(b"/event-%d" % n), (b"content-length", b"%d" % (200 + n))]
        block = encoder.encode(fields)
        assert block.startswith(indexed[:3])  # :method, :scheme, :authority as before
        assert [tuple(f) for f in decoder.decode(block, raw=True)] == fields
    assert list(encoder.header_table.dynamic_entries) == table


def test_fields_seen_once_are_remembered_up_to_a_limit() -> None:
    encoder = RequestHeadEncoder()
    first = (b"x-request-id", b"0")
    encoder.encode([first])
    for n in range(1, SEEN_LIMIT + 1):
        encoder.encode([(b"x-request-id", b"%d" % n)])
    assert list(encoder.header_table.dynamic_entries) == []
    encoder.encode([first])  # forgotten: its first sight again
    assert list(encoder.header_table.dynamic_entries) == []
    encoder.encode([(b"x-request-id", b"%d" % SEEN_LIMIT)])  # still remembered
    assert list(encoder.header_table.dynamic_entries) == [(b"x-request-id", b"%d" % SEEN_LIMIT)]


def test_a_plain_hpack_encoder_would_have_moved_the_indices() -> None:
    """Why paths stay out: with hpack's own encoder each new path is added and every repeated
    field's index changes from one request to the next."""
    encoder = Encoder()
    encoder.encode(request(b"/tile-1.png"))
    ua = encoder.header_table.search(b"user-agent", BROWSER[3][1])
    encoder.encode(request(b"/tile-2.png"))
    moved = encoder.header_table.search(b"user-agent", BROWSER[3][1])
    assert ua is not None and moved is not None and moved[0] == ua[0] + 1
    assert HeaderTable.STATIC_TABLE_LENGTH == 61


# RFC 7541 §4.2: after several table size changes between two blocks, the next block says the
# smallest size, then the last if it differs. hpack 4.2 sends every size in turn (above the limit
# the decoder has by then, if larger first) or none when the same size came twice.
@pytest.mark.parametrize(
    ("settings", "updates"),
    [
        ([100], [100]),
        ([100, 100], [100]),
        ([8192, 512], [512]),
        ([512, 8192], [512, TABLE_SIZE_LIMIT]),  # no more than the limit
        ([1000, 500, 800], [500, 800]),
        ([4096], []),  # the size in force: nothing to say
        ([100, 4096], [100, 4096]),
    ],
)
def test_a_block_says_the_smallest_table_size_then_the_last(
    settings: list[int], updates: list[int]
) -> None:
    encoder, decoder = RequestHeadEncoder(), Decoder()
    decoder.decode(encoder.encode(request(b"/a")))  # the table holds the browser's fields
    for size in settings:
        encoder.header_table_size = size
    block = encoder.encode(request(b"/b"))
    assert _size_updates(block) == updates
    decoder.max_allowed_table_size = settings[-1]  # the origin's limit by then
    assert [tuple(f) for f in decoder.decode(block, raw=True)] == request(b"/b")
    assert list(decoder.header_table.dynamic_entries) == list(encoder.header_table.dynamic_entries)
    assert _size_updates(encoder.encode(request(b"/c"))) == []


def _size_updates(block: bytes) -> list[int]:
    """The dynamic table size updates a block starts with (RFC 7541 §6.3: 001xxxxx)."""
    sizes = []
    at = 0
    while at < len(block) and block[at] & 0xE0 == 0x20:
        size, used = decode_integer(block[at:], 5)
        sizes.append(size)
        at += used
    return sizes


@pytest.mark.parametrize("settings", [[100, 100], [8192, 512], [512, 8192], [0, 0, 4096]])
def test_an_origin_changing_its_table_size_twice_keeps_every_request(
    settings: list[int],
) -> None:
    """The engine's connection against h2's server: the origin's SETTINGS twice between two
    requests, and its decoder still reads every request."""
    client, server = origin_connection(), H2Connection(H2Configuration(client_side=False))
    client.initiate()
    server.initiate_connection()
    _exchange_bytes(client, server)
    received: list[list[tuple[bytes, bytes]]] = []
    for n, path in enumerate((b"/a", b"/b", b"/c")):
        if n == 1:
            for size in settings:
                server.update_settings({SettingCodes.HEADER_TABLE_SIZE: size})
            _exchange_bytes(client, server)
        fields = [*request(path), (b"x-n", b"v" * 150 + b"%d" % n)]
        client.send_headers(client.next_stream_id(), fields, end_stream=True)
        for event in server.receive_data(client.data_to_send()):
            if isinstance(event, RequestReceived):
                received.append([(bytes(k), bytes(v)) for k, v in event.headers])
    assert [head[3] for head in received] == [(b":path", p) for p in (b"/a", b"/b", b"/c")]
    assert all(head[-1][1].startswith(b"v" * 150) for head in received)


def _exchange_bytes(client: ClientConnection, server: H2Connection) -> None:
    for _ in range(3):
        server.receive_data(client.data_to_send())
        client.receive_data(server.data_to_send())


RESPONSE_NAMES = [b"server", b"date", b"content-type", b"content-length", b"etag", b"set-cookie"]


def response_field(rng: random.Random) -> tuple[object, ...]:
    name = rng.choice(RESPONSE_NAMES)
    value = b"r%d-" % rng.randrange(8) + b"x" * rng.choice([1, 5, 60, 300])
    shape = rng.randrange(5)
    if shape == 0:
        return HeaderTuple(name, value)
    if shape == 1:
        return NeverIndexedHeaderTuple(name, value)
    if shape == 2:
        return (name, value, rng.random() < 0.3)  # a (name, value, sensitive) triple
    if shape == 3:
        return (name.decode(), value.decode())  # str, as hpack also takes
    return (name, value)


@pytest.mark.parametrize("seed", range(40))
def test_the_indexed_encoder_sends_what_hpacks_sends(seed: int) -> None:
    """Byte for byte, through exact and name-only matches, additions, evictions, oversized and
    never-indexed fields, triples, str fields and single table size changes (up to
    TABLE_SIZE_LIMIT: above it, ours keeps the limit)."""
    rng = random.Random(seed)
    ours, hpacks, decoder = IndexedEncoder(), Encoder(), Decoder()
    for _ in range(300):
        block = [(b":status", rng.choice([b"200", b"204", b"404", b"299"]))]
        block += [response_field(rng) for _ in range(rng.randrange(0, 10))]
        if rng.random() < 0.05:
            size = rng.choice([0, 100, 512, 4096, 65536])
            ours.header_table_size = size
            hpacks.header_table_size = min(size, TABLE_SIZE_LIMIT)  # ours uses no more
            decoder.max_allowed_table_size = max(size, 4096)
        encoded = ours.encode(block)
        assert encoded == hpacks.encode(block)
        decoded = decoder.decode(encoded, raw=True)
        assert len(decoded) == len(block)
        assert list(ours.header_table.dynamic_entries) == list(hpacks.header_table.dynamic_entries)


def test_the_indexed_encoder_finds_a_held_field_without_hpacks_add() -> None:
    encoder = IndexedEncoder()
    head = [(b":status", b"200"), (b"server", b"nginx"), (b"content-type", b"image/png")]
    encoder.encode(head)
    added: list[object] = []
    encoder.add = lambda *args: added.append(args) or b""  # type: ignore[method-assign]
    again = encoder.encode(head)
    assert added == []
    assert again == bytes([0x88, 0x80 | 63, 0x80 | 62])  # static 8; server, then the newest


@pytest.mark.parametrize(
    ("settings", "updates"),
    [
        ([65536], []),  # Chromium's: the table stays at the protocol's initial size
        ([2**31 - 1], []),
        ([1024, 65536], [1024, TABLE_SIZE_LIMIT]),
        ([65536, 1024], [1024]),
    ],
)
def test_a_peer_allowing_a_larger_table_gets_at_most_the_limit(
    settings: list[int], updates: list[int]
) -> None:
    encoder, decoder = IndexedEncoder(), Decoder()
    for size in settings:
        encoder.header_table_size = size
    decoder.max_allowed_table_size = settings[-1]
    first = encoder.encode([(b":status", b"200")])
    assert _size_updates(first) == updates
    decoder.decode(first)
    for n in range(2000):  # distinct fields, each added to the table
        block = encoder.encode([(b"etag", b'"%d"' % n), (b"date", b"%d" % n)])
        assert [tuple(f) for f in decoder.decode(block, raw=True)] == [
            (b"etag", b'"%d"' % n),
            (b"date", b"%d" % n),
        ]
    assert encoder.header_table_size <= TABLE_SIZE_LIMIT
    assert encoder.header_table._current_size <= TABLE_SIZE_LIMIT
    assert list(decoder.header_table.dynamic_entries) == list(encoder.header_table.dynamic_entries)
