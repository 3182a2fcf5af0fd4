"""A throw-away PKI for origin servers on loopback, made with trustme.

The origins' CA is deliberately separate from reshape's interception CA: the proxy must be told to
trust it (`reshape run --upstream-ca`), just as an operator would for internal sites. Servers
(nginx, hypercorn) and clients (curl, Chromium's NSS database) read it from files, so every
certificate and key is written to the PKI's directory.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

import trustme

_VALIDITY = datetime.timedelta(days=30)


@dataclass(frozen=True)
class IssuedCert:
    cert_path: Path
    key_path: Path


class OriginPKI:
    """A CA in `directory` (its certificate in `ca_cert_path`) that issues server certificates
    for loopback hosts."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._ca = trustme.CA(organization_name="reshape test origins")
        self.ca_cert_path = directory / "origins-ca.pem"
        self._ca.cert_pem.write_to_path(str(self.ca_cert_path))

    def issue(self, hosts: list[str], name: str | None = None) -> IssuedCert:
        """A server certificate valid for `hosts` (IP addresses or DNS names), written as
        `<name>.crt.pem` (the leaf, then the CA: the chain nginx and hypercorn serve) and
        `<name>.key.pem` (mode 0600); `name` defaults to the first host."""
        now = datetime.datetime.now(datetime.UTC)
        leaf = self._ca.issue_cert(
            *hosts,
            common_name=hosts[0],
            not_before=now - datetime.timedelta(hours=1),
            not_after=now + _VALIDITY,
        )
        stem = name or hosts[0].replace(":", "_")
        cert_path = self.directory / f"{stem}.crt.pem"
        key_path = self.directory / f"{stem}.key.pem"
        cert_path.write_bytes(
            b"".join(blob.bytes() for blob in leaf.cert_chain_pems) + self._ca.cert_pem.bytes()
        )
        leaf.private_key_pem.write_to_path(str(key_path))
        key_path.chmod(0o600)
        return IssuedCert(cert_path, key_path)
