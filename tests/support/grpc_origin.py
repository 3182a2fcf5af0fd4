"""A gRPC origin (grpcio's own server, HTTP/2 over TLS) and a gRPC client that reaches it through
a proxy, for what a gRPC call needs of reshape: streams both ways at once and trailers.

No .proto: the methods take and return raw bytes (grpcio's generic handlers, no serializers).
Service `t.Echo`:

- `Bidi` (stream-stream): answers each message with `echo:<message>` as it comes;
- `Collect` (stream-unary): all the messages joined with `+`, once the client's stream ends;
- `Count` (unary-stream): `N` messages `0`, `1`, …, for a request `N`; each after the one before
  has been acknowledged by `ack()` (the client's side of the test), so a client sees the first
  before the origin sends the second;
- `Greet` (stream-stream): sends `hello` before it reads anything, then answers each message
  with `echo:<message>` (a subscription: the client waits for the server's word first);
- `Refuse` (stream-stream): reads one message, then ends the call NOT_FOUND ("no such thing")
  while the client may still be sending.

`received[method]` counts the messages each method has read, over all calls.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any, Self

import grpc

from labkit.pki import IssuedCert

SERVICE = "t.Echo"
WAIT = 10.0  # the longest any step of a call waits for its other side


class GrpcOrigin:
    """The server on `host` (a free port), with `cert` for TLS."""

    def __init__(self, host: str, cert: IssuedCert) -> None:
        self.host = host
        self.cert = cert
        self.received: collections.Counter[str] = collections.Counter()
        self._acks = threading.Semaphore(0)
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        handlers = {
            "Bidi": grpc.stream_stream_rpc_method_handler(self._bidi),
            "Collect": grpc.stream_unary_rpc_method_handler(self._collect),
            "Count": grpc.unary_stream_rpc_method_handler(self._count),
            "Greet": grpc.stream_stream_rpc_method_handler(self._greet),
            "Refuse": grpc.stream_stream_rpc_method_handler(self._refuse),
        }
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE, handlers),)
        )
        credentials = grpc.ssl_server_credentials(
            [(cert.key_path.read_bytes(), cert.cert_path.read_bytes())]
        )
        self.port = self._server.add_secure_port(f"{host}:0", credentials)

    def __enter__(self) -> Self:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop(grace=None)

    @property
    def target(self) -> str:
        return f"{self.host}:{self.port}"

    def ack(self) -> None:
        """The client has seen a message of `Count`: it may send the next."""
        self._acks.release()

    def _bidi(self, messages: Iterator[bytes], context: Any) -> Iterator[bytes]:
        return self._echo("Bidi", messages)

    def _greet(self, messages: Iterator[bytes], context: Any) -> Iterator[bytes]:
        yield b"hello"
        yield from self._echo("Greet", messages)

    def _echo(self, name: str, messages: Iterator[bytes]) -> Iterator[bytes]:
        for message in messages:
            self.received[name] += 1
            yield b"echo:" + message

    def _collect(self, messages: Iterator[bytes], context: Any) -> bytes:
        taken = []
        for message in messages:
            self.received["Collect"] += 1
            taken.append(message)
        return b"+".join(taken)

    def _count(self, request: bytes, context: Any) -> Iterator[bytes]:
        self.received["Count"] += 1
        for number in range(int(request)):
            if number and not self._acks.acquire(timeout=WAIT):
                return
            yield str(number).encode()

    def _refuse(self, messages: Iterator[bytes], context: Any) -> Iterator[bytes]:
        next(messages)
        self.received["Refuse"] += 1
        context.abort(grpc.StatusCode.NOT_FOUND, "no such thing")
        yield b""  # never reached: abort raises


def channel_through(proxy_url: str, proxy_ca: Path, target: str) -> grpc.Channel:
    """A channel to `target` through the proxy at `proxy_url` (CONNECT, then TLS with the
    proxy's certificate for the origin, which `proxy_ca` signed)."""
    credentials = grpc.ssl_channel_credentials(root_certificates=proxy_ca.read_bytes())
    options = [("grpc.enable_http_proxy", 1), ("grpc.http_proxy", proxy_url)]
    return grpc.secure_channel(target, credentials, options=options)


def method(name: str) -> str:
    return f"/{SERVICE}/{name}"
