"""The TLS records reshape writes, read off the wire by a client that parses every record header.

The client tunnels through reshape with CONNECT and does TLS 1.3 with `ssl.MemoryBIO`, feeding the
records in one at a time, so it knows each record's length on the wire and how many application
bytes it carried.
"""

from __future__ import annotations

import random
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest

from labkit.browser import load_page
from labkit.origins import Origin, hypercorn_origin, nginx_origin
from labkit.pki import OriginPKI
from labkit.sites import Site, build_multi_origin_site
from tests.support.reshape_process import StartProxy

MB = 1_048_576
BIG = 3 * MB
MID = 256 * 1024
FULL = 16_384
# TLS 1.3 record = plaintext + inner content type (1) + AEAD tag (16); OpenSSL adds no padding.
TLS13_OVERHEAD = 17
APPLICATION_DATA = 23
RELAY_HOST = "127.0.0.6"


@dataclass(frozen=True)
class Record:
    content_type: int
    length: int  # on the wire, after the 5-byte header
    carried: int  # application bytes it decrypted to (0 for handshake and session tickets)


class RecordingClient:
    """HTTP/1.1 over TLS 1.3 through reshape's CONNECT tunnel; sees every record reshape writes."""

    def __init__(self, proxy: str, origin: Origin, ca: Path) -> None:
        host, port = proxy.rsplit(":", 1)
        self.authority = f"{origin.host}:{origin.port}"
        self.sock = socket.create_connection((host, int(port)), timeout=20)
        self.sock.sendall(
            f"CONNECT {self.authority} HTTP/1.1\r\nHost: {self.authority}\r\n\r\n".encode()
        )
        reply = b""
        while not reply.endswith(b"\r\n\r\n"):
            byte = self.sock.recv(1)
            assert byte, f"proxy closed during CONNECT: {reply!r}"
            reply += byte
        assert reply.startswith(b"HTTP/1.1 200"), reply
        context = ssl.create_default_context(cafile=str(ca))
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        context.set_alpn_protocols(["http/1.1"])
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = context.wrap_bio(self.incoming, self.outgoing, server_hostname=origin.host)
        self.raw = bytearray()
        self.records: list[Record] = []
        self.received = bytearray()
        self.handshake_done = False
        while not self.handshake_done:
            try:
                self.tls.do_handshake()
                self.handshake_done = True
            except ssl.SSLWantReadError:
                self._flush()
                self._next_record()
        self._flush()

    def close(self) -> None:
        self.sock.close()

    def request(self, method: str, path: str, body: bytes = b"") -> list[Record]:
        """Sends one request; the records that carried its response (head and body), in order."""
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.authority}\r\nUser-Agent: curl/8.5.0\r\n"
        if body:
            head += f"Content-Length: {len(body)}\r\n"
        self.tls.write(head.encode() + b"\r\n" + body)
        self._flush()
        first = len(self.records)
        self.received.clear()
        while b"\r\n\r\n" not in self.received:
            self._next_record()
        response_head = bytes(self.received).split(b"\r\n\r\n", 1)[0]
        lines = response_head.decode("latin-1").split("\r\n")
        fields = dict(line.lower().split(": ", 1) for line in lines[1:])
        expected = len(response_head) + 4 + int(fields["content-length"])
        while len(self.received) < expected:
            self._next_record()
        assert len(self.received) == expected
        return [record for record in self.records[first:] if record.carried]

    def _flush(self) -> None:
        data = self.outgoing.read()
        if data:
            self.sock.sendall(data)

    def _next_record(self) -> None:
        while len(self.raw) < 5 or len(self.raw) < 5 + int.from_bytes(self.raw[3:5], "big"):
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the proxy closed the connection")
            self.raw += chunk
        length = int.from_bytes(self.raw[3:5], "big")
        record = bytes(self.raw[: 5 + length])
        del self.raw[: 5 + length]
        self.incoming.write(record)
        carried = 0
        if self.handshake_done:
            while True:
                try:
                    data = self.tls.read(65536)
                except (ssl.SSLWantReadError, ssl.SSLZeroReturnError):
                    break
                if not data:
                    break
                carried += len(data)
                self.received += data
        self.records.append(Record(record[0], length, carried))


def policy_file(directory: Path, section: str) -> Path:
    path = directory / "policy.yaml"
    path.write_text(
        "version: 1\ndefault: p\npolicies:\n"
        + (f"  p:\n    tls_records: {section}\n" if section else "  p: {}\n")
    )
    return path


def starts(records: list[Record]) -> list[tuple[int, int]]:
    """(offset of the record's first byte in the response, its plaintext size), per record."""
    offset, out = 0, []
    for record in records:
        out.append((offset, record.carried))
        offset += record.carried
    return out


def share_in(records: list[Record], size: int) -> float:
    """Share of the bytes carried in records of exactly `size`."""
    total = sum(r.carried for r in records)
    return sum(r.carried for r in records if r.carried == size) / total


@pytest.fixture(scope="module")
def origin(tmp_path_factory: pytest.TempPathFactory, origin_pki: OriginPKI) -> Iterator[Origin]:
    """nginx on 127.0.0.2 serving big.bin (3 MB) and mid.bin (256 KB) over HTTPS; its certificate
    also names the relay address, so reshape may be pointed at a relay in front of it."""
    root = tmp_path_factory.mktemp("records-www")
    rng = random.Random(5)
    (root / "big.bin").write_bytes(rng.randbytes(BIG))
    (root / "mid.bin").write_bytes(rng.randbytes(MID))
    tls = origin_pki.issue(["127.0.0.2", RELAY_HOST])
    with nginx_origin(root, "127.0.0.2", tls=tls) as running:
        yield running


def test_dynamic_records_start_small_grow_and_shrink_again_after_idle(
    start_reshape: StartProxy, origin: Origin, tmp_path: Path
) -> None:
    proxy = start_reshape(policy=policy_file(tmp_path, "{mode: dynamic}"))
    client = RecordingClient(proxy.listen, origin, proxy.ca_cert)
    try:
        first = client.request("GET", "/big.bin")
        again = client.request("GET", "/mid.bin")  # at once: the connection is warm
        time.sleep(1.0 + 0.5)  # idle_reset's default, and some
        after_idle = client.request("GET", "/mid.bin")
    finally:
        client.close()

    for record in first + again + after_idle:
        assert record.content_type == APPLICATION_DATA
        assert record.length == record.carried + TLS13_OVERHEAD
    # The first MB (warmup_bytes) in records of at most 1,400 bytes (small_bytes).
    warmup = [(offset, size) for offset, size in starts(first) if offset < MB]
    assert sum(size for _, size in warmup) >= MB
    assert max(size for _, size in warmup) == 1400
    # Then full records: the rest of the 3 MB mostly in 16 KB ones, none bigger.
    rest = [r for (offset, _), r in zip(starts(first), first, strict=True) if offset >= MB]
    assert max(r.carried for r in rest) == FULL
    assert share_in(rest, FULL) > 0.5
    # Warm connection: the next response starts with full records (its head is a write of its own).
    assert max(r.carried for r in again) == FULL
    assert share_in(again, FULL) > 0.5
    # After a second of silence: small again.
    assert max(r.carried for r in after_idle) == 1400
    assert share_in(after_idle, 1400) > 0.95

    small = proxy.metric("reshape_tls_records_total", side="client", size="small")
    large = proxy.metric("reshape_tls_records_total", side="client", size="large")
    assert small >= (MB + MID) // 1400
    assert large >= (BIG - MB) // FULL
    assert proxy.metric("reshape_tls_record_bytes_bucket", side="client", le="1400.0") == small
    assert proxy.metric("reshape_tls_records_total", side="origin") == 0


@pytest.mark.parametrize(
    ("section", "record_size"),
    [("", FULL), ("{mode: off}", FULL), ("{mode: fixed, fixed_bytes: 4096}", 4096)],
    ids=["absent", "off", "fixed"],
)
def test_records_without_dynamic_sizing(
    start_reshape: StartProxy, origin: Origin, tmp_path: Path, section: str, record_size: int
) -> None:
    proxy = start_reshape(policy=policy_file(tmp_path, section))
    client = RecordingClient(proxy.listen, origin, proxy.ca_cert)
    try:
        records = client.request("GET", "/big.bin")
    finally:
        client.close()
    assert max(r.carried for r in records) == record_size
    assert share_in(records, record_size) > 0.5
    # From the start: the first 64 KB already hold a record of full size.
    assert any(size == record_size for offset, size in starts(records) if offset < 65_536)
    sized = proxy.metric("reshape_tls_records_total", side="client")
    assert sized == (len(records) if record_size != FULL else 0)


class RecordCountingRelay:
    """A TCP relay to `target` that notes the length of every TLS record sent towards it."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.lengths: list[tuple[int, int]] = []  # (content type, length)
        self.listener = socket.create_server((RELAY_HOST, 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.listener.close()

    def wait_for(self, application_bytes: int, timeout: float = 10.0) -> None:
        """Until records carrying at least `application_bytes` have gone through. (The origin
        may answer before it has read a request's body, and the relay may lag behind.)"""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            carried = sum(
                length - TLS13_OVERHEAD
                for kind, length in list(self.lengths)
                if kind == APPLICATION_DATA
            )
            if carried >= application_bytes:
                return
            time.sleep(0.05)
        raise AssertionError(f"the relay saw {self.lengths[-5:]}… short of {application_bytes}")

    def _accept(self) -> None:
        while True:
            try:
                downstream, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            threading.Thread(
                target=self._pump, args=(downstream, upstream, True), daemon=True
            ).start()
            threading.Thread(
                target=self._pump, args=(upstream, downstream, False), daemon=True
            ).start()

    def _pump(self, source: socket.socket, sink: socket.socket, parse: bool) -> None:
        pending = bytearray()
        with source, sink:
            while True:
                try:
                    data = source.recv(65536)
                    if not data:
                        return
                    sink.sendall(data)
                except OSError:
                    return
                if parse:
                    pending += data
                    while len(pending) >= 5 and len(pending) >= 5 + int.from_bytes(
                        pending[3:5], "big"
                    ):
                        length = int.from_bytes(pending[3:5], "big")
                        self.lengths.append((pending[0], length))
                        del pending[: 5 + length]


@pytest.mark.parametrize("side", ["client", "both"])
def test_side_both_sizes_records_to_origins_too(
    start_reshape: StartProxy, origin: Origin, tmp_path: Path, side: str
) -> None:
    relay = RecordCountingRelay((origin.host, origin.port))
    proxy = start_reshape(policy=policy_file(tmp_path, f"{{side: {side}}}"))
    in_front = Origin(RELAY_HOST, relay.port, origin.scheme, origin.protocols)
    client = RecordingClient(proxy.listen, in_front, proxy.ca_cert)
    body = random.Random(7).randbytes(MID)
    try:
        client.request("POST", "/upload", body)  # nginx answers 405
        relay.wait_for(len(body))
    finally:
        client.close()
        relay.close()
    small_on_wire = sum(
        1 for kind, length in relay.lengths if kind == APPLICATION_DATA and length == 1400 + 17
    )
    small_counted = proxy.metric("reshape_tls_records_total", side="origin", size="small")
    if side == "both":
        assert small_on_wire >= MID // 1400
        assert small_counted >= MID // 1400
    else:
        assert small_on_wire == 0
        assert small_counted == 0


@pytest.fixture
def two_origin_site(tmp_path: Path, origin_pki: OriginPKI) -> Iterator[Site]:
    roots = {name: tmp_path / name for name in ("main", "static")}
    for root in roots.values():
        root.mkdir()
    with ExitStack() as stack:
        main = stack.enter_context(
            nginx_origin(
                roots["main"], "127.0.0.2", tls=origin_pki.issue(["127.0.0.2"]), http2=True
            )
        )
        static = stack.enter_context(
            hypercorn_origin(roots["static"], "127.0.0.3", tls=origin_pki.issue(["127.0.0.3"]))
        )
        yield build_multi_origin_site(
            roots, {"main": main.url(""), "static": static.url("")}, resources=24, seed=3
        )


@pytest.mark.browser
def test_chromium_loads_every_resource_intact_with_small_records(
    start_reshape: StartProxy, two_origin_site: Site, tmp_path: Path
) -> None:
    site = two_origin_site
    proxy = start_reshape(policy=policy_file(tmp_path, "{mode: dynamic, warmup_bytes: 262144}"))
    page = load_page(site.page_url, proxy=proxy.listen, trusted_cas=[proxy.ca_cert])
    assert {resource.url: resource.sha256 for resource in page.resources} == site.resources
    assert {resource.status for resource in page.resources} == {200}
    assert proxy.metric("reshape_tls_records_total", side="client", size="small") > 100
    assert proxy.metric("reshape_tls_records_total", side="client", size="large") > 0
