"""The proxy's listener queues as many connections as the kernel allows, not asyncio's 100
(the ListenBacklog patch): 1,000 clients connecting at once are not reset."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from reshape.app.runtime import LISTEN_BACKLOG
from tests.support.reshape_process import StartProxy


def listen_backlog(port: str) -> int:
    """The accept-queue size of the TCP listener on `port` (ss shows it as Send-Q)."""
    out = subprocess.run(
        ["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=True
    ).stdout
    return int(out.split()[2])


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")
def test_the_proxy_listens_with_a_large_backlog(start_reshape: StartProxy) -> None:
    proxy = start_reshape()
    somaxconn = int(Path("/proc/sys/net/core/somaxconn").read_text())
    assert listen_backlog(proxy.listen.rsplit(":", 1)[1]) == min(LISTEN_BACKLOG, somaxconn) > 100
