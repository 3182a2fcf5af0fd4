"""SIGTERM with idle client connections (issue 15, finding 11): reshape ends each of them,
exits 0 at once (nothing in flight, so no drain to wait out), and logs no traceback — it used to
log "Unhandled error in task … CancelledError" once per connection. Both paths."""

from __future__ import annotations

import socket
import ssl
import time
from pathlib import Path

import h2.config
import h2.connection
import pytest

from labkit.pki import OriginPKI
from tests.support.clients import read_response, status_of
from tests.support.faulty_origins import FaultyOrigin
from tests.support.reshape_process import StartProxy

POLICIES = {
    "direct": "version: 1\ndefault: p\npolicies:\n  p: {}\n",
    "pooled": "version: 1\ndefault: p\npolicies:\n  p:\n    upstream: {}\n",
}


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
def test_sigterm_with_idle_connections_ends_them_without_a_traceback(
    start_reshape: StartProxy, tmp_path: Path, origin_pki: OriginPKI, policy: str
) -> None:
    policy_path = tmp_path / "policy.yaml"
    policy_path.write_text(POLICIES[policy])
    proxy = start_reshape(policy=policy_path)
    host, port = proxy.listen.split(":")
    idle: list[socket.socket] = []
    with (
        FaultyOrigin("127.0.0.67") as plain,
        FaultyOrigin("127.0.0.68", tls=origin_pki.issue(["127.0.0.68"])) as h2_origin,
    ):
        for i in range(5):  # keep-alive connections idle after one answered request
            sock = socket.create_connection((host, int(port)), timeout=10)
            sock.sendall(f"GET {plain.url(f'/echo/{i}')} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            assert status_of(read_response(sock)) == 200
            idle.append(sock)
        for _ in range(3):  # connections that never sent a byte
            idle.append(socket.create_connection((host, int(port)), timeout=10))
        # An HTTP/2 connection in a CONNECT tunnel, idle after its preface.
        raw = socket.create_connection((host, int(port)), timeout=10)
        target = f"{h2_origin.host}:{h2_origin.port}"
        raw.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        assert raw.recv(4096).startswith(b"HTTP/1.1 200")
        context = ssl.create_default_context(cafile=str(proxy.ca_cert))
        context.set_alpn_protocols(["h2"])
        tunnel = context.wrap_socket(raw, server_hostname=h2_origin.host)
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        conn.initiate_connection()
        tunnel.sendall(conn.data_to_send())
        tunnel.recv(65536)  # the proxy's SETTINGS
        idle.append(tunnel)
        time.sleep(0.5)

        started = time.monotonic()
        exit_code = proxy.stop(timeout=20)
        took = time.monotonic() - started
        for sock in idle:  # each was ended by the proxy
            sock.settimeout(5)
            try:
                while sock.recv(65536):
                    pass
            except (ConnectionResetError, ssl.SSLError):
                pass
            sock.close()
    log = proxy.log()
    assert exit_code == 0, log
    assert took < 5, took  # nothing in flight: no drain to wait out
    assert "Traceback" not in log and "Unhandled error" not in log, log
    assert "CancelledError" not in log
    assert log.rstrip().endswith("stopped"), log[-500:]
