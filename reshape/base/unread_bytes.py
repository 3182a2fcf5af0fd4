"""What a peer sent before its connection broke, that nobody read.

asyncio and uvloop close a transport whose write failed (the peer reset the connection) without
reading on, though Linux keeps what arrived before the reset readable: an origin that answers
pipelined requests and then resets the connection as the next ones arrive has its answers
there. A protocol's `connection_lost` may still read them: the socket closes only after it
returns. No library exposes this; it is a duplicate of the socket, read without blocking.
"""

from __future__ import annotations

import asyncio

READ_SIZE = 256 * 1024


def unread_bytes(transport: asyncio.BaseTransport | None, limit: int) -> list[bytes]:
    """The bytes still in the kernel's receive buffer of `transport`'s socket, in pieces, up
    to about `limit` of them; none if it has none or no socket."""
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None:
        return []
    try:
        dup = sock.dup()
    except OSError:
        return []
    pieces: list[bytes] = []
    read = 0
    with dup:
        dup.setblocking(False)
        while read < limit:
            try:
                data = dup.recv(READ_SIZE)
            except OSError:  # nothing more for now, or the reset itself
                break
            if not data:
                break
            pieces.append(data)
            read += len(data)
    return pieces
