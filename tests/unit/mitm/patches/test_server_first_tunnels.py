"""A CONNECT tunnel to a service that speaks first gets its greeting
(reshape/mitm/patches/server_first_tunnels.py), sans-IO: mitmproxy's HttpLayer in regular mode
with the lazy connection strategy reshape runs, driven by hand. The `next_layer` hook is
answered as mitmproxy's NextLayer addon answers it: raw TCP once the server has spoken first."""

from __future__ import annotations

from typing import Any

import pytest
from mitmproxy import connection
from mitmproxy.proxy import commands, events
from mitmproxy.proxy.layers import TCPLayer

from reshape.mitm.patches import Patches
from reshape.mitm.patches.server_first_tunnels import OpenSilentTunnels
from tests.unit.mitm.patches.test_origin_first_byte_timeout import (
    DrivenLayer,
    closed,
    sent,
    server_of,
    timers,
)

GREETING = b"220 mail.test ESMTP\r\n"


def connect(port: int) -> bytes:
    return f"CONNECT mail.test:{port} HTTP/1.1\r\nHost: mail.test:{port}\r\n\r\n".encode()


def driven(strategy: str = "lazy") -> DrivenLayer:
    layer = DrivenLayer()
    layer.layer.context.options.connection_strategy = strategy

    def as_mitmproxys_next_layer(hook: commands.StartHook) -> None:
        data = hook.args()[0]
        if hook.name == "next_layer" and (data.data_server() or data.data_client()):
            data.layer = TCPLayer(data.context)

    layer.on_hook = as_mitmproxys_next_layer
    return layer


def opened(out: list[commands.Command]) -> list[commands.OpenConnection]:
    return [c for c in out if isinstance(c, commands.OpenConnection)]


def wake(layer: DrivenLayer, out: list[commands.Command]) -> list[commands.Command]:
    (timer,) = timers(out)
    return layer.feed(events.Wakeup(timer))


HEADER_TIMEOUT = 30.0


@pytest.fixture
def reported() -> Any:
    """The client errors the patch reported, while it is installed."""
    kinds: list[str] = []
    patch = OpenSilentTunnels(kinds.append, header_timeout=HEADER_TIMEOUT, silence=1.5)
    with Patches([patch]):
        yield kinds


@pytest.fixture
def patched(reported: list[str]) -> Any:
    return reported


@pytest.mark.usefixtures("patched")
def test_a_silent_client_gets_the_greeting_after_the_wait() -> None:
    layer = driven()
    out = layer.from_client(connect(2525))
    assert sent(out, layer.client).startswith(b"HTTP/1.1 200")  # at once, as lazily
    assert opened(out) == []
    assert [t.delay for t in timers(out)] == [1.5]
    out = wake(layer, out)
    server = server_of(out)
    assert server.address == ("mail.test", 2525)
    out = layer.feed(events.DataReceived(server, GREETING))
    assert sent(out, layer.client) == GREETING
    out = layer.from_client(b"EHLO client.test\r\n")
    assert sent(out, server) == b"EHLO client.test\r\n"


def test_a_tunnel_whose_origin_says_nothing_either_ends_at_the_header_timeout(
    reported: list[str],
) -> None:
    layer = driven()
    out = wake(layer, layer.from_client(connect(2525)))
    server = server_of(out)
    assert [t.delay for t in timers(out)] == [HEADER_TIMEOUT - 1.5]
    out = wake(layer, out)
    assert closed(out, server) and closed(out, layer.client)
    assert reported == ["silent_connection"]


def test_a_silent_tunnel_to_a_web_port_gets_no_origin_connection(reported: list[str]) -> None:
    layer = driven()
    out = layer.from_client(connect(443))
    assert [t.delay for t in timers(out)] == [HEADER_TIMEOUT]
    out = wake(layer, out)
    assert opened(out) == []
    assert closed(out, layer.client)
    assert reported == ["silent_connection"]


def test_a_client_that_leaves_before_the_wakeup_gets_no_origin_connection(
    reported: list[str],
) -> None:
    layer = driven()
    first = layer.from_client(connect(2525))
    layer.feed(events.ConnectionClosed(layer.client))
    assert wake(layer, first) == []
    assert reported == []


@pytest.mark.usefixtures("patched")
def test_a_client_that_speaks_first_is_left_as_it_was() -> None:
    layer = driven()
    first = layer.from_client(connect(443))
    out = layer.from_client(b"hello")  # decides the tunnel's layer, which connects
    server = server_of(out)
    assert sent(out, server) == b"hello"
    out = wake(layer, first)
    assert out == []  # nothing more opened: the wakeup went to a sink
    out = layer.feed(events.DataReceived(server, b"world"))
    assert sent(out, layer.client) == b"world"
    assert sent(layer.from_client(b"again"), server) == b"again"


@pytest.mark.usefixtures("patched")
def test_a_failed_connect_at_the_wakeup_closes_the_tunnel() -> None:
    layer = driven()
    out = layer.from_client(connect(2525))
    (timer,) = timers(out)
    # Drive by hand: the connect fails.
    replies = list(layer.layer.handle_event(events.Wakeup(timer)))
    (open_,) = opened(replies)
    refused = events.OpenConnectionCompleted(open_, "Connection refused")
    out = list(layer.layer.handle_event(refused))
    assert closed(out, layer.client)


@pytest.mark.usefixtures("patched")
def test_a_server_first_port_is_connected_before_the_answer() -> None:
    layer = driven()
    out = layer.from_client(connect(25))
    (open_,) = opened(out)
    kinds = [type(c).__name__ for c in out if not isinstance(c, commands.StartHook)]
    assert kinds.index("OpenConnection") < kinds.index("SendData")  # connected, then the 200
    assert sent(out, layer.client).startswith(b"HTTP/1.1 200")
    assert [t.delay for t in timers(out)] == [HEADER_TIMEOUT]  # only to end a silent one
    first = out
    out = layer.feed(events.DataReceived(open_.connection, GREETING))
    assert sent(out, layer.client) == GREETING
    assert wake(layer, first) == []


@pytest.mark.usefixtures("patched")
def test_a_server_first_port_that_refuses_gets_502() -> None:
    layer = driven()
    out = list(layer.layer.handle_event(events.DataReceived(layer.client, connect(25))))
    while not opened(out):  # the http_connect hook first
        (hook,) = [c for c in out if isinstance(c, commands.StartHook)]
        out = list(layer.layer.handle_event(events.HookCompleted(hook)))
    (open_,) = opened(out)
    out = layer.feed(events.OpenConnectionCompleted(open_, "Connection refused"))
    answer = sent(out, layer.client)
    assert answer.startswith(b"HTTP/1.1 502")
    assert b"Cannot connect to mail.test:25: Connection refused" in answer
    assert b"connection_strategy" not in answer  # mitmproxy's advice, not for reshape's users


def described(out: list[commands.Command], client: connection.Client) -> list[tuple[str, bool]]:
    return [(type(c).__name__, getattr(c, "connection", None) is client) for c in out]


def test_the_eager_strategy_is_mitmproxys_own() -> None:
    unpatched = driven("eager")
    before = unpatched.from_client(connect(2525))
    with Patches([OpenSilentTunnels(print, header_timeout=HEADER_TIMEOUT)]):
        layer = driven("eager")
        after = layer.from_client(connect(2525))
    assert described(after, layer.client) == described(before, unpatched.client)
    assert timers(after) == []


def test_the_patch_goes_away_again() -> None:
    with Patches([OpenSilentTunnels(print, header_timeout=HEADER_TIMEOUT)]):
        pass
    out = driven().from_client(connect(2525))
    assert timers(out) == [] and opened(out) == []
