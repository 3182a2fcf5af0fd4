"""The interception CA: create it once, load and check it at start-up, describe how to trust it.

The files are mitmproxy's own (`mitmproxy-ca.pem` = key + certificate, `mitmproxy-ca-cert.pem` =
certificate only), so mitmproxy's tlsconfig addon uses the same CA from the same confdir.

Several processes may start on one confdir at once: the CA is created under a lock (the first
creates it, the others load it) and its files appear whole, each by one rename, the key file
(whose presence means "there is a CA") last.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from mitmproxy.certs import CertStore

from reshape.base.atomic_files import exclusive, write_atomically
from reshape.base.errors import ReshapeError
from reshape.base.secret_files import secret_file_problem

BASENAME = "mitmproxy"
KEY_SIZE = 2048


class CAError(ReshapeError):
    """The CA is missing, unreadable, malformed or exposed."""


@dataclass(frozen=True)
class CertificateAuthority:
    key_path: Path  # key + certificate; never served, mode 0600
    cert_path: Path  # certificate only; what browsers trust
    certificate: x509.Certificate

    @property
    def sha256_fingerprint(self) -> str:
        digest = self.certificate.fingerprint(hashes.SHA256())
        return ":".join(f"{b:02X}" for b in digest)

    @property
    def subject(self) -> str:
        return self.certificate.subject.rfc4514_string()

    def cert_pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)


def paths(confdir: Path) -> tuple[Path, Path]:
    return confdir / f"{BASENAME}-ca.pem", confdir / f"{BASENAME}-ca-cert.pem"


def init_ca(confdir: Path) -> tuple[CertificateAuthority, bool]:
    """Create the CA in `confdir`, or reuse the one there. Returns (ca, created)."""
    key_path, _ = paths(confdir)
    created = False
    if not key_path.exists():
        try:
            confdir.mkdir(parents=True, exist_ok=True, mode=0o700)
            with exclusive(confdir / f".{BASENAME}-ca.lock"):
                if not key_path.exists():  # not created by another process while we waited
                    _create_ca(confdir)
                    created = True
        except OSError as e:
            raise CAError(f"cannot create the CA in {confdir}: {e.strerror or e}") from None
    return load_ca(confdir), created


def _create_ca(confdir: Path) -> None:
    """mitmproxy's CA files (key, certificates, PKCS12 and DER forms, DH parameters), written by
    mitmproxy into a private directory beside them and moved into `confdir` one rename each."""
    staging = Path(tempfile.mkdtemp(prefix=f".{BASENAME}-ca.", dir=confdir))
    try:
        CertStore.create_store(
            staging, BASENAME, KEY_SIZE, organization="reshape", cn="reshape interception CA"
        )
        key_name = paths(staging)[0].name
        for made in sorted(staging.iterdir(), key=lambda p: p.name == key_name):
            with made.open("rb") as f:
                os.fsync(f.fileno())
            os.replace(made, confdir / made.name)
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(staging)


def load_ca(confdir: Path) -> CertificateAuthority:
    """Load and check the CA; a CAError says exactly what is wrong with which file."""
    key_path, cert_path = paths(confdir)
    if not key_path.exists():
        raise CAError(f"no CA in {confdir} (run: reshape ca init --confdir {confdir})")
    try:
        mode = key_path.stat().st_mode
        raw = key_path.read_bytes()
    except OSError as e:
        raise CAError(f"cannot read CA key {key_path}: {e.strerror or e}") from None
    problem = secret_file_problem("CA key", key_path, mode)
    if problem is not None:
        raise CAError(problem)
    try:
        serialization.load_pem_private_key(raw, password=None)
        certificates = x509.load_pem_x509_certificates(raw)
    except (ValueError, TypeError) as e:
        raise CAError(f"CA file {key_path} is not a PEM key and certificate: {e}") from None
    certificate = certificates[0]
    if not cert_path.exists():
        # mitmproxy derives this one from the key file; recreate it if someone removed it.
        try:
            write_atomically(cert_path, certificate.public_bytes(serialization.Encoding.PEM))
        except OSError as e:
            raise CAError(f"cannot write {cert_path}: {e.strerror or e}") from None
    return CertificateAuthority(key_path, cert_path, certificate)


def trust_instructions(ca: CertificateAuthority, admin_url: str | None = None) -> str:
    """How to make browsers and the OS trust the CA, for `reshape ca show`."""
    cert = ca.cert_path
    download = f"\n  (or download it from {admin_url}/ca.pem)" if admin_url else ""
    return f"""\
Trust this CA so browsers accept intercepted HTTPS:{download}

Chromium / Chrome on Linux (NSS database):
  certutil -d sql:$HOME/.pki/nssdb -A -t "C,," -n reshape -i {cert}
  or Settings → Privacy and security → Security → Manage certificates → Authorities → Import

Firefox (its own store):
  Settings → Privacy & Security → Certificates → View Certificates → Authorities → Import,
  tick "Trust this CA to identify websites"; or for a profile directory PROFILE:
  certutil -d sql:PROFILE -A -t "C,," -n reshape -i {cert}

Operating system store:
  Debian/Ubuntu: cp {cert} /usr/local/share/ca-certificates/reshape.crt && update-ca-certificates
  macOS:         security add-trusted-cert -d -r trustRoot \\
                   -k /Library/Keychains/System.keychain {cert}
  Windows:       certutil -addstore -f ROOT {cert}

Remove the CA from every store when you stop using reshape: whoever holds its key
can impersonate any site to these browsers."""
