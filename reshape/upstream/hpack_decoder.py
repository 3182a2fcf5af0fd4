"""The HPACK decoder of the proxy's HTTP/2 connections, both ends: hpack's, with a field the
block names by a one-byte index decoded in the block's loop.

Most fields of a browser's request heads, and many of an origin's response heads, arrive as an
index into the static or the dynamic table (RFC 7541 §6.1), one byte for the first 126 entries.
hpack 4.2's `Decoder` works each one out in Python through a chain of calls (the integer decoding,
the table lookup, a debug log call, a `HeaderTuple` built by a Python `__new__`, and each header
built again at the end by `_unicode_if_needed`): in py-spy's profile of the lab's app page loads
through the pool, decoding header blocks was ~6.5% of the proxy's CPU. Here the block's loop
decodes such a field itself (static entries from tuples made once) and returns the headers it
built; every other representation (literals, longer indices, size updates, index 0) goes through
hpack's own methods, which keep every check and error of theirs, as do the limits
(`max_header_list_size`, `max_allowed_table_size`). Only `raw` decoding, the one h2 asks for, takes
this path. hpack's debug log of each decoded field is not written for the indexed ones.

No maintained library offers a faster HPACK decoder that is safe for untrusted input
(reshape/upstream/hpack_table.py says why jh2 is not one); checked on the hpack releases in
reshape/upstream/h2.py (`HPACK_CHECKED_ON`).
"""

from __future__ import annotations

from hpack import HeaderTuple
from hpack.exceptions import HPACKDecodingError, OversizedHeaderListError
from hpack.hpack import Decoder
from hpack.table import HeaderTable, table_entry_size

# The static table as the headers a block decodes to, by index (0 is no entry).
_STATIC: tuple[HeaderTuple | None, ...] = (
    None,
    *(tuple.__new__(HeaderTuple, entry) for entry in HeaderTable.STATIC_TABLE),
)
_STATIC_LENGTH = HeaderTable.STATIC_TABLE_LENGTH


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
        inflated = 0
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
                header, consumed = self._decode_literal_index(view[at:])
            elif first & 0x20:
                if headers:
                    msg = "Table size update not at the start of the block"
                    raise HPACKDecodingError(msg)
                consumed = self._update_encoding_context(view[at:])
                header = None
            else:
                header, consumed = self._decode_literal_no_index(view[at:])
            if header is not None:
                headers.append(header)
                inflated += table_entry_size(header[0], header[1])
                if inflated > limit:
                    msg = f"A header list larger than {limit} has been received"
                    raise OversizedHeaderListError(msg)
            at += consumed
        self._assert_valid_table_size()
        for position, header in enumerate(headers):
            if type(header[0]) is not bytes or type(header[1]) is not bytes:
                # As hpack's `_unicode_if_needed` does for raw headers.
                headers[position] = header.__class__(bytes(header[0]), bytes(header[1]))
        return headers
