"""HPACK encoders: the engine's request heads (repeated fields from a memo, paths kept out of the
dynamic table) and the response heads of the proxy's HTTP/2 client connections (fields the table
holds found through a dictionary).

A browser's requests repeat most of their fields (user agent, client hints, accept, referer,
sec-fetch-*); once the origin connection's dynamic table holds them, each is sent as a one-byte
index. hpack 4.2's `Encoder` still works each one out in Python, field by field (a table search,
the integer encoding, a debug log call, a join): in a profile of bursts of browser-like requests
through the pool, encoding the request heads was 6.8% of the proxy's CPU (py-spy,
bench/RESULTS.md). Here the encoding of a field the table holds exactly is remembered until the
table changes, which it then rarely does: `:path` is sent as a literal *without indexing* (RFC
7541 §6.2.2), as it is different on almost every request. Indexed, each new path was added to the
table, moving every other entry's index (so no encoding stayed valid from one request to the
next) and pushing the repeated fields out of the 4 KB table.

A field goes into the table only the second time it is sent (until then, as a literal without
indexing): a value one request carries once (a POST's `content-length`, a `traceparent`, an
`x-request-id`, a client's cookie sent once) would otherwise take a place every browser's fields
want, evict the oldest of them, and clear the memo. With the lab's app page (half its feed
requests POSTs of 200-600 bytes) each POST did all three. Which fields were seen is kept as
hashes of the last `SEEN_LIMIT`; a collision only indexes a field at its first sight, as hpack
always does.

Everything else is hpack's: a field not found, or found by name only, goes through
`Encoder.add` (and into the table, unless never-indexed). Table size updates come first, as RFC
7541 §4.2 says and hpack 4.2 does not quite do: after the origin changed its
SETTINGS_HEADER_TABLE_SIZE more than once between two request heads, hpack sends every size in
turn (a larger one first is above the limit the origin's decoder has by then) or, when the same
size came twice, none (its `resized` flag is cleared by the second); either way the origin
answers COMPRESSION_ERROR and the connection's streams fail. Here the block says the smallest
size since the last block, then the last one if it differs.

`IndexedEncoder`, under both: hpack's `Encoder` with the same bytes out, but a field the table
holds exactly is found through `IndexedHeaderTable`'s dictionaries and its index's encoding is
kept, without hpack's `add` (its table walk, debug log call and integer encoding). The proxy's
client connections use it as it is (reshape/mitm/patches/h2_client_hpack.py): a browser's
responses repeat most of their fields too (server, content type, date, cache fields), mixed with
values each response has alone (content-length, etag), which hpack indexes like the others and
which would clear a memo on every response. An nginx response head: 27.7 us against 13.4.

No maintained library offers a faster HPACK encoder (reshape/upstream/hpack_table.py says why
jh2 is not one), so this extends hpack's, checked on the hpack releases in reshape/upstream/h2.py
(`HPACK_CHECKED_ON`).
"""

from __future__ import annotations

from collections.abc import Iterable

from hpack import HeaderTuple
from hpack.hpack import INDEX_NONE, Encoder, _to_bytes

from reshape.upstream.hpack_table import IndexedHeaderTable

# Fields sent without indexing: their values rarely repeat.
UNINDEXED = frozenset({b":path"})
# The most of its dynamic table an encoder uses, whatever the peer allows: the protocol's
# initial size, and nghttp2's encoder limit. hpack's encoder takes the peer's
# SETTINGS_HEADER_TABLE_SIZE as it comes: Chromium announces 64 KiB, and a peer announcing 4 GiB
# would have the proxy keep every distinct field it ever sent on the connection (a response's
# date, etag, content-length...), one connection growing without bound.
TABLE_SIZE_LIMIT = 4096
# How many fields sent once are remembered, to be indexed when sent again: far more than the
# distinct fields of a few browsers' requests that a 4 KB table can hold.
SEEN_LIMIT = 512


class IndexedEncoder(Encoder):
    """hpack's `Encoder` over an `IndexedHeaderTable`: the same blocks (but for the table size,
    at most TABLE_SIZE_LIMIT, and its updates, which follow RFC 7541 §4.2), a field the table
    holds exactly sent as its index without going through `Encoder.add`. Takes what h2 gives
    an encoder: (name, value) pairs, hpack `HeaderTuple`s, or (name, value, sensitive)
    triples."""

    def __init__(self) -> None:
        super().__init__()
        self.header_table: IndexedHeaderTable = IndexedHeaderTable()
        self._indexed: dict[int, bytes] = {}  # index -> its encoding

    @property
    def header_table_size(self) -> int:
        return self.header_table.maxsize

    @header_table_size.setter
    def header_table_size(self, value: int) -> None:
        # h2 sets this as each SETTINGS_HEADER_TABLE_SIZE of the peer is acknowledged: the most
        # the peer's decoder holds. The encoder uses at most TABLE_SIZE_LIMIT of it (RFC 7541
        # §4.2 lets it use less). Every setting since the last block is kept, a repeated one
        # too: the next block must say the smallest of them. The size already in force, with
        # none pending, needs no update.
        value = min(value, TABLE_SIZE_LIMIT)
        if value == self.header_table.maxsize and not self.table_size_changes:
            return
        self.header_table.maxsize = value
        self.table_size_changes.append(value)

    def _encode_table_size_change(self) -> bytes:
        """The size updates the next block starts with: the smallest size set since the last
        block (the table's entries beyond it are gone), then the last one if it is larger;
        hpack encodes them."""
        changes = self.table_size_changes
        smallest, last = min(changes), changes[-1]
        self.table_size_changes = [smallest] if smallest == last else [smallest, last]
        return super()._encode_table_size_change()

    def encode(  # type: ignore[override]  # h2 gives pairs, HeaderTuples or triples
        self, headers: Iterable[tuple[bytes | str, ...]], huffman: bool = True
    ) -> bytes:
        block = []
        if self.table_size_changes:
            block.append(self._encode_table_size_change())
        search = self.header_table.search
        indexed = self._indexed
        for field in headers:
            if isinstance(field, HeaderTuple):
                sensitive = not field.indexable
            else:
                sensitive = len(field) > 2 and bool(field[2])
            name, value = field[0], field[1]
            if type(name) is not bytes or type(value) is not bytes:
                name, value = _to_bytes(name), _to_bytes(value)
            if not sensitive:
                match = search(name, value)
                if match is not None and match[2] is not None:  # the table holds it exactly
                    index = match[0]
                    encoded = indexed.get(index)
                    if encoded is None:
                        encoded = indexed[index] = self._encode_indexed(index)
                    block.append(encoded)
                    continue
            block.append(self.add((name, value), sensitive, huffman))
        return b"".join(block)


class RequestHeadEncoder(IndexedEncoder):
    """An `IndexedEncoder` that remembers how it encoded each field the table held exactly, for
    as long as the table stays as it was, never indexes the fields in UNINDEXED, and indexes
    others the second time they are sent. Takes what the engine gives h2: (name, value) pairs
    of bytes, and hpack `HeaderTuple`s (never-indexed ones for credentials)."""

    def __init__(self) -> None:
        super().__init__()
        self._memo: dict[tuple[bytes, bytes], bytes] = {}
        self._memo_table = self._table_state()  # the table the memo was made with
        self._seen: dict[int, None] = {}  # hashes of fields sent once, oldest first

    def _table_state(self) -> tuple[int, int]:
        """Changes whenever an entry's index may have: an entry added or any evicted."""
        table = self.header_table
        return table.additions, len(table.dynamic_entries)

    def encode(  # type: ignore[override]  # only the engine calls it, with pairs
        self, headers: Iterable[tuple[bytes, bytes]], huffman: bool = True
    ) -> bytes:
        block = []
        if self.table_size_changes:
            block.append(self._encode_table_size_change())
        memo = self._memo
        state = self._table_state()
        if state != self._memo_table:
            memo.clear()
            self._memo_table = state
        for field in headers:
            name, value = field[0], field[1]
            if isinstance(field, HeaderTuple) and not field.indexable:
                block.append(self.add((name, value), True, huffman))  # never indexed
                continue
            if name in UNINDEXED:
                block.append(self._unindexed(name, value, huffman))
                continue
            key = (name, value)
            encoded = memo.get(key)
            if encoded is None:
                if self._first_sight(key):
                    encoded = self._unindexed(name, value, huffman)  # the table is unchanged
                else:
                    encoded = self.add(key, False, huffman)
                    state = self._table_state()
                    if state != self._memo_table:  # added or evicted: indices moved
                        memo.clear()
                        self._memo_table = state
                        block.append(encoded)
                        continue
                if encoded[0] & 0x80:  # an index: valid while the table stays as it is
                    memo[key] = encoded
            block.append(encoded)
        return b"".join(block)

    def _first_sight(self, key: tuple[bytes, bytes]) -> bool:
        """Whether `key` is sent for the first time (as far as the last SEEN_LIMIT tell)."""
        seen = self._seen
        digest = hash(key)
        if digest in seen:
            return False
        seen[digest] = None
        if len(seen) > SEEN_LIMIT:
            del seen[next(iter(seen))]
        return True

    def _unindexed(self, name: bytes, value: bytes, huffman: bool) -> bytes:
        """A field as a literal without indexing (or an index, if the table holds it exactly)."""
        match = self.header_table.search(name, value)
        if match is None:
            return self._encode_literal(name, value, INDEX_NONE, huffman)
        index, _, exact = match
        if exact is not None:
            return self._encode_indexed(index)
        return self._encode_indexed_literal(index, value, INDEX_NONE, huffman)
