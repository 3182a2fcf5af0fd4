"""reshape/features/proxy_auth/addon.py on flows: Basic proxy authentication. `reshape run
--users` on 0.0.0.0 with curl and real origins: tests/system/features/proxy_auth/test_addon.py."""

from __future__ import annotations

import asyncio
import base64
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from mitmproxy.test import tflow

from reshape.features.proxy_auth.addon import ProxyAuthentication, parse_basic
from reshape.features.proxy_auth.users import Users, hash_password, save_users
from reshape.features.telemetry import metrics

PASSWORD = "open sesame"


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@dataclass(frozen=True)
class CountingUsers(Users):
    """Real users that also count scrypt verifications."""

    calls: list[str] = field(default_factory=list)

    def verify(self, name: str, password: str) -> bool:
        self.calls.append(name)
        return super().verify(name, password)


@pytest.fixture
def users_path(tmp_path: Path) -> Path:
    path = tmp_path / "users"
    save_users(path, Users({"alice": hash_password(PASSWORD, n=16, r=1, p=1)}))
    return path


def addon_for(path: Path) -> tuple[ProxyAuthentication, CountingUsers]:
    users = CountingUsers({"alice": hash_password(PASSWORD, n=16, r=1, p=1)})
    return ProxyAuthentication(path, users), users


def failures(reason: str) -> float:
    return metrics.proxy_auth_failures_total.labels(reason)._value.get()


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        (basic("alice", "pw"), ("alice", "pw")),
        (basic("alice", "p:w"), ("alice", "p:w")),
        ("basic " + base64.b64encode(b"a:").decode(), ("a", "")),
        ("Bearer abc", None),
        ("Basic !!!", None),
        ("Basic " + base64.b64encode(b"no-colon").decode(), None),
        ("Basic " + base64.b64encode(b"\xff:x").decode(), None),
        ("", None),
    ],
)
def test_parse_basic(value: str, parsed: tuple[str, str] | None) -> None:
    assert parse_basic(value) == parsed


@pytest.mark.parametrize(
    ("header", "reason"),
    [(None, "missing"), ("Digest x", "malformed"), (basic("alice", "nope"), "rejected")],
)
def test_bad_credentials_get_407(users_path: Path, header: str | None, reason: str) -> None:
    addon, _ = addon_for(users_path)
    flow = tflow.tflow()
    if header is not None:
        flow.request.headers["Proxy-Authorization"] = header
    before = failures(reason)
    asyncio.run(addon.requestheaders(flow))
    assert flow.response is not None and flow.response.status_code == 407
    assert flow.response.headers["Proxy-Authenticate"].startswith('Basic realm="reshape"')
    assert failures(reason) == before + 1


def test_good_credentials_are_removed_and_remembered_per_connection(users_path: Path) -> None:
    addon, users = addon_for(users_path)
    first, second = tflow.tflow(), tflow.tflow()
    second.client_conn = first.client_conn
    for flow in (first, second):
        flow.request.headers["Proxy-Authorization"] = basic("alice", PASSWORD)
        asyncio.run(addon.requestheaders(flow))
        assert flow.response is None
        assert "Proxy-Authorization" not in flow.request.headers
    assert users.calls == ["alice"]  # the second request was not verified again

    other = tflow.tflow()  # another client connection, same header: verified on its own
    other.request.headers["Proxy-Authorization"] = basic("alice", PASSWORD)
    asyncio.run(addon.requestheaders(other))
    assert users.calls == ["alice", "alice"]

    changed = tflow.tflow()  # same connection, different credentials: verified again, refused
    changed.client_conn = first.client_conn
    changed.request.headers["Proxy-Authorization"] = basic("alice", "guess")
    asyncio.run(addon.requestheaders(changed))
    assert changed.response is not None and changed.response.status_code == 407


def test_connect_authenticates_its_tunnel(users_path: Path) -> None:
    addon, users = addon_for(users_path)
    connect = tflow.tflow()
    connect.request.method = "CONNECT"
    asyncio.run(addon.http_connect(connect))
    assert connect.response is not None and connect.response.status_code == 407

    connect = tflow.tflow()
    connect.request.method = "CONNECT"
    connect.request.headers["Proxy-Authorization"] = basic("alice", PASSWORD)
    asyncio.run(addon.http_connect(connect))
    assert connect.response is None
    inner = tflow.tflow()  # a request inside the tunnel carries no credentials
    inner.client_conn = connect.client_conn
    asyncio.run(addon.requestheaders(inner))
    assert inner.response is None
    assert users.calls == ["alice"]


def test_off_without_a_users_file() -> None:
    addon = ProxyAuthentication(None)
    flow = tflow.tflow()
    asyncio.run(addon.requestheaders(flow))
    assert flow.response is None


def test_users_file_changes_take_effect(users_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    addon = ProxyAuthentication(users_path)
    monkeypatch.setattr("reshape.features.proxy_auth.addon.RELOAD_CHECK_SECONDS", 0.0)
    save_users(users_path, Users({"bob": hash_password("b", n=16, r=1, p=1)}))
    addon._next_check = 0.0
    flow = tflow.tflow()
    flow.request.headers["Proxy-Authorization"] = basic("bob", "b")
    asyncio.run(addon.requestheaders(flow))
    assert flow.response is None
    users_path.chmod(0o644)  # an exposed file is refused; the users read before stay
    addon._next_check = 0.0
    asyncio.run(addon.requestheaders(tflow.tflow()))
    assert set(addon.users.hashes) == {"bob"}  # type: ignore[union-attr]
