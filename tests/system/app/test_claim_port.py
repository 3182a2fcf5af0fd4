"""`--workers N` claims its port before the workers listen on it with SO_REUSEPORT."""

from __future__ import annotations

import socket
import time

import pytest

from reshape.app.supervisor import claim_port
from reshape.base.addresses import ListenAddress
from reshape.base.errors import ReshapeError


def _listener() -> socket.socket:
    """A listening socket as the workers' (asyncio sets SO_REUSEADDR, mitmproxy SO_REUSEPORT)."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    return listener


def test_a_port_someone_listens_on_is_refused() -> None:
    with _listener() as listener:
        port = listener.getsockname()[1]
        with pytest.raises(ReshapeError, match="address already in use"):
            claim_port(ListenAddress("127.0.0.1", port))


def test_a_port_whose_last_connections_wait_out_time_wait_is_claimed() -> None:
    # A restarted gateway: its connections closed on its side linger in TIME-WAIT for a minute,
    # and `--workers 2` refused to start ("address already in use") where one worker did not.
    listener = _listener()
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = listener.accept()
    accepted.close()  # the proxy's side closes first: its socket goes to TIME-WAIT
    time.sleep(0.05)
    client.close()
    listener.close()
    assert claim_port(ListenAddress("127.0.0.1", port)) == ListenAddress("127.0.0.1", port)
