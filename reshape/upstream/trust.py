"""The CA bundle reshape verifies origins against: the system store plus `--upstream-ca`."""

from __future__ import annotations

from pathlib import Path

import certifi
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from reshape.base.atomic_files import write_atomically
from reshape.base.errors import ReshapeError, UsageError

# Debian's and most distributions' merged system store; certifi's bundle where there is none.
SYSTEM_BUNDLES = (
    Path("/etc/ssl/certs/ca-certificates.crt"),
    Path("/etc/pki/tls/certs/ca-bundle.crt"),
)


def system_bundle() -> Path:
    for path in SYSTEM_BUNDLES:
        if path.is_file():
            return path
    return Path(certifi.where())


def read_extra_cas(path: Path) -> bytes:
    """The PEM certificates in `path`; a UsageError if it holds none or cannot be read."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise UsageError(f"--upstream-ca {path}: cannot read: {e.strerror or e}") from None
    try:
        certificates = x509.load_pem_x509_certificates(raw)
    except ValueError:
        raise UsageError(f"--upstream-ca {path}: no PEM certificates in it") from None
    return b"".join(c.public_bytes(Encoding.PEM) for c in certificates)


def write_trust_bundle(confdir: Path, extra: Path | None) -> Path:
    """The bundle to verify origins with: the system store, or confdir/upstream-trust.pem
    (system store + `extra`) when extra CAs are given. Replaced in one rename: another process
    starting on the same confdir may be reading it."""
    if extra is None:
        return system_bundle()
    extra_pem = read_extra_cas(extra)
    bundle = confdir / "upstream-trust.pem"
    try:
        system = system_bundle().read_bytes()
        write_atomically(bundle, system.rstrip(b"\n") + b"\n" + extra_pem)
    except OSError as e:
        raise ReshapeError(f"cannot write {bundle}: {e.strerror or e}") from None
    return bundle
