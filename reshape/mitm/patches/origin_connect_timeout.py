"""A connect timeout on mitmproxy's own origin connections."""

from __future__ import annotations

import asyncio
import types
from collections.abc import Iterable
from typing import Any

from mitmproxy.proxy import server
from mitmproxy.utils import human

from reshape.mitm.patches.base import Patch, Replacement


class OriginConnectTimeout(Patch):
    """Give up connecting to an origin after `timeout` seconds: the client gets 502.

    Why: mitmproxy 12.2.3 opens origin connections with a bare `asyncio.open_connection`
    (`ConnectionHandler.open_connection`, proxy/server.py), so a connect that nobody answers lasts
    as long as the kernel's SYN retries (about two minutes), and no hook runs meanwhile. The patch
    gives proxy/server.py an `asyncio` whose `open_connection` raises `TimeoutError` (an OSError,
    which mitmproxy handles as any failed connect) after `timeout` (TCP only: a TLS handshake
    that stalls is not timed). The engine's own connections have their own timeout
    (`upstream: connect_timeout`).
    """

    def __init__(self, timeout: float) -> None:
        super().__init__()
        self.timeout = timeout

    def replacements(self) -> Iterable[Replacement]:
        patch = self

        async def open_connection(
            host: str, port: int, **kwargs: Any
        ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
            deadline = asyncio.timeout(patch.timeout)
            try:
                async with deadline:
                    return await asyncio.open_connection(host, port, **kwargs)
            except TimeoutError:
                if not deadline.expired():
                    raise  # the kernel's own ETIMEDOUT
                raise TimeoutError(
                    f"no connection to {human.format_address((host, port))} within "
                    f"{patch.timeout:g} s (connect timeout)"
                ) from None

        class AsyncioWithConnectTimeout(types.ModuleType):
            """asyncio as proxy/server.py sees it: the module itself, but for open_connection."""

            def __getattr__(self, name: str) -> Any:
                return getattr(asyncio, name)

        shim = AsyncioWithConnectTimeout("asyncio")
        shim.open_connection = open_connection  # type: ignore[attr-defined]
        yield server, "asyncio", shim
