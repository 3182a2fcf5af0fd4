"""A long accept queue on the proxy's listening sockets.

mitmproxy 12.2.3 binds in `RegularInstance.listen` (proxy/mode_servers.py) with a bare
`asyncio.start_server(handler, host, port)`, whose backlog is 100, and has no option for it.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable
from typing import Any

from mitmproxy.proxy import mode_servers

from reshape.mitm.patches.base import Patch, Replacement


class ListenBacklog(Patch):
    """Give the proxy's listening sockets an accept queue of `backlog` connections.

    Why: `asyncio.start_server`'s backlog is 100. When hundreds of clients connect at once
    (bench/soak: 1,000 connections opening together) and the proxy is busy, the kernel's accept
    queue overflows; a connection the kernel could not queue is reset later, after the client
    already sent its CONNECT ("connection reset by peer"). Calling listen() again on a listening
    socket changes its backlog (the kernel caps it at net.core.somaxconn), so the sockets
    mitmproxy created are updated after the fact. Applies to every listener of the regular mode,
    SO_REUSEPORT ones included.
    """

    def __init__(self, backlog: int) -> None:
        super().__init__()
        self.backlog = backlog

    def replacements(self) -> Iterable[Replacement]:
        original = mode_servers.RegularInstance.listen
        backlog = self.backlog

        async def listen(self: mode_servers.RegularInstance, host: str, port: int) -> list[Any]:
            servers = await original(self, host, port)
            for server in servers:
                for listening in getattr(server, "sockets", ()):
                    if listening.type != socket.SOCK_STREAM:
                        continue
                    with socket.socket(fileno=os.dup(listening.fileno())) as same:
                        same.listen(backlog)
            return servers

        yield mode_servers.RegularInstance, "listen", listen
