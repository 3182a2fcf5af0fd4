"""mitmproxy's own origin connections time out (reshape/mitm/patches/origin_first_byte_timeout.py),
sans-IO: mitmproxy's HttpLayer driven by hand (events in, commands out) pins the first-byte
timer's life — armed once the request has gone to the origin, disarmed by any answer, taken over
by the next request — for HTTP/1 and HTTP/2 on both sides. Behind real sockets:
tests/hardening/test_mitm_timeouts.py."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import h2.config
import h2.connection
import h2.errors
import h2.events
import pytest
from mitmproxy import connection, options
from mitmproxy.addons.proxyserver import Proxyserver
from mitmproxy.connection import ConnectionState
from mitmproxy.proxy import commands, events
from mitmproxy.proxy.context import Context
from mitmproxy.proxy.layers.http import HttpLayer, HTTPMode

from reshape.mitm.patches import Patches
from reshape.mitm.patches.origin_connect_timeout import OriginConnectTimeout
from reshape.mitm.patches.origin_first_byte_timeout import OriginFirstByteTimeout

CONNECT_TIMEOUT = 0.5
READ_TIMEOUT = 1.0
# For sans-IO cases that never wait for the timer: a wakeup always comes long before it is due.
LONG = 30.0


Timeouts = tuple[OriginConnectTimeout, OriginFirstByteTimeout]


@pytest.fixture
def timeouts() -> Iterator[Timeouts]:
    """The patches installed with short timeouts; mitmproxy's own behaviour again afterwards."""
    patches = (OriginConnectTimeout(CONNECT_TIMEOUT), OriginFirstByteTimeout(READ_TIMEOUT))
    with Patches(patches):
        yield patches


def use_timeouts(
    timeouts: Timeouts, read_timeout: float, exempt: tuple[tuple[str, int], ...] = ()
) -> None:
    """Change the installed first-byte timeout (it reads its settings on every request)."""
    timeouts[1].timeout = read_timeout
    timeouts[1].exempt = lambda server: server.address in exempt


# --- sans-IO: mitmproxy's HttpLayer, driven by hand ------------------------------------------


class DrivenLayer:
    """An HttpLayer for one client connection of mitmproxy's regular (forward proxy) mode. Hooks
    complete at once; connections open at once, speaking `origin_alpn` (None: HTTP/1.1)."""

    def __init__(self, client_alpn: bytes | None = None, origin_alpn: bytes | None = None) -> None:
        opts = options.Options()
        Proxyserver().load(opts)
        opts.http2_ping_keepalive = 0  # no HTTP/2 keep-alive timers among the first-byte ones
        self.client = connection.Client(
            peername=("127.0.0.1", 50000),
            sockname=("127.0.0.1", 8080),
            timestamp_start=time.time(),
            state=ConnectionState.OPEN,
            alpn=client_alpn,
        )
        self.origin_alpn = origin_alpn
        self.layer = HttpLayer(Context(self.client, opts), HTTPMode.regular)
        self.errors: list[str] = []
        # Sees each hook before it completes (an addon's part: set a hook's data).
        self.on_hook: Callable[[commands.StartHook], None] = lambda hook: None
        self.feed(events.Start())

    def feed(self, event: events.Event) -> list[commands.Command]:
        """Everything the layer does in answer to `event` (logs aside)."""
        out: list[commands.Command] = []
        queue = [event]
        while queue:
            for command in self.layer.handle_event(queue.pop(0)):
                if isinstance(command, commands.Log):
                    continue
                out.append(command)
                if isinstance(command, commands.StartHook):
                    if command.name == "error":
                        self.errors.append(command.args()[0].error.msg)
                    self.on_hook(command)
                    queue.append(events.HookCompleted(command))
                elif isinstance(command, commands.OpenConnection):
                    server = command.connection
                    server.state = ConnectionState.OPEN
                    server.peername = server.address
                    server.alpn = self.origin_alpn
                    queue.append(events.OpenConnectionCompleted(command, None))
        return out

    def from_client(self, data: bytes) -> list[commands.Command]:
        return self.feed(events.DataReceived(self.client, data))


def sent(out: list[commands.Command], to: connection.Connection) -> bytes:
    return b"".join(c.data for c in out if isinstance(c, commands.SendData) and c.connection is to)


def timers(out: list[commands.Command]) -> list[commands.RequestWakeup]:
    return [c for c in out if isinstance(c, commands.RequestWakeup)]


def server_of(out: list[commands.Command]) -> connection.Server:
    return next(c.connection for c in out if isinstance(c, commands.OpenConnection))


def closed(out: list[commands.Command], conn: connection.Connection) -> bool:
    return any(isinstance(c, commands.CloseConnection) and c.connection is conn for c in out)


class H2Peer:
    """The other end of an HTTP/2 connection, reading what mitmproxy sent."""

    def __init__(self, client_side: bool) -> None:
        config = h2.config.H2Configuration(client_side=client_side, header_encoding="utf-8")
        self.conn = h2.connection.H2Connection(config)
        self.conn.initiate_connection()

    def read(self, data: bytes) -> list[h2.events.Event]:
        return self.conn.receive_data(data)


GET = b"GET http://origin.test/slow HTTP/1.1\r\nHost: origin.test\r\n\r\n"
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


def h2_get(peer: H2Peer) -> bytes:
    stream_id = peer.conn.get_next_available_stream_id()
    headers = [
        (":method", "GET"),
        (":scheme", "http"),
        (":authority", "origin.test"),
        (":path", "/slow"),
    ]
    peer.conn.send_headers(stream_id, headers, end_stream=True)
    return peer.conn.data_to_send()


@pytest.mark.parametrize("client_alpn", [None, b"h2"], ids=["client-h1", "client-h2"])
@pytest.mark.parametrize("origin_alpn", [None, b"h2"], ids=["origin-h1", "origin-h2"])
def test_a_silent_origin_gets_its_request_cancelled_and_the_client_a_504(
    timeouts: Timeouts, client_alpn: bytes | None, origin_alpn: bytes | None
) -> None:
    use_timeouts(timeouts, read_timeout=0.05)
    driven = DrivenLayer(client_alpn, origin_alpn)
    client_peer = H2Peer(client_side=True) if client_alpn else None
    request_out = driven.from_client(h2_get(client_peer) if client_peer else GET)
    server = server_of(request_out)
    [timer] = timers(request_out)
    assert timer.delay == 0.05
    time.sleep(0.05)  # the timer is due

    out = driven.feed(events.Wakeup(timer))

    assert driven.errors == ["origin.test:80 sent no response within 0.05 s (read timeout)"]
    if origin_alpn:  # the stream is reset, the connection stays for other streams
        assert not closed(out, server)
        origin = H2Peer(client_side=False)
        seen = origin.read(sent(request_out, server) + sent(out, server))
        resets = [e for e in seen if isinstance(e, h2.events.StreamReset)]
        assert [r.error_code for r in resets] == [h2.errors.ErrorCodes.CANCEL]
    else:
        assert closed(out, server)
    to_client = sent(out, driven.client)
    if client_peer is None:
        assert to_client.startswith(b"HTTP/1.1 504 Gateway Time-out\r\n"), to_client
        assert b"sent no response within 0.05 s" in to_client
    else:
        answer = client_peer.read(to_client)
        [head] = [e for e in answer if isinstance(e, h2.events.ResponseReceived)]
        assert (":status", "504") in head.headers
        body = b"".join(e.data for e in answer if isinstance(e, h2.events.DataReceived))
        assert b"sent no response within 0.05 s" in body
        assert any(isinstance(e, h2.events.StreamEnded) for e in answer)
    assert not closed(out, driven.client)  # the client connection goes on


def test_an_answer_disarms_the_timer_and_the_next_request_takes_it_over(timeouts: Timeouts) -> None:
    use_timeouts(timeouts, read_timeout=LONG)
    driven = DrivenLayer()
    out = driven.from_client(GET)
    server = server_of(out)
    [timer] = timers(out)

    out = driven.feed(events.DataReceived(server, OK))
    assert sent(out, driven.client).endswith(b"\r\n\r\nok")
    assert timers(driven.from_client(GET)) == []  # no new timer: the pending one is reused
    out = driven.feed(events.DataReceived(server, OK))
    assert sent(out, driven.client).endswith(b"\r\n\r\nok")

    assert driven.feed(events.Wakeup(timer)) == []  # due with no request waiting: ignored
    assert len(timers(driven.from_client(GET))) == 1  # none pending any more: a new one
    assert driven.errors == []


def test_a_timer_taken_over_from_an_earlier_request_wakes_early_and_rearms(
    timeouts: Timeouts,
) -> None:
    use_timeouts(timeouts, read_timeout=LONG)
    driven = DrivenLayer()
    out = driven.from_client(GET)
    server = server_of(out)
    [timer] = timers(out)
    driven.feed(events.DataReceived(server, OK))
    assert timers(driven.from_client(GET)) == []  # the second request holds the first's timer

    out = driven.feed(events.Wakeup(timer))  # due before the second request's deadline

    [again] = timers(out)
    assert 0 < again.delay <= LONG
    assert sent(out, driven.client) == b"" and driven.errors == []
    out = driven.feed(events.DataReceived(server, OK))
    assert sent(out, driven.client).endswith(b"\r\n\r\nok")


def test_a_wakeup_after_a_websocket_upgrade_is_ignored(timeouts: Timeouts) -> None:
    use_timeouts(timeouts, read_timeout=LONG)
    driven = DrivenLayer()
    out = driven.from_client(
        b"GET http://origin.test/ws HTTP/1.1\r\nHost: origin.test\r\nConnection: Upgrade\r\n"
        b"Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    )
    server = server_of(out)
    [timer] = timers(out)
    out = driven.feed(
        events.DataReceived(
            server,
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n",
        )
    )
    assert sent(out, driven.client).startswith(b"HTTP/1.1 101")

    # Left with the stream, the wakeup would reach the WebSocket layer, which has no use for it.
    assert driven.feed(events.Wakeup(timer)) == []


def test_exempt_destinations_get_no_timer(timeouts: Timeouts) -> None:
    use_timeouts(timeouts, read_timeout=LONG, exempt=(("origin.test", 80),))
    driven = DrivenLayer()
    assert timers(driven.from_client(GET)) == []


def test_the_timer_starts_once_the_whole_request_went_out(timeouts: Timeouts) -> None:
    use_timeouts(timeouts, read_timeout=LONG)
    driven = DrivenLayer()
    driven.from_client(b"POST http://origin.test/ HTTP/1.1\r\nHost: origin.test\r\n")
    out = driven.from_client(b"Content-Length: 2\r\n\r\n")
    assert timers(out) == []  # the body has not gone out yet
    out = driven.from_client(b"hi")
    assert len(timers(out)) == 1  # armed once the whole request went to the origin
