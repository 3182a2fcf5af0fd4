"""A CONNECT tunnel's bytes to an HTTP/1.1 client skip Http1Server's send
(reshape/mitm/patches/tunnel_passthrough.py), sans-IO: mitmproxy's HttpLayer in regular mode,
driven by hand, a CONNECT and a raw TCP tunnel inside it. The patch must change nothing the layer
sends, only how: the same commands with and without it, and Http1Server's `send` no longer sees
the tunnel's data (unless the tunnel's response is chunked, which Http1Server must encode)."""

from __future__ import annotations

from typing import Any

import pytest
from mitmproxy import connection, http
from mitmproxy.proxy import commands, events
from mitmproxy.proxy.layers import TCPLayer
from mitmproxy.proxy.layers.http import _http1
from mitmproxy.proxy.layers.http._events import ResponseData

from reshape.mitm.patches import Patches
from reshape.mitm.patches.tunnel_passthrough import SendTunnelDataDirectly
from tests.unit.mitm.patches.test_origin_first_byte_timeout import DrivenLayer, server_of

CONNECT = b"CONNECT origin.test:443 HTTP/1.1\r\nHost: origin.test:443\r\n\r\n"


def tunnel(response: http.Response | None = None) -> list[tuple[str, str, bytes]]:
    """A CONNECT (whose response an `http_connect` hook may set first) and a raw TCP tunnel in
    it, data each way: what the layer sent, and to whom."""
    driven = DrivenLayer()

    def as_an_addon(hook: commands.StartHook) -> None:
        data = hook.args()[0]
        if hook.name == "http_connect" and response is not None:
            data.response = response
        elif hook.name == "next_layer":
            data.layer = TCPLayer(data.context)

    driven.on_hook = as_an_addon
    out = driven.from_client(CONNECT)
    out += driven.from_client(b"hello")
    server = server_of(out)  # opened at the CONNECT, or by the tunnel's layer once it has data
    out += driven.feed(events.DataReceived(server, b"world"))
    out += driven.feed(events.DataReceived(server, b"again"))
    return [described(c, driven.client) for c in out]


def described(command: commands.Command, client: connection.Client) -> tuple[str, str, bytes]:
    to = getattr(command, "connection", None)
    whom = "client" if to is client else "server" if to is not None else "-"
    data = command.data if isinstance(command, commands.SendData) else b""
    name = command.name if isinstance(command, commands.StartHook) else type(command).__name__
    return name, whom, data


@pytest.fixture
def sends(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every ResponseData event Http1Server's send is given."""
    seen: list[Any] = []
    original = _http1.Http1Server.send

    def send(self: _http1.Http1Server, event: Any) -> Any:
        if isinstance(event, ResponseData):
            seen.append(event)
        return original(self, event)

    monkeypatch.setattr(_http1.Http1Server, "send", send)
    return seen


def test_the_tunnel_sends_the_same_commands_without_http1server(sends: list[Any]) -> None:
    before = tunnel()
    assert len(sends) == 2  # mitmproxy's own way: each piece for the client went through it
    sends.clear()
    with Patches([SendTunnelDataDirectly()]):
        after = tunnel()
    assert after == before
    assert ("SendData", "client", b"world") in after
    assert ("SendData", "client", b"again") in after
    assert ("SendData", "server", b"hello") in after
    assert sends == []


def test_a_chunked_tunnel_response_still_goes_through_http1server(sends: list[Any]) -> None:
    def chunked() -> http.Response:
        return http.Response.make(200, b"", {"transfer-encoding": "chunked"})

    before = tunnel(chunked())
    mitmproxys = len(sends)
    assert mitmproxys > 0
    sends.clear()
    with Patches([SendTunnelDataDirectly()]):
        after = tunnel(chunked())
    assert after == before
    assert len(sends) == mitmproxys  # Http1Server frames the data as chunks


def test_the_patch_goes_away_again(sends: list[Any]) -> None:
    with Patches([SendTunnelDataDirectly()]):
        tunnel()
    assert sends == []
    tunnel()
    assert len(sends) == 2
