"""`reshape users`: the users file (reshape/features/proxy_auth/users.py) from the command line."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from reshape.features.proxy_auth.users import Users, load_users, save_users
from tests.support.reshape_process import REPO, RESHAPE
from tests.unit.features.proxy_auth.test_users import cheap


def users_cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*RESHAPE, "users", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )


def test_users_command_round_trip(tmp_path: Path) -> None:
    confdir = tmp_path / "conf"
    where = ("--confdir", str(confdir))
    added = users_cli("add", "alice", *where, "--password-stdin", stdin="first pw\n")
    assert added.returncode == 0, added.stderr
    path = confdir / "users"
    assert path.stat().st_mode & 0o777 == 0o600
    assert "first pw" not in path.read_text()
    assert users_cli("add", "bob", *where, "--password-stdin", stdin="b\n").returncode == 0
    assert users_cli("list", *where).stdout.split() == ["alice", "bob"]

    changed = users_cli("add", "alice", *where, "--password-stdin", stdin="second pw\r\n")
    assert "changed the password of alice" in changed.stdout
    assert load_users(path).verify("alice", "second pw")
    assert not load_users(path).verify("alice", "first pw")

    assert users_cli("remove", "bob", *where).returncode == 0
    assert users_cli("list", *where).stdout.split() == ["alice"]


@pytest.mark.parametrize(
    ("args", "stdin", "needle"),
    [
        (("remove", "nobody"), "", "no user 'nobody'"),
        (("add", "alice"), "", "stdin is not a terminal"),
        (("add", "alice", "--password-stdin"), "\n", "the password is empty"),
        (("add", "a:b", "--password-stdin"), "pw\n", "is not allowed"),
    ],
)
def test_users_command_errors(
    tmp_path: Path, args: tuple[str, ...], stdin: str, needle: str
) -> None:
    result = users_cli(*args, "--users", str(tmp_path / "users"), stdin=stdin)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "reshape: error: " in result.stderr and needle in result.stderr


def test_users_command_refuses_an_exposed_file(tmp_path: Path) -> None:
    path = tmp_path / "users"
    save_users(path, Users({"alice": cheap("pw")}))
    os.chmod(path, 0o644)
    result = users_cli("list", "--users", str(path))
    assert result.returncode == 2 and "chmod 600" in result.stderr
