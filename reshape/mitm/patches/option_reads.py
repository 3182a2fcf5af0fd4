"""mitmproxy's options read without deep-copying values that cannot change."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from mitmproxy import optmanager

from reshape.mitm.patches.base import Patch, Replacement

# Types whose deep copy is the object itself (`copy._deepcopy_atomic`).
_ATOMIC = frozenset({bool, int, float, str, bytes, type(None)})


class ReadOptionsWithoutCopies(Patch):
    """`_Option.current` (what every `options.name` read returns) without a deep copy of an
    atomic value.

    Why: in mitmproxy 12.2.3 every read of an option (`ctx.options.x`, a layer's
    `context.options.x`: `OptManager.__getattr__`) deep-copies the value, and an option left
    at its default twice (the `default` property copies, then `current` copies that). The HTTP
    layer reads `stream_large_bodies`, `body_size_limit` (`check_body_size`, for each request
    and response) and `validate_inbound_headers` on every request: 11 reads and 18 deep copies
    per request of the lab's app page through the pool, 1.4% of the proxy's CPU (cProfile,
    bench/RESULTS.md). No hook sees an option read. A deep copy of a bool, int, float, str,
    bytes or None returns the object itself, so for those the value is returned as it is, the
    same object as before; any other value (a list, a sequence of strings) is still copied, so a
    caller still cannot change an option through what it read.
    """

    def replacements(self) -> Iterable[Replacement]:
        unset = optmanager.unset

        def current(self: Any) -> Any:
            value = self._default if self.value is unset else self.value
            if type(value) in _ATOMIC:
                return value
            return copy.deepcopy(value)

        yield optmanager._Option, "current", current
