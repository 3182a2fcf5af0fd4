"""The users file's other formats, told apart by content: htpasswd (bcrypt), LDAP."""

from __future__ import annotations

import bcrypt
import pytest

from reshape.features.proxy_auth.users import (
    BcryptHash,
    UsersFileError,
    format_users,
    hash_password,
    parse_users,
)


def entry(name: str, password: str, cost: int = 4, prefix: bytes = b"2b") -> str:
    digest = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=cost, prefix=prefix))
    # Apache's htpasswd -B writes $2y$, the same algorithm as $2b$.
    return f"{name}:{digest.decode().replace('$2b$', '$2y$')}"


def test_an_htpasswd_file_admits_its_users_and_no_one_else() -> None:
    text = "\n".join(
        ["# a comment", entry("bob", "builder"), "", entry("mary.jane@corp", "p w:d", cost=5)]
    )
    users = parse_users(text + "\n", "users.htpasswd")
    assert users.format == "htpasswd"
    assert set(users.hashes) == {"bob", "mary.jane@corp"}
    assert users.verify("bob", "builder")
    assert users.verify("mary.jane@corp", "p w:d")
    assert not users.verify("bob", "Builder")
    assert not users.verify("nobody", "builder")  # costs a bcrypt verification too
    assert isinstance(users.hashes["bob"], BcryptHash) and users.hashes["bob"].cost == 4


@pytest.mark.parametrize("prefix", [b"2a", b"2b"])
def test_every_bcrypt_variant_apache_writes(prefix: bytes) -> None:
    digest = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4, prefix=prefix)).decode()
    assert parse_users(f"bob:{digest}\n", "f").verify("bob", "pw")


def test_only_the_first_72_bytes_count_as_in_apache() -> None:
    long = "x" * 72
    users = parse_users(entry("bob", long) + "\n", "f")
    assert users.verify("bob", long + "ignored by bcrypt")
    assert not users.verify("bob", long[:-1])


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("bob:$apr1$1ToSn.MZ$pqv/S2xyooUjVO4Y/81da.", "an MD5 ($apr1$) hash"),
        ("bob:{SHA}GpHWL3ymc5liWkNopqtdSjuqYHM=", "an unsalted SHA-1 ({SHA}) hash"),
        ("bob:t/aWM1D0d84ds", "expected NAME:scrypt:N:R:P:SALT:HASH (reshape users add) or"),
        ("bob:$2y$05$tooshort", "or NAME:$2y$COST$… (htpasswd -B)"),
        ("bob", "expected NAME:scrypt"),
        (":$2y$05$" + "a" * 53, "expected NAME:scrypt"),
    ],
)
def test_weak_or_broken_entries_are_refused_with_the_fix(line: str, message: str) -> None:
    with pytest.raises(UsersFileError, match="f line 2: ") as caught:
        parse_users(entry("alice", "pw") + "\n" + line + "\n", "f")
    assert message in str(caught.value)
    if message.endswith(" hash"):
        assert "htpasswd -B FILE bob" in str(caught.value)


def test_a_bcrypt_cost_beyond_htpasswds_is_refused() -> None:
    line = "bob:$2y$31$" + "a" * 53
    with pytest.raises(UsersFileError, match=r"f line 1: bcrypt cost out of range \(4-17\)"):
        parse_users(line + "\n", "f")


def test_one_format_per_file() -> None:
    scrypt = f"carol:{hash_password('pw', n=16, r=1, p=1).format()}"
    with pytest.raises(UsersFileError, match="a reshape entry in an htpasswd file"):
        parse_users(entry("bob", "pw") + "\n" + scrypt + "\n", "f")
    with pytest.raises(UsersFileError, match="expected NAME:scrypt"):
        parse_users(scrypt + "\n" + entry("bob", "pw") + "\n", "f")
    assert parse_users(scrypt + "\n", "f").format == "reshape"
    assert parse_users("# nothing yet\n", "f").format == "reshape"


def test_an_htpasswd_file_is_not_written_by_reshape() -> None:
    users = parse_users(entry("bob", "pw") + "\n", "f")
    for change in (
        lambda: users.with_user("carol", hash_password("pw", n=16, r=1, p=1)),
        lambda: users.without_user("bob"),
        lambda: format_users(users),
    ):
        with pytest.raises(UsersFileError, match=r"htpasswd file: manage it with htpasswd\(1\)"):
            change()


def test_an_ldap_users_file_names_its_directory_without_connecting() -> None:
    spec = "ldaps:ldap.corp.test:636:cn=proxy,dc=corp,dc=test:p4ss:ou=people,dc=corp,dc=test"
    users = parse_users(f"# the directory\n{spec}?search_filter_key=uid\n", "f")
    assert users.format == "ldap" and users.hashes == {} and users.directory is not None
    assert users.directory.spec.filter_key == "uid" and users.directory.spec.port == 636
    described = users.describe()
    assert described == "the LDAP directory ldaps://ldap.corp.test:636 (ou=people,dc=corp,dc=test)"
    assert "p4ss" not in described
    assert users.directory.spec.search_filter("a*)(uid=*") == r"(uid=a\2a\29\28uid=\2a)"
    assert not users.verify("", "x") and not users.verify("bob", "")  # never an anonymous bind
    with pytest.raises(UsersFileError, match="its users are managed there"):
        users.without_user("bob")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("ldap:host:onlythree\n", "f line 1: expected ldap[s]:HOST[:PORT]:BIND_DN"),
        ("ldapx:h:cn=a:pw:dc=b\n", "expected NAME:scrypt"),  # not LDAP: an htpasswd line
        ("ldap:h:cn=a:pw:dc=b\nldap:h2:cn=a:pw:dc=b\n", "f line 2: an LDAP users file has one"),
    ],
)
def test_bad_ldap_users_files(text: str, message: str) -> None:
    with pytest.raises(UsersFileError) as caught:
        parse_users(text, "f")
    assert message in str(caught.value)
