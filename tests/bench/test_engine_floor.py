"""bench/lab/engine_floor.py, the lab's yardstick: an HTTP/2 client through CONNECT gets the
origin's answers through reshape's engine; what it does not take gets a clear answer."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import h2.settings
import httpx
import pytest

from bench.lab.engine_floor import POOLED_POLICY, parse_args
from bench.overhead import peers
from labkit.origins import Origin, hypercorn_origin
from labkit.pki import OriginPKI


@pytest.fixture
def origin(tmp_path: Path, origin_pki: OriginPKI) -> Iterator[Origin]:
    root = tmp_path / "www"
    root.mkdir()
    (root / "tile.txt").write_bytes(b"tile\n" * 40_000)
    with hypercorn_origin(root, "127.0.0.3", tls=origin_pki.issue(["127.0.0.3"])) as served:
        yield served


@pytest.fixture
def floor(tmp_path: Path, origin_pki: OriginPKI) -> Iterator[peers.RunningProxy]:
    with peers.engine_floor(tmp_path / "floor", origin_pki.ca_cert_path, POOLED_POLICY) as running:
        yield running


def _client(floor: peers.RunningProxy, *, http2: bool = True) -> httpx.Client:
    trust = ssl.create_default_context(cafile=str(floor.https_ca))
    return httpx.Client(proxy=floor.url, verify=trust, http2=http2, timeout=10)


def _ask(port: int, head: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(head)
        return conn.recv(4096)


@pytest.mark.slow
def test_h2_requests_go_through_the_engine(origin: Origin, floor: peers.RunningProxy) -> None:
    base = f"https://127.0.0.3:{origin.port}"
    with _client(floor) as client:
        for _ in range(3):
            got = client.get(f"{base}/tile.txt")
            assert got.status_code == 200 and got.http_version == "HTTP/2"
            assert got.content == b"tile\n" * 40_000
        posted = client.post(f"{base}/echo/event", content=b"x" * 70_000)
        assert posted.status_code == 200 and posted.content == b"x" * 70_000
        missing = client.get(f"{base}/nothing-here")
        assert missing.status_code == 404


@pytest.mark.slow
def test_a_response_waits_for_the_clients_flow_control(
    origin: Origin, floor: peers.RunningProxy
) -> None:
    # httpx and Chromium open windows of megabytes: this client's are 1,000 bytes.
    with socket.create_connection(("127.0.0.1", floor.ports[0]), timeout=10) as raw:
        raw.sendall(f"CONNECT 127.0.0.3:{origin.port} HTTP/1.1\r\n\r\n".encode())
        assert raw.recv(4096).startswith(b"HTTP/1.1 200 ")
        trust = ssl.create_default_context(cafile=str(floor.https_ca))
        trust.set_alpn_protocols(["h2"])
        with trust.wrap_socket(raw, server_hostname="127.0.0.3") as tls:
            conn = h2.connection.H2Connection(h2.config.H2Configuration(header_encoding=None))
            conn.initiate_connection()
            conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1_000})
            conn.send_headers(
                1,
                [
                    (b":method", b"GET"),
                    (b":scheme", b"https"),
                    (b":authority", f"127.0.0.3:{origin.port}".encode()),
                    (b":path", b"/tile.txt"),
                ],
                end_stream=True,
            )
            tls.sendall(conn.data_to_send())
            body, ended = b"", False
            while not ended and (data := tls.recv(65536)):
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.DataReceived):
                        assert event.data is not None and len(event.data) <= 1_000
                        body += event.data
                        conn.acknowledge_received_data(event.flow_controlled_length or 0, 1)
                    ended = ended or isinstance(event, h2.events.StreamEnded)
                tls.sendall(conn.data_to_send())
    assert ended and body == b"tile\n" * 40_000


@pytest.mark.slow
def test_what_it_does_not_take_gets_an_answer(floor: peers.RunningProxy) -> None:
    port = floor.ports[0]
    assert _ask(port, b"GET http://127.0.0.3/ HTTP/1.1\r\nHost: 127.0.0.3\r\n\r\n").startswith(
        b"HTTP/1.1 405 "
    )
    assert _ask(port, b"CONNECT 127.0.0.3 HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    # An origin that is not there: the engine's reason, as a 502.
    with _client(floor) as client:
        failed = client.get(f"https://127.0.0.3:{_closed_port()}/")
    assert failed.status_code == 502 and b"could not connect" in failed.content
    # An HTTP/1.1 client: TLS without h2 is not what this front end measures; it hangs up.
    with _client(floor, http2=False) as client, pytest.raises(httpx.TransportError):
        client.get(f"https://127.0.0.3:{_closed_port()}/")


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.3", 0))
        return int(sock.getsockname()[1])


def test_listen_must_be_host_and_port() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--listen", "8080", "--confdir", "x"])
    args = parse_args(["--listen", "127.0.0.1:8080", "--confdir", "x"])
    assert (args.host, args.port, args.policy) == ("127.0.0.1", 8080, POOLED_POLICY)
