"""The HPACK dynamic table of the engine's encoders, searched through a dictionary.

hpack 4.2's `HeaderTable.search` (which `Encoder.add` calls for every field of every header
block) walks the dynamic table entry by entry. An origin connection's table fills with a
browser's request fields and the paths of its last few dozen requests, so each request's 15-20
fields meant several hundred comparisons in Python: 4.4% of the pool's CPU in a profile of
bursts of browser-like requests (py-spy; hpack's own search was the largest single function). No
library offers HPACK encoding that is both maintained and safe (jh2's Rust codec panics on some
input, bench/RESULTS.md), so this keeps hpack and gives its table an index: for each field name,
the newest entry of each value, and the newest entry of the name, by the number of additions
before it. An entry's place in the table follows from that number; evictions (always the oldest
entry) drop what they made stale. Searches answer as hpack's do: a static match first, then the
newest dynamic entry.
"""

from __future__ import annotations

from hpack.table import HeaderTable, table_entry_size


class IndexedHeaderTable(HeaderTable):
    """hpack's `HeaderTable` with `search` through dictionaries instead of a walk."""

    def __init__(self) -> None:
        super().__init__()
        self._added = 0  # entries ever added; entry n (0-based) is at newest-first place _added-1-n
        self._newest_value: dict[bytes, dict[bytes, int]] = {}  # name → value → entry number
        self._newest_name: dict[bytes, int] = {}  # name → entry number

    @property
    def additions(self) -> int:
        """How many entries were ever added: a change in it moves every entry's index."""
        return self._added

    def add(self, name: bytes, value: bytes) -> None:
        if table_entry_size(name, value) > self._maxsize:
            super().add(name, value)  # clears the table
            self._forget_all()
            return
        number = self._added
        self._added += 1
        self._newest_value.setdefault(name, {})[value] = number
        self._newest_name[name] = number
        super().add(name, value)  # appends, then `_shrink` evicts the oldest as needed

    def search(self, name: bytes, value: bytes) -> tuple[int, bytes, bytes | None] | None:
        partial = None
        static = HeaderTable.STATIC_TABLE_MAPPING.get(name)
        if static:
            index = static[1].get(value)
            if index is not None:
                return index, name, value
            partial = (static[0], name, None)
        offset = HeaderTable.STATIC_TABLE_LENGTH + 1
        values = self._newest_value.get(name)
        if values is not None:
            number = values.get(value)
            if number is not None:
                return self._added - 1 - number + offset, name, value
            if partial is None:
                return self._added - 1 - self._newest_name[name] + offset, name, None
        return partial

    def _shrink(self) -> None:
        cursize = self._current_size
        entries = self.dynamic_entries
        while cursize > self._maxsize:
            name, value = entries.pop()
            cursize -= table_entry_size(name, value)
            # The evicted entry's number: the oldest left has number _added - len(entries).
            self._evicted(name, value, self._added - len(entries) - 1)
        self._current_size = cursize

    @HeaderTable.maxsize.setter  # type: ignore[attr-defined]
    def maxsize(self, newmax: int) -> None:
        HeaderTable.maxsize.fset(self, newmax)  # type: ignore[attr-defined]
        if not self.dynamic_entries:
            self._forget_all()

    def _evicted(self, name: bytes, value: bytes, number: int) -> None:
        values = self._newest_value[name]
        if values.get(value) == number:
            del values[value]
            if not values:
                del self._newest_value[name]
        if self._newest_name.get(name) == number:
            del self._newest_name[name]

    def _forget_all(self) -> None:
        self._newest_value.clear()
        self._newest_name.clear()
