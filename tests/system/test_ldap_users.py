"""Proxy authentication against a real LDAP directory (Debian's slapd), named by a users file in
mitmproxy's proxyauth syntax: the right password admits, a wrong one, an unknown or an ambiguous
name are refused; a directory that goes away refuses (nothing hangs), and admits again when it is
back; one that cannot be reached at start-up stops `reshape run` in one line."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import ldap3
import pytest

from labkit.processes import free_port
from reshape.features.onboarding.addon import ONBOARDING_HOST
from tests.support.reshape_process import REPO, RESHAPE, StartProxy

SLAPD = "/usr/sbin/slapd"
SUFFIX = "dc=example,dc=org"
ADMIN_DN, ADMIN_PASSWORD = f"cn=admin,{SUFFIX}", "directory-admin"
SERVICE_DN, SERVICE_PASSWORD = f"uid=reshape,ou=services,{SUFFIX}", "service-secret"

pytestmark = pytest.mark.slow


def ssha(password: str) -> str:
    salt = os.urandom(8)
    digest = hashlib.sha1(password.encode() + salt).digest()
    return "{SSHA}" + base64.b64encode(digest + salt).decode()


@dataclass
class Directory:
    config: Path
    port: int
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [SLAPD, "-f", str(self.config), "-h", f"ldap://127.0.0.1:{self.port}/", "-d", "0"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                ldap3.Connection(self.server(), ADMIN_DN, ADMIN_PASSWORD, auto_bind=True).unbind()
                return
            except ldap3.core.exceptions.LDAPException:
                time.sleep(0.1)
        pytest.fail("slapd did not start")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(20)

    def server(self) -> ldap3.Server:
        return ldap3.Server("127.0.0.1", port=self.port, connect_timeout=2)


@pytest.fixture
def directory(tmp_path: Path) -> Iterator[Directory]:
    database = tmp_path / "ldap"
    database.mkdir()
    config = tmp_path / "slapd.conf"
    config.write_text(
        "include /etc/ldap/schema/core.schema\n"
        "include /etc/ldap/schema/cosine.schema\n"
        "include /etc/ldap/schema/inetorgperson.schema\n"
        f"pidfile {tmp_path}/slapd.pid\n"
        "modulepath /usr/lib/ldap\nmoduleload back_mdb\n"
        f'database mdb\nsuffix "{SUFFIX}"\nrootdn "{ADMIN_DN}"\nrootpw {ADMIN_PASSWORD}\n'
        f"directory {database}\n"
    )
    running = Directory(config, free_port())
    running.start()
    admin = ldap3.Connection(running.server(), ADMIN_DN, ADMIN_PASSWORD, auto_bind=True)
    entries = [
        (SUFFIX, ["dcObject", "organization"], {"o": "example", "dc": "example"}),
        (f"ou=people,{SUFFIX}", ["organizationalUnit"], {"ou": "people"}),
        (f"ou=contractors,{SUFFIX}", ["organizationalUnit"], {"ou": "contractors"}),
        (f"ou=services,{SUFFIX}", ["organizationalUnit"], {"ou": "services"}),
        (SERVICE_DN, ["account", "simpleSecurityObject"], {"userPassword": ssha(SERVICE_PASSWORD)}),
    ]
    for uid, unit, password in [
        ("carol", "people", "carols password"),
        ("eve", "people", "eve-1"),
        ("eve", "contractors", "eve-2"),  # the same name twice: ambiguous
    ]:
        entries.append(
            (
                f"uid={uid},ou={unit},{SUFFIX}",
                ["inetOrgPerson"],
                {"cn": uid, "sn": uid, "uid": uid, "userPassword": ssha(password)},
            )
        )
    for dn, classes, attributes in entries:
        assert admin.add(dn, classes, attributes), admin.result
    admin.unbind()
    yield running
    running.stop()


def users_file(path: Path, port: int) -> Path:
    path.write_text(
        f"# the directory reshape asks\nldap:127.0.0.1:{port}:{SERVICE_DN}:{SERVICE_PASSWORD}:"
        f"{SUFFIX}?search_filter_key=uid\n"
    )
    path.chmod(0o600)
    return path


def status_as(proxy_url: str, user: str, password: str) -> str:
    result = subprocess.run(
        ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "30"]
        + ["-x", proxy_url, "--proxy-user", f"{user}:{password}", f"http://{ONBOARDING_HOST}/"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return result.stdout


def test_ldap_directory_admits_its_users(
    start_reshape: StartProxy, directory: Directory, tmp_path: Path
) -> None:
    users = users_file(tmp_path / "users", directory.port)
    proxy = start_reshape("--users", str(users))
    assert status_as(proxy.proxy_url, "carol", "carols password") == "200"
    assert status_as(proxy.proxy_url, "carol", "not carols") == "407"
    assert status_as(proxy.proxy_url, "mallory", "carols password") == "407"
    assert status_as(proxy.proxy_url, "eve", "eve-1") == "407"  # two entries: which one?
    assert status_as(proxy.proxy_url, "*", "carols password") == "407"  # escaped, not a wildcard
    assert SERVICE_PASSWORD not in proxy.log()

    directory.stop()  # the directory goes away: refused at once, not hung
    started = time.monotonic()
    assert status_as(proxy.proxy_url, "carol", "carols password") == "407"
    assert time.monotonic() - started < 15
    assert "cannot search for a user" in proxy.log()
    directory.start()  # and comes back: the search connection is opened again
    assert status_as(proxy.proxy_url, "carol", "carols password") == "200"
    assert proxy.stop() == 0


def test_an_unreachable_directory_stops_start_up_in_one_line(tmp_path: Path) -> None:
    users = users_file(tmp_path / "users", free_port())
    result = subprocess.run(
        [*RESHAPE, "run", "--listen", f"127.0.0.1:{free_port()}", "--admin"]
        + [f"127.0.0.1:{free_port()}", "--confdir", str(tmp_path / "conf"), "--users", str(users)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert result.returncode == 2
    (line,) = [line for line in result.stderr.splitlines() if "error" in line]
    assert "cannot bind to the LDAP directory ldap://127.0.0.1:" in line
    assert SERVICE_PASSWORD not in result.stderr
    listing = subprocess.run(
        [*RESHAPE, "users", "list", "--users", str(users)], capture_output=True, text=True
    )
    assert listing.returncode == 2 and "names the LDAP directory" in listing.stderr
