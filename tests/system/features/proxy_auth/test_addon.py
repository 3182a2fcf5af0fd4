"""reshape/features/proxy_auth/addon.py: Basic proxy authentication through `reshape run --users`
on 0.0.0.0, with curl and real origins. On flows: tests/unit/features/proxy_auth/test_addon.py."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
from pathlib import Path

import pytest

from labkit.origins import Origin
from labkit.processes import free_port
from reshape.features.proxy_auth.users import Users, hash_password, save_users
from tests.support.clients import curl_via_proxy
from tests.support.reshape_process import REPO, RESHAPE, StartProxy
from tests.support.scripted_origins import ScriptedOrigin
from tests.unit.features.proxy_auth.test_addon import PASSWORD


@pytest.fixture
def users_path(tmp_path: Path) -> Path:
    path = tmp_path / "users"
    save_users(path, Users({"alice": hash_password(PASSWORD, n=16, r=1, p=1)}))
    return path


# End to end: reshape on 0.0.0.0 with --users, curl as the client, nginx and a recording origin.


class RecordingOrigin(ScriptedOrigin):
    """Answers 200 and keeps every request head it received."""

    def __init__(self, host: str) -> None:
        super().__init__(host)
        self.heads: list[bytes] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                self.heads.append(head)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
def site_root(tmp_path: Path) -> Path:
    root = tmp_path / "www"
    root.mkdir()
    (root / "small.txt").write_text("hello from the origin\n")
    return root


def start_gateway(start_reshape: StartProxy, users_path: Path, *extra: str) -> tuple[str, object]:
    port = free_port("0.0.0.0")
    proxy = start_reshape("--listen", f"0.0.0.0:{port}", "--users", str(users_path), *extra)
    return f"http://127.0.0.1:{port}", proxy


def outward_address() -> str | None:
    """A non-loopback address of this machine (no packet is sent), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))
        except OSError:
            return None
        address = s.getsockname()[0]
    return None if address.startswith("127.") else address


@pytest.mark.slow
def test_gateway_on_all_interfaces_requires_credentials(
    start_reshape: StartProxy, users_path: Path, http_origin: Origin, https_origin: Origin
) -> None:
    url, proxy = start_gateway(start_reshape, users_path)
    good = ("--proxy-user", f"alice:{PASSWORD}")
    wrong = ("--proxy-user", "alice:guess")
    assert curl_via_proxy(url, http_origin.url("/small.txt"))[0] == "407"
    assert curl_via_proxy(url, http_origin.url("/small.txt"), *wrong)[0] == "407"
    assert curl_via_proxy(url, http_origin.url("/small.txt"), *good) == (
        "200",
        "hello from the origin\n",
    )
    cacert = ("--cacert", str(proxy.ca_cert))  # type: ignore[attr-defined]
    assert curl_via_proxy(url, https_origin.url("/small.txt"), *cacert)[0] == "407"  # the CONNECT
    assert curl_via_proxy(url, https_origin.url("/small.txt"), *cacert, *wrong)[0] == "407"
    assert curl_via_proxy(url, https_origin.url("/small.txt"), *cacert, *good) == (
        "200",
        "hello from the origin\n",
    )
    assert proxy.metric("reshape_proxy_auth_failures_total", reason="missing") == 2  # type: ignore[attr-defined]
    assert proxy.metric("reshape_proxy_auth_failures_total", reason="rejected") == 2  # type: ignore[attr-defined]

    # A client on another address may connect (no --allow-clients needed) and must authenticate.
    outward = outward_address()
    if outward is not None:
        port = url.rsplit(":", 1)[1]
        assert curl_via_proxy(f"http://{outward}:{port}", http_origin.url("/small.txt"))[0] == "407"


@pytest.mark.slow
def test_origin_never_sees_the_credentials(start_reshape: StartProxy, users_path: Path) -> None:
    url, _ = start_gateway(start_reshape, users_path)
    with RecordingOrigin("127.0.0.4") as origin:
        status, _ = curl_via_proxy(url, origin.url("/a"), "--proxy-user", f"alice:{PASSWORD}")
        assert status == "200"
        assert origin.heads and all(b"proxy-authorization" not in h.lower() for h in origin.heads)


@pytest.mark.slow
def test_every_worker_authenticates(
    start_reshape: StartProxy, users_path: Path, http_origin: Origin
) -> None:
    url, _ = start_gateway(start_reshape, users_path, "--workers", "2")
    statuses = {curl_via_proxy(url, http_origin.url("/small.txt"))[0] for _ in range(6)}
    assert statuses == {"407"}
    good = ("--proxy-user", f"alice:{PASSWORD}")
    assert {curl_via_proxy(url, http_origin.url("/small.txt"), *good)[0] for _ in range(6)} == {
        "200"
    }


def run_refused(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*RESHAPE, "run", *args], capture_output=True, text=True, cwd=REPO, timeout=60
    )


def test_all_interfaces_without_users_or_allow_list_refuses_to_start(tmp_path: Path) -> None:
    start = time.monotonic()
    result = run_refused("--listen", f"0.0.0.0:{free_port()}", "--confdir", str(tmp_path))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "reshape would be open to anyone there" in result.stderr
    assert "--users" in result.stderr and "--allow-clients" in result.stderr
    assert time.monotonic() - start < 30


def test_admin_beyond_loopback_needs_an_allow_list_even_with_users(
    tmp_path: Path, users_path: Path
) -> None:
    result = run_refused(
        "--listen",
        f"0.0.0.0:{free_port()}",
        "--admin",
        f"0.0.0.0:{free_port()}",
        "--users",
        str(users_path),
        "--confdir",
        str(tmp_path),
    )
    assert result.returncode == 2
    assert "admin endpoint has no authentication" in result.stderr


def test_exposed_users_file_refuses_to_start(tmp_path: Path, users_path: Path) -> None:
    users_path.chmod(0o640)
    result = run_refused(
        "--listen",
        f"127.0.0.1:{free_port()}",
        "--admin",
        f"127.0.0.1:{free_port()}",
        "--users",
        str(users_path),
        "--confdir",
        str(tmp_path / "conf"),
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"reshape: error: users file {users_path} is readable by group or others" in (
        result.stderr
    )
