"""The HPACK decoder of the proxy's HTTP/2 connections, both ends: hpack's, with the fields most
blocks carry decoded in the block's loop.

Most fields of a browser's request heads, and many of an origin's response heads, arrive as an
index into the static or the dynamic table (RFC 7541 §6.1), one byte for the first 126 entries.
hpack 4.2's `Decoder` works each one out in Python through a chain of calls (the integer decoding,
the table lookup, a debug log call, a `HeaderTuple` built by a Python `__new__`, and each header
built again at the end by `_unicode_if_needed`): in py-spy's profile of the lab's app page loads
through the pool, decoding header blocks was ~6.5% of the proxy's CPU. Here the block's loop
decodes such a field itself (static entries from tuples made once) and returns the headers it
built. The rest are mostly literals (a path, a date, a length, a tag; §6.2) whose name index and
string lengths fit their first byte: hpack copies the rest of the block twice for each (a
`memoryview` made bytes, then sliced) and decodes their Huffman codes a nibble at a time; here
they are read in place and decoded by reshape/upstream/hpack_huffman.py, in the same steps and
order, with the same errors. Every other representation (longer indices or lengths, a block cut
short, size updates, index 0) goes through hpack's own methods, which keep every check and error
of theirs, as do the limits (`max_header_list_size`, `max_allowed_table_size`). Only `raw`
decoding, the one h2 asks for, takes this path. hpack's debug log of each decoded field is not
written for the ones decoded here.

One difference on purpose: a header list over `max_header_list_size` stops hpack's decoder at
the field that passes the limit, which leaves the dynamic table short of the peer encoder's
(every later block of the connection decodes wrong); here the block is decoded to its end, its
fields discarded, and only then is `OversizedHeaderListError` raised, as RFC 9113 §10.5.1 asks
("The field block MUST be processed to ensure a consistent connection state"). The engine's
HTTP/2 codec resets the one stream for it and the connection goes on
(reshape/upstream/http2.py); h2 closes the connection, as it did.

No maintained library offers a faster HPACK decoder that is safe for untrusted input
(reshape/upstream/hpack_table.py says why jh2 is not one); checked on the hpack releases in
reshape/upstream/h2.py (`HPACK_CHECKED_ON`).
"""

from __future__ import annotations

from collections import deque

from hpack import HeaderTuple, NeverIndexedHeaderTuple
from hpack.exceptions import HPACKDecodingError, OversizedHeaderListError
from hpack.hpack import Decoder
from hpack.table import HeaderTable

from reshape.upstream.hpack_huffman import decode_huffman

# The static table as the headers a block decodes to, by index (0 is no entry).
_STATIC: tuple[HeaderTuple | None, ...] = (
    None,
    *(tuple.__new__(HeaderTuple, entry) for entry in HeaderTable.STATIC_TABLE),
)
_STATIC_LENGTH = HeaderTable.STATIC_TABLE_LENGTH
_ENTRY_OVERHEAD = 32  # what a field counts for besides its name and value (RFC 7541 §4.1)
_STATIC_NAMES: tuple[bytes, ...] = (b"", *(name for name, _ in HeaderTable.STATIC_TABLE))


class HeadDecoder(Decoder):
    """hpack's `Decoder`, the same headers and errors from every block, with one-byte indexed
    fields decoded in the block's loop (see the module docstring)."""

    @classmethod
    def replacing(cls, decoder: Decoder) -> HeadDecoder:
        """A decoder in place of a fresh one (an h2 connection's, before it decodes anything),
        with its limits."""
        assert not decoder.header_table.dynamic_entries, "only a decoder that decoded nothing"
        fresh = cls()
        fresh.max_header_list_size = decoder.max_header_list_size
        fresh.max_allowed_table_size = decoder.max_allowed_table_size
        fresh.header_table_size = decoder.header_table_size
        return fresh

    def decode(self, data: bytes, raw: bool = False) -> list[HeaderTuple]:
        if not raw:
            return list(super().decode(data, raw))
        view = memoryview(data)
        headers: list[HeaderTuple] = []
        dynamic = self.header_table.dynamic_entries
        limit = self.max_header_list_size
        inflated = 0  # the size of the fields so far (RFC 7541 §4.1), kept or not
        at = 0
        end = len(data)
        while at < end:
            first = data[at]
            header: HeaderTuple | None
            if first & 0x80:
                index = first & 0x7F
                if 0 < index <= _STATIC_LENGTH:
                    header, consumed = _STATIC[index], 1
                elif _STATIC_LENGTH < index < 0x7F and index - _STATIC_LENGTH <= len(dynamic):
                    name, value = dynamic[index - _STATIC_LENGTH - 1]
                    header, consumed = tuple.__new__(HeaderTuple, (name, value)), 1
                else:  # index 0, beyond the table, or more than one byte: hpack's own way
                    header, consumed = self._decode_indexed(view[at:])
            elif first & 0x40:
                literal = self._literal(data, at, first & 0x3F, dynamic, indexing=True)
                if literal is None:
                    header, consumed = self._decode_literal_index(view[at:])
                else:
                    header, consumed = literal
            elif first & 0x20:
                if inflated:  # a field before it, kept or not
                    msg = "Table size update not at the start of the block"
                    raise HPACKDecodingError(msg)
                consumed = self._update_encoding_context(view[at:])
                header = None
            else:
                literal = self._literal(data, at, first & 0x0F, dynamic, indexing=False)
                if literal is None:
                    header, consumed = self._decode_literal_no_index(view[at:])
                else:
                    header, consumed = literal
            if header is not None:
                headers.append(header)
                # hpack's `table_entry_size`, written out: a call per field cost ~10% here.
                inflated += _ENTRY_OVERHEAD + len(header[0]) + len(header[1])
                if inflated > limit:
                    headers.clear()  # over the limit: discarded, the block decoded on
            at += consumed
        self._assert_valid_table_size()
        if inflated > limit:
            msg = f"A header list larger than {limit} has been received"
            raise OversizedHeaderListError(msg)
        for position, header in enumerate(headers):
            if type(header[0]) is not bytes or type(header[1]) is not bytes:
                # As hpack's `_unicode_if_needed` does for raw headers.
                headers[position] = header.__class__(bytes(header[0]), bytes(header[1]))
        return headers

    def _literal(
        self,
        data: bytes,
        at: int,
        name_index: int,
        dynamic: deque[tuple[bytes, bytes]],
        *,
        indexing: bool,
    ) -> tuple[HeaderTuple, int] | None:
        """The literal field at `at` and the bytes it takes, when its name index and both
        lengths fit their first byte and the block holds all of it; None for hpack's own way
        (which then explains what is wrong). The same steps, in the same order, as hpack's
        `_decode_literal`: the name, its Huffman code, the value, its Huffman code, the table."""
        prefix_full = 0x3F if indexing else 0x0F
        if name_index == prefix_full:
            return None
        position = at + 1
        if name_index:
            if name_index <= _STATIC_LENGTH:
                name = _STATIC_NAMES[name_index]
            elif name_index - _STATIC_LENGTH <= len(dynamic):
                name = dynamic[name_index - _STATIC_LENGTH - 1][0]
            else:
                return None
        else:
            string = _string_at(data, position)
            if string is None:
                return None
            name, position = string
        string = _string_at(data, position)
        if string is None:
            return None
        value, position = string
        kind = NeverIndexedHeaderTuple if not indexing and data[at] & 0x10 else HeaderTuple
        header = tuple.__new__(kind, (name, value))
        if indexing:
            self.header_table.add(name, value)
        return header, position - at


def _string_at(data: bytes, position: int) -> tuple[bytes, int] | None:
    """The string literal (RFC 7541 §5.2) at `position`, decoded, and where it ends; None when
    its length does not fit its first byte or the block ends inside it."""
    if position >= len(data):
        return None
    first = data[position]
    length = first & 0x7F
    end = position + 1 + length
    if length == 0x7F or end > len(data):
        return None
    string = data[position + 1 : end]
    return (decode_huffman(string) if first & 0x80 else string), end
