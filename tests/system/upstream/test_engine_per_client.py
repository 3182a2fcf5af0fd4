"""Without `upstream:` each user (client address) gets a browser's own limit, 6 connections per
origin, and all users share the idle ones; the cap is not everyone's together."""

from __future__ import annotations

import asyncio

from tests.support.reshape_process import StartProxy
from tests.support.scripted_origins import SlowOrigin

PER_BROWSER = 8  # requests each browser sends at once: more than its 6 connections


class CountingSlowOrigin(SlowOrigin):
    """A SlowOrigin that counts the connections it serves at once."""

    def __init__(self, host: str, delay: float) -> None:
        super().__init__(host, delay)
        self.open = 0
        self.most = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open += 1
        self.most = max(self.most, self.open)
        try:
            await super().handle(reader, writer)
        finally:
            self.open -= 1


def load(proxy: str, origin: str, addresses: list[str]) -> list[bytes]:
    """One browser per entry of `addresses` (its source address), PER_BROWSER requests each,
    each on a connection of its own (HTTP clients here cannot bind a proxied request's source
    address, so these are raw). Returns each response's status line."""
    host, port = proxy.split(":")
    request = f"GET http://{origin}/ HTTP/1.1\r\nHost: {origin}\r\n\r\n".encode()

    async def fetch(address: str) -> bytes:
        reader, writer = await asyncio.open_connection(host, int(port), local_addr=(address, 0))
        writer.write(request)
        status = await asyncio.wait_for(reader.readline(), 30)
        writer.close()
        return status.strip()

    async def all_browsers() -> list[bytes]:
        return await asyncio.gather(
            *(fetch(address) for address in addresses for _ in range(PER_BROWSER))
        )

    return asyncio.run(all_browsers())


def test_each_client_address_gets_a_browsers_six_connections(start_reshape: StartProxy) -> None:
    proxy = start_reshape()  # the packaged policy: no `upstream:`
    with CountingSlowOrigin("127.0.0.9", delay=0.5) as origin:
        target = f"{origin.host}:{origin.port}"
        ok = [b"HTTP/1.1 200 OK"] * 2 * PER_BROWSER
        # Two users: six connections each, at once.
        assert load(proxy.listen, target, ["127.0.0.21", "127.0.0.22"]) == ok
        assert origin.most == 12
        # Two browsers at one address are one user: six.
        origin.most = 0
        assert load(proxy.listen, target, ["127.0.0.23", "127.0.0.23"]) == ok
        assert origin.most == 6


def test_a_newcomer_is_not_queued_behind_another_users_backlog(start_reshape: StartProxy) -> None:
    proxy = start_reshape()
    host, port = proxy.listen.split(":")
    with SlowOrigin("127.0.0.9", delay=0.5) as origin:
        target = f"{origin.host}:{origin.port}"
        request = f"GET http://{target}/ HTTP/1.1\r\nHost: {target}\r\n\r\n".encode()
        answered: list[str] = []

        async def fetch(address: str, after: float) -> None:
            await asyncio.sleep(after)
            reader, writer = await asyncio.open_connection(host, int(port), local_addr=(address, 0))
            writer.write(request)
            status = await asyncio.wait_for(reader.readline(), 30)
            writer.close()
            assert status.startswith(b"HTTP/1.1 200")
            answered.append(address)

        async def both() -> None:
            # User a: 24 requests at once (four rounds on its six connections); user b, a
            # moment later, one request, which brings six connections of its own.
            await asyncio.gather(
                *(fetch("127.0.0.24", 0.0) for _ in range(24)), fetch("127.0.0.25", 0.1)
            )

        asyncio.run(both())
        # In queue order b's request would wait for all of a's (the last answered); it takes
        # one of the connections it brought.
        assert answered.index("127.0.0.25") < 12, answered
