"""reshape/features/proxy_auth/users.py: the users file (format, hashing, permissions). `reshape
users`: tests/system/features/proxy_auth/test_users.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reshape.features.proxy_auth import users as users_file
from reshape.features.proxy_auth.users import (
    PasswordHash,
    Users,
    UsersFileError,
    format_users,
    hash_password,
    load_users,
    parse_users,
    save_users,
    users_for_run,
)

# Cheap scrypt parameters: the tests are about the logic, not the cost.
CHEAP = {"n": 16, "r": 1, "p": 1}


def cheap(password: str) -> PasswordHash:
    return hash_password(password, **CHEAP)


def test_default_hash_verifies_the_password_only() -> None:
    h = hash_password("correct horse")
    assert (h.n, h.r, h.p) == (users_file.DEFAULT_N, users_file.DEFAULT_R, users_file.DEFAULT_P)
    assert h.verify("correct horse")
    assert not h.verify("correct horse ")
    assert not h.verify("")


def test_salts_differ_so_equal_passwords_hash_differently() -> None:
    a, b = cheap("same"), cheap("same")
    assert a.salt != b.salt and a.digest != b.digest
    assert a.verify("same") and b.verify("same")


def test_unknown_user_is_rejected() -> None:
    users = Users({"alice": cheap("pw")})
    assert users.verify("alice", "pw")
    assert not users.verify("alice", "wrong")
    assert not users.verify("mallory", "pw")


names = st.from_regex(users_file.NAME_PATTERN, fullmatch=True)


@settings(max_examples=50, deadline=None)
@given(st.dictionaries(names, st.text(min_size=1, max_size=20), max_size=4))
def test_format_then_parse_keeps_every_user(passwords: dict[str, str]) -> None:
    users = Users({name: cheap(pw) for name, pw in passwords.items() if pw.encode()})
    text = format_users(users)
    assert not any(pw in text for pw in passwords.values() if len(pw) > 8)  # never a password
    parsed = parse_users(text, "users")
    assert parsed.hashes == users.hashes
    for name, pw in passwords.items():
        assert parsed.verify(name, pw)


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("alice", "expected NAME:scrypt"),
        ("alice:bcrypt:16:1:1:c2FsdHNhbHQ:aGFzaGhhc2hoYXNoaGFzaA", "expected NAME:scrypt"),
        ("al ice:scrypt:16:1:1:c2FsdHNhbHQ:aGFzaGhhc2hoYXNoaGFzaA", "not allowed"),
        ("alice:scrypt:x:1:1:c2FsdHNhbHQ:aGFzaGhhc2hoYXNoaGFzaA", "whole numbers"),
        ("alice:scrypt:15:1:1:c2FsdHNhbHQ:aGFzaGhhc2hoYXNoaGFzaA", "out of range"),
        ("alice:scrypt:1048576:8:1:c2FsdHNhbHQ:aGFzaGhhc2hoYXNoaGFzaA", "out of range"),
        ("alice:scrypt:16:1:1:!!!:aGFzaGhhc2hoYXNoaGFzaA", "base64"),
        ("alice:scrypt:16:1:1:c2E:aGFzaGhhc2hoYXNoaGFzaA", "too short"),
    ],
)
def test_bad_lines_are_named_with_their_number(line: str, needle: str) -> None:
    with pytest.raises(UsersFileError) as error:
        parse_users(f"# comment\n\n{line}\n", "FILE")
    assert "FILE line 3" in str(error.value) and needle in str(error.value)


def test_a_user_twice_is_refused() -> None:
    entry = f"alice:{cheap('pw').format()}\n"
    with pytest.raises(UsersFileError, match="appears twice"):
        parse_users(entry + entry, "FILE")


def test_saved_file_is_0600_and_loads_back(tmp_path: Path) -> None:
    path = tmp_path / "users"
    save_users(path, Users({"alice": cheap("pw")}))
    assert path.stat().st_mode & 0o777 == 0o600
    assert load_users(path).verify("alice", "pw")
    assert [p.name for p in tmp_path.iterdir()] == ["users"]  # no temporary left behind


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644])
def test_exposed_file_is_refused(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "users"
    save_users(path, Users({"alice": cheap("pw")}))
    path.chmod(mode)
    with pytest.raises(UsersFileError, match=f"mode {mode:04o}.*chmod 600"):
        load_users(path)


def test_missing_directory_and_empty_file(tmp_path: Path) -> None:
    with pytest.raises(UsersFileError, match="no users file .* reshape users add"):
        load_users(tmp_path / "nope")
    with pytest.raises(UsersFileError, match="cannot read users file .*directory"):
        load_users(tmp_path)
    path = tmp_path / "users"
    save_users(path, Users({}))
    assert load_users(path).hashes == {}
    with pytest.raises(UsersFileError, match="has no users"):
        users_for_run(path)
