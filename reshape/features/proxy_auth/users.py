"""The users file for proxy authentication: parse, format, hash and verify — no sockets.

Two formats, told apart by the file's content:

- reshape's own (`reshape users add`): one line per user, `NAME:scrypt:N:R:P:SALT:HASH` (salt and
  hash in unpadded URL-safe base64). Only salted scrypt hashes are stored, never a password, each
  with its own random salt and cost parameters, so the cost can be raised later without
  invalidating old entries.
- an Apache htpasswd file of bcrypt entries (`htpasswd -B`: `NAME:$2y$COST$…`; `$2a$`, `$2b$`
  too), as Apache and mitmproxy's `proxyauth` read them; verified by the `bcrypt` library, which
  like Apache's reads the first 72 bytes of a password. Apache's other hashes (MD5 `$apr1$`,
  `{SHA}`, crypt) are refused with the line and the fix: they are fast to attack.

In both, `#` starts a comment. The file must be 0600 (refused if group or others can read it:
the hashes are slow to attack, not impossible); `reshape users add|remove` write only reshape's
format, and an htpasswd file is managed with htpasswd(1).

scrypt and bcrypt are slow on purpose (about 0.1 s and 0.003 s·2^(COST-5) here), so callers
verify off the event loop and remember successes (reshape/features/proxy_auth/addon.py).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import fcntl
import hashlib
import hmac
import os
import re
import secrets
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import bcrypt
from ldap3.core.exceptions import LDAPException

from reshape.base.atomic_files import write_atomically
from reshape.base.errors import UsageError
from reshape.base.secret_files import secret_file_problem
from reshape.features.proxy_auth.ldap import LdapDirectory, LdapSpec, LdapSpecError, is_ldap_spec

USERS_BASENAME = "users"
ALGORITHM = "scrypt"
# RFC 7914's interactive-login cost: 16 MiB of memory and ~0.1 s per verification here.
DEFAULT_N, DEFAULT_R, DEFAULT_P = 2**14, 8, 1
HASH_BYTES = 32
SALT_BYTES = 16
# Bounds on stored parameters, so that a damaged or hostile file cannot make one verification
# take minutes or gigabytes.
MAX_N, MAX_R, MAX_P = 2**17, 16, 4
MAX_PASSWORD_BYTES = 1024
# Basic auth (RFC 7617) cannot carry a ':' in the user name; names are also labels in logs.
NAME_PATTERN = re.compile(r"[A-Za-z0-9._@+-]{1,64}")

HEADER = "# reshape proxy users: NAME:scrypt:N:R:P:SALT:HASH (managed by `reshape users`)\n"

# htpasswd: Apache's `htpasswd -B` writes $2y$; cost 4-17 is what it accepts (-C), and bounds the
# time a hostile file can make one verification take.
BCRYPT_PATTERN = re.compile(r"\$2[aby]\$(\d\d)\$[./A-Za-z0-9]{53}")
BCRYPT_MAX_COST = 17
BCRYPT_PASSWORD_BYTES = 72  # bcrypt reads no more; Apache's implementation ignores the rest too
HTPASSWD_NAME_BYTES = 255
# Apache's other htpasswd hashes, by prefix: refused, each with what it is.
WEAK_HTPASSWD = {"$apr1$": "an MD5 ($apr1$)", "{SHA}": "an unsalted SHA-1 ({SHA})"}

Format = Literal["reshape", "htpasswd", "ldap"]
EXPECTED = (
    "expected NAME:scrypt:N:R:P:SALT:HASH (reshape users add) or NAME:$2y$COST$… (htpasswd -B)"
)


class UsersFileError(UsageError):
    """The users file is missing, unreadable, exposed or malformed; the message says which."""


@dataclass(frozen=True)
class PasswordHash:
    n: int
    r: int
    p: int
    salt: bytes
    digest: bytes

    def verify(self, password: str) -> bool:
        """Whether `password` hashes to this digest (compared in constant time)."""
        return hmac.compare_digest(
            _scrypt(password, self.salt, self.n, self.r, self.p), self.digest
        )

    def format(self) -> str:
        return ":".join(
            (ALGORITHM, str(self.n), str(self.r), str(self.p), _b64(self.salt), _b64(self.digest))
        )


@dataclass(frozen=True)
class BcryptHash:
    """One htpasswd bcrypt entry, as written (`$2y$05$…`)."""

    text: str

    @property
    def cost(self) -> int:
        return int(self.text[4:6])

    def verify(self, password: str) -> bool:
        # bcrypt 5 refuses longer passwords instead of reading their first 72 bytes as Apache
        # does; the same 72 bytes are checked here.
        data = password.encode()[:BCRYPT_PASSWORD_BYTES]
        return bcrypt.checkpw(data, self.text.encode())

    def format(self) -> str:
        return self.text


Credential = PasswordHash | BcryptHash

# Verifying an unknown user against one of these keeps the time of a failure the same whether or
# not the name exists, so response times do not tell which names are users.
_DUMMY: PasswordHash | None = None
_DUMMY_BCRYPT: dict[int, BcryptHash] = {}


def hash_password(
    password: str, n: int = DEFAULT_N, r: int = DEFAULT_R, p: int = DEFAULT_P
) -> PasswordHash:
    check_password(password)
    salt = secrets.token_bytes(SALT_BYTES)
    return PasswordHash(n, r, p, salt, _scrypt(password, salt, n, r, p))


def check_name(name: str) -> None:
    if not NAME_PATTERN.fullmatch(name):
        raise UsersFileError(
            f"user name {name!r} is not allowed: use 1-64 letters, digits and . _ @ + -"
        )


def check_password(password: str) -> None:
    if not password:
        raise UsersFileError("the password is empty")
    if len(password.encode()) > MAX_PASSWORD_BYTES:
        raise UsersFileError(f"the password is longer than {MAX_PASSWORD_BYTES} bytes")


@dataclass(frozen=True)
class Users:
    """The users of one file, by name, and the file's format; or the LDAP directory it names."""

    hashes: Mapping[str, Credential]
    format: Format = "reshape"
    directory: LdapDirectory | None = None

    def describe(self) -> str:
        if self.directory is not None:
            return f"the LDAP directory {self.directory.spec}"
        return f"{len(self.hashes)} users"

    def verify(self, name: str, password: str) -> bool:
        """Whether `name` is a user with `password`. Unknown names cost as much as known ones."""
        if self.directory is not None:
            return self.directory.verify(name, password)
        known = self.hashes.get(name)
        if known is None:
            self._dummy().verify(password)
            return False
        return known.verify(password)

    def _dummy(self) -> Credential:
        global _DUMMY
        if self.format == "htpasswd":
            costs = [h.cost for h in self.hashes.values() if isinstance(h, BcryptHash)]
            cost = max(costs, default=5)
            if cost not in _DUMMY_BCRYPT:
                salt = bcrypt.gensalt(rounds=cost, prefix=b"2b")
                _DUMMY_BCRYPT[cost] = BcryptHash(bcrypt.hashpw(b"no-such-user", salt).decode())
            return _DUMMY_BCRYPT[cost]
        if _DUMMY is None:
            _DUMMY = hash_password("reshape-no-such-user")
        return _DUMMY

    def with_user(self, name: str, password_hash: PasswordHash) -> Users:
        self.check_writable()
        check_name(name)
        return Users({**self.hashes, name: password_hash})

    def without_user(self, name: str) -> Users:
        self.check_writable()
        return Users({k: v for k, v in self.hashes.items() if k != name})

    def check_writable(self) -> None:
        if self.format == "htpasswd":
            raise UsersFileError(
                "this is an htpasswd file: manage it with htpasswd(1), e.g. htpasswd -B FILE NAME"
            )
        if self.directory is not None:
            raise UsersFileError(f"this file names {self.describe()}: its users are managed there")


def parse_users(text: str, source: str) -> Users:
    """The users in `text`, in whichever format its first entry is; a UsersFileError names the
    source, the line and what is wrong."""
    entries = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if line and not line.startswith("#"):
            entries.append((f"{source} line {number}", line))
    if entries and is_ldap_spec(entries[0][1]):
        return _ldap_users(entries)
    file_format: Format = "reshape"
    if entries and not entries[0][1].partition(":")[2].startswith(ALGORITHM + ":"):
        file_format = "htpasswd"
    hashes: dict[str, Credential] = {}
    for where, line in entries:
        name, sep, rest = line.partition(":")
        if file_format == "reshape":
            if not sep:
                raise UsersFileError(f"{where}: expected NAME:scrypt:N:R:P:SALT:HASH")
            try:
                check_name(name)
            except UsersFileError as e:
                raise UsersFileError(f"{where}: {e}") from None
            credential: Credential = _parse_hash(rest, where)
        else:
            if not sep or not name or len(name.encode()) > HTPASSWD_NAME_BYTES:
                raise UsersFileError(f"{where}: {EXPECTED}")
            credential = _parse_bcrypt(name, rest, where)
        if name in hashes:
            raise UsersFileError(f"{where}: user {name!r} appears twice")
        hashes[name] = credential
    return Users(hashes, file_format)


def _ldap_users(entries: list[tuple[str, str]]) -> Users:
    """The users of the LDAP directory the file's one entry names (ldap.py)."""
    (where, line), *others = entries
    if others:
        raise UsersFileError(f"{others[0][0]}: an LDAP users file has one entry, the directory")
    try:
        spec = LdapSpec.parse(line)
    except LdapSpecError as e:
        raise UsersFileError(f"{where}: {e}") from None
    return Users({}, "ldap", LdapDirectory(spec))


def _parse_bcrypt(name: str, text: str, where: str) -> BcryptHash:
    if text.startswith(ALGORITHM + ":"):
        raise UsersFileError(f"{where}: a reshape entry in an htpasswd file; keep one format")
    weak = next((what for prefix, what in WEAK_HTPASSWD.items() if text.startswith(prefix)), None)
    if weak is not None:
        raise UsersFileError(
            f"{where}: user {name!r} has {weak} hash; reshape reads bcrypt htpasswd entries "
            f"only: set the password again with htpasswd -B FILE {name}"
        )
    match = BCRYPT_PATTERN.fullmatch(text)
    if match is None:
        raise UsersFileError(f"{where}: {EXPECTED}")
    if not 4 <= int(match.group(1)) <= BCRYPT_MAX_COST:
        raise UsersFileError(f"{where}: bcrypt cost out of range (4-{BCRYPT_MAX_COST})")
    return BcryptHash(text)


def format_users(users: Users) -> str:
    users.check_writable()
    return HEADER + "".join(f"{name}:{h.format()}\n" for name, h in sorted(users.hashes.items()))


def _parse_hash(text: str, where: str) -> PasswordHash:
    fields = text.split(":")
    if len(fields) != 6 or fields[0] != ALGORITHM:
        raise UsersFileError(f"{where}: expected NAME:scrypt:N:R:P:SALT:HASH")
    try:
        n, r, p = (int(f) for f in fields[1:4])
    except ValueError:
        raise UsersFileError(f"{where}: N, R and P must be whole numbers") from None
    if not (2 <= n <= MAX_N and n & (n - 1) == 0 and 1 <= r <= MAX_R and 1 <= p <= MAX_P):
        raise UsersFileError(
            f"{where}: scrypt parameters out of range (N a power of 2 up to {MAX_N}, "
            f"R 1-{MAX_R}, P 1-{MAX_P})"
        )
    try:
        salt, digest = _unb64(fields[4]), _unb64(fields[5])
    except (binascii.Error, ValueError):
        raise UsersFileError(f"{where}: salt and hash must be base64") from None
    if len(salt) < 8 or len(digest) < 16:
        raise UsersFileError(f"{where}: salt or hash too short")
    return PasswordHash(n, r, p, salt, digest)


def default_users_path(confdir: Path) -> Path:
    return confdir / USERS_BASENAME


@dataclass(frozen=True)
class FileStamp:
    """What tells that a file changed: replaced (inode), rewritten (size, mtime)."""

    inode: int
    size: int
    mtime_ns: int


def stamp_of(path: Path) -> FileStamp | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return FileStamp(st.st_ino, st.st_size, st.st_mtime_ns)


def load_users(path: Path) -> Users:
    """Read and check the users file: it must exist, be a regular file, and not be readable by
    group or others."""
    try:
        with path.open("rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            raw = f.read()
    except FileNotFoundError:
        raise UsersFileError(
            f"no users file {path} (create one with: reshape users add NAME --users {path})"
        ) from None
    except OSError as e:
        raise UsersFileError(f"cannot read users file {path}: {e.strerror or e}") from None
    problem = secret_file_problem("users file", path, mode)
    if problem is not None:
        raise UsersFileError(problem)
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise UsersFileError(f"users file {path} is not UTF-8 text") from None
    return parse_users(text, str(path))


def load_or_empty(path: Path) -> Users:
    return load_users(path) if path.exists() else Users({})


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock for a read-modify-write of `path`, so two `reshape users` commands
    at once do not lose one's change. The lock is a side file: `path` itself is replaced."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    lock_path = path.with_name(path.name + ".lock")
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as e:
        raise UsersFileError(f"cannot lock users file {path}: {e.strerror or e}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def save_users(path: Path, users: Users) -> None:
    """Write the file whole, 0600, replacing the old one atomically: a reader sees the old or the
    new file, never half of one."""
    try:
        write_atomically(path, format_users(users).encode(), mode=0o600)
    except OSError as e:
        raise UsersFileError(f"cannot write users file {path}: {e.strerror or e}") from None


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    # scrypt needs about 128·N·R bytes (plus 128·R·P); OpenSSL's default limit (32 MiB) refuses
    # the default cost once its overhead is added, so allow twice the need.
    maxmem = 2 * 128 * r * (n + p) + (1 << 20)
    return hashlib.scrypt(
        password.encode(), salt=salt, n=n, r=r, p=p, dklen=HASH_BYTES, maxmem=maxmem
    )


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)


def users_for_run(path: Path) -> Users:
    """The users `reshape run --users` authenticates against: the file checked, and not empty
    (authentication with no users would refuse everyone)."""
    users = load_users(path)
    if users.directory is not None:
        try:
            users.directory.check()
        except LDAPException as e:
            raise UsersFileError(
                f"users file {path}: cannot bind to {users.describe()}: {e}"
            ) from None
        return users
    if not users.hashes:
        raise UsersFileError(
            f"users file {path} has no users: nobody could use the proxy "
            f"(add one with: reshape users add NAME --users {path})"
        )
    return users
