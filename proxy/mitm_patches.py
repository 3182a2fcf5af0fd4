"""The one place where reshape changes mitmproxy's internals (mitmproxy 12.2.3).

Each patch says why hooks are not enough. Re-check every one when the mitmproxy pin moves.
"""

from __future__ import annotations

import asyncio
from typing import Any

from mitmproxy.proxy import mode_servers

_reuse_port_installed = False


def listen_with_reuse_port() -> None:
    """Make the regular proxy listener bind with SO_REUSEPORT.

    Why: `reshape run --workers N` runs N processes on one port and lets the kernel spread
    connections among them. mitmproxy 12.2.3 binds in `AsyncioServerInstance.listen` with a bare
    `asyncio.start_server(handler, host, port)` and offers no option or hook for socket flags.
    Only the TCP listener of the regular (forward proxy) mode is changed.
    """
    global _reuse_port_installed
    if _reuse_port_installed:
        return
    original = mode_servers.RegularInstance.listen

    async def listen(self: mode_servers.RegularInstance, host: str, port: int) -> list[Any]:
        if self.mode.transport_protocol != "tcp":
            return await original(self, host, port)
        return [await asyncio.start_server(self.handle_stream, host, port, reuse_port=True)]

    mode_servers.RegularInstance.listen = listen  # type: ignore[method-assign,assignment]
    _reuse_port_installed = True
