"""The engine floor: reshape's engine behind the thinnest front end, a yardstick for the lab.

Issue 17 asks how much of the pooled proxy's page load is mitmproxy (its layers, hooks, flows
and addons) and how much any front end in this process model would cost. This is a proxy with
nothing between the browser's HTTP/2 streams and `Engine.exchange` but what must be there:
CONNECT, TLS with a certificate minted per host by mitmproxy's `CertStore` from the proxy's own
CA, HTTP/2 to the client (the `h2` library, as mitmproxy's client side uses), and the routes of a
reshape policy file (`PoolRouting`, so its `upstream:` knobs are the pooled proxy's). The lab's
`engine-floor` configuration runs it with policies/pooled.yaml: what a front end of reshape's
own on this engine could reach at best, beside what `reshape-pooled` reaches.

It is a measuring instrument, not a proxy for users: HTTP/2 clients through CONNECT only (no
HTTP/1 clients, no plain-HTTP requests, no WebSocket, no trailers to or from the client); a
request's body is read whole before the request goes; no policy rules, addons, metrics,
early hints, record sizing or client authentication; origins' 1xx responses are dropped.
Hand-written because what it measures is exactly the absence of a framework around the engine.

usage: python -m bench.lab.engine_floor --listen 127.0.0.1:PORT --confdir DIR
           --upstream-ca FILE [--policy FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import ssl
import sys
from pathlib import Path

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import uvloop
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from mitmproxy import certs

from reshape.features.pool.addon import PoolRouting
from reshape.features.pool.routes import Destination
from reshape.policy.loader import PolicyFileError, load_policy_file
from reshape.policy.schema import Policy
from reshape.upstream.engine import DestinationRefused, Engine, QueueRejected
from reshape.upstream.trust import write_trust_bundle
from reshape.upstream.types import UpstreamError, UpstreamRequest, UpstreamResponse, end_to_end

REPO = Path(__file__).resolve().parents[2]
POOLED_POLICY = REPO / "policies" / "pooled.yaml"
CONNECT_HEAD_LIMIT = 16 * 1024
MAX_STREAMS = 100
READ_SIZE = 64 * 1024
# Response fields HTTP/2 forbids (RFC 9113 §8.2.2).
CONNECTION_SPECIFIC = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade"}
)

log = logging.getLogger("engine-floor")


class TlsContexts:
    """One server context per CONNECT host, its certificate from the proxy's CA."""

    def __init__(self, confdir: Path) -> None:
        self.store = certs.CertStore.from_store(confdir, "mitmproxy", 2048)
        self.directory = confdir / "engine-floor-certs"
        self.directory.mkdir(exist_ok=True)
        self._contexts: dict[str, ssl.SSLContext] = {}

    def for_host(self, host: str) -> ssl.SSLContext:
        context = self._contexts.get(host)
        if context is None:
            context = self._contexts[host] = self._context(host)
        return context

    def _context(self, host: str) -> ssl.SSLContext:
        name: x509.GeneralName
        try:
            name = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            name = x509.DNSName(host)
        entry = self.store.get_cert(host, [name])
        # The ssl module loads a certificate and key from files only.
        stem = self.directory / host.replace(":", "_")
        cert, key = stem.with_suffix(".crt"), stem.with_suffix(".key")
        cert.write_bytes(entry.cert.to_pem())
        key.write_bytes(
            entry.privatekey.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        context.set_alpn_protocols(["h2"])
        return context


class Floor:
    """The listener's shared state: the engine, the policy's routes, the TLS contexts."""

    def __init__(self, engine: Engine, policy: Policy, policy_name: str, tls: TlsContexts) -> None:
        self.engine = engine
        self.policy = policy
        self.policy_name = policy_name
        self.routing = PoolRouting()
        self.tls = tls

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            target = await self._connect_target(reader, writer)
            if target is None:
                return
            host, port = target
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.start_tls(self.tls.for_host(host))
            tls = writer.get_extra_info("ssl_object")
            if tls is None or tls.selected_alpn_protocol() != "h2":
                return  # an HTTP/1 client: not what this front end measures
            destination = Destination.of("https", host, port, tls.server_hostname)
            await ClientConnection(self, writer, destination).run(reader)
        except (OSError, ssl.SSLError, asyncio.IncompleteReadError) as e:
            log.debug("client connection ended: %s", e)
        finally:
            writer.close()

    async def _connect_target(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> tuple[str, int] | None:
        """The CONNECT's host and port; None (after answering the client) if it is not one."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            _refuse(writer, 431, "request head too large")
            return None
        parts = head.split(b"\r\n", 1)[0].split(b" ")
        if len(parts) != 3 or parts[0] != b"CONNECT":
            _refuse(writer, 405, "this front end takes CONNECT only")
            return None
        host, _, port = parts[1].decode("ascii", "replace").rpartition(":")
        host = host.removeprefix("[").removesuffix("]")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            _refuse(writer, 400, "CONNECT needs host:port")
            return None
        return host, int(port)


def _refuse(writer: asyncio.StreamWriter, status: int, message: str) -> None:
    body = (message + "\n").encode()
    writer.write(
        f"HTTP/1.1 {status} {message}\r\ncontent-type: text/plain\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
        + body
    )


class ClientConnection:
    """One browser connection's HTTP/2 streams, each an exchange through the engine."""

    def __init__(
        self, floor: Floor, writer: asyncio.StreamWriter, destination: Destination
    ) -> None:
        self.floor = floor
        self.writer = writer
        self.route = floor.routing.route_to(destination, floor.policy, floor.policy_name, "")
        self.h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding=None)
        )
        self.requests: dict[int, tuple[list[tuple[bytes, bytes]], list[bytes]]] = {}
        self.exchanges: dict[int, asyncio.Task[None]] = {}
        self.window_opened = asyncio.Event()
        self._flush_due = False

    async def run(self, reader: asyncio.StreamReader) -> None:
        self.h2.initiate_connection()
        self.h2.update_settings({h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: MAX_STREAMS})
        self.flush()
        try:
            while data := await reader.read(READ_SIZE):
                try:
                    events = self.h2.receive_data(data)
                except h2.exceptions.ProtocolError as e:
                    log.info("client protocol error: %s", e)
                    self.flush()  # the GOAWAY h2 queued
                    return
                for event in events:
                    self.on_event(event)
                self.flush()
        finally:
            for task in self.exchanges.values():
                task.cancel()

    def flush(self) -> None:
        """Everything h2 has to send, in one write."""
        self._flush_due = False
        data = self.h2.data_to_send()
        if data and not self.writer.is_closing():
            self.writer.write(data)

    def flush_soon(self) -> None:
        """Flush at the end of this turn of the event loop: the exchanges that finish in one
        turn share one write."""
        if not self._flush_due:
            self._flush_due = True
            asyncio.get_running_loop().call_soon(self.flush)

    def on_event(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RequestReceived):
            assert event.stream_id is not None and event.headers is not None
            self.requests[event.stream_id] = (list(event.headers), [])
            if event.stream_ended is not None:
                self.start(event.stream_id)
        elif isinstance(event, h2.events.DataReceived):
            assert event.stream_id is not None and event.data is not None
            self.h2.acknowledge_received_data(event.flow_controlled_length or 0, event.stream_id)
            if event.stream_id in self.requests:
                self.requests[event.stream_id][1].append(event.data)
            if event.stream_ended is not None:
                self.start(event.stream_id)
        elif isinstance(event, h2.events.StreamReset):
            assert event.stream_id is not None
            self.requests.pop(event.stream_id, None)
            task = self.exchanges.pop(event.stream_id, None)
            if task is not None:
                task.cancel()
        elif isinstance(event, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged):
            self.window_opened.set()

    def start(self, stream_id: int) -> None:
        taken = self.requests.pop(stream_id, None)
        if taken is None:
            return
        head, body = taken
        pseudo = {name: value for name, value in head if name.startswith(b":")}
        fields = [(name, value) for name, value in head if not name.startswith(b":")]
        request = UpstreamRequest(
            method=pseudo.get(b":method", b"GET"),
            scheme=b"https",
            authority=pseudo.get(b":authority", self.route.key.host.encode()),
            target=pseudo.get(b":path", b"/"),
            headers=end_to_end(fields),
            body=b"".join(body),
        )
        task = asyncio.get_running_loop().create_task(self.exchange(stream_id, request))
        self.exchanges[stream_id] = task

    async def exchange(self, stream_id: int, request: UpstreamRequest) -> None:
        response: UpstreamResponse | None = None
        finished = False
        try:
            try:
                response = await self.floor.engine.exchange(self.route, request)
            except UpstreamError as e:
                status = (
                    503
                    if isinstance(e, QueueRejected)
                    else 403
                    if isinstance(e, DestinationRefused)
                    else 502
                )
                self.answer_error(stream_id, status, str(e))
                finished = True
                return
            head = [(b":status", str(response.status).encode())]
            head += [
                (name.lower(), value)
                for name, value in response.headers
                if name.lower() not in CONNECTION_SPECIFIC
            ]
            self.h2.send_headers(stream_id, head)
            self.flush_soon()
            while True:
                chunk = response.read_nowait()
                if chunk is None:
                    chunk = await response.read()
                if not chunk:
                    break
                await self.send(stream_id, chunk)
            self.h2.end_stream(stream_id)
            self.flush_soon()
            finished = True
        except UpstreamError as e:  # the body broke off
            log.info("stream %d: %s", stream_id, e)
            self.reset(stream_id)
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
            pass  # the client reset or closed it meanwhile
        finally:
            if response is not None and not finished:
                response.abort()
            self.exchanges.pop(stream_id, None)

    def answer_error(self, stream_id: int, status: int, message: str) -> None:
        body = (message + "\n").encode()
        self.h2.send_headers(
            stream_id,
            [
                (b":status", str(status).encode()),
                (b"content-type", b"text/plain"),
                (b"content-length", str(len(body)).encode()),
            ],
        )
        self.h2.send_data(stream_id, body, end_stream=True)
        self.flush_soon()

    def reset(self, stream_id: int) -> None:
        try:
            self.h2.reset_stream(stream_id, h2.errors.ErrorCodes.INTERNAL_ERROR)
        except h2.exceptions.StreamClosedError:
            return
        self.flush_soon()

    async def send(self, stream_id: int, data: bytes) -> None:
        """`data` on the stream as the client's flow control windows allow."""
        view = memoryview(data)
        while view:
            room = min(
                self.h2.local_flow_control_window(stream_id), self.h2.max_outbound_frame_size
            )
            if room <= 0:
                self.window_opened.clear()
                self.flush()
                await self.window_opened.wait()
                continue
            self.h2.send_data(stream_id, bytes(view[:room]))
            view = view[room:]
            self.flush_soon()


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.lab.engine_floor",
        description="reshape's engine behind a minimal CONNECT + TLS + HTTP/2 front end",
    )
    parser.add_argument("--listen", required=True, metavar="HOST:PORT")
    parser.add_argument("--confdir", required=True, type=Path, help="where the proxy's CA is")
    parser.add_argument("--upstream-ca", type=Path, help="a CA to trust for origins, too")
    parser.add_argument("--policy", type=Path, default=POOLED_POLICY)
    args = parser.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit():
        parser.error(f"--listen: expected HOST:PORT, not {args.listen!r}")
    args.host, args.port = host, int(port)
    return args


async def serve(args: argparse.Namespace) -> None:
    policies = load_policy_file(args.policy)
    engine = Engine(write_trust_bundle(args.confdir, args.upstream_ca))
    engine.start()
    floor = Floor(
        engine, policies.policies[policies.default], policies.default, TlsContexts(args.confdir)
    )
    server = await asyncio.start_server(
        floor.serve, args.host, args.port, limit=CONNECT_HEAD_LIMIT, backlog=1024
    )
    print(f"engine floor: listening on {args.host}:{args.port}", flush=True)
    try:
        async with server:
            await server.serve_forever()
    finally:
        await engine.stop()


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    try:
        uvloop.run(serve(args))
    except PolicyFileError as e:
        print(f"engine floor: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"engine floor: cannot listen on {args.listen}: {e.strerror or e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
