"""SO_REUSEPORT on the proxy's listener, for `--workers N`.

mitmproxy 12.2.3 binds in `RegularInstance.listen` (proxy/mode_servers.py) with a bare
`asyncio.start_server(handler, host, port)` and offers no option or hook for socket flags. Only
the TCP listener of the regular (forward proxy) mode is changed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from mitmproxy.proxy import mode_servers

from reshape.mitm.patches.base import Patch, Replacement


class ListenWithReusePort(Patch):
    """Bind the regular proxy listener with SO_REUSEPORT.

    Why: `reshape run --workers N` runs N processes on one port and lets the kernel spread
    connections among them.
    """

    def replacements(self) -> Iterable[Replacement]:
        original = mode_servers.RegularInstance.listen

        async def listen(self: mode_servers.RegularInstance, host: str, port: int) -> list[Any]:
            if self.mode.transport_protocol != "tcp":
                return await original(self, host, port)
            return [await asyncio.start_server(self.handle_stream, host, port, reuse_port=True)]

        yield mode_servers.RegularInstance, "listen", listen
