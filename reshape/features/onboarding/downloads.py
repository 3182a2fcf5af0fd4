"""The interception CA's certificate in the three forms devices import: PEM, DER (.cer), PKCS#12.

Certificate only, never the key. mitmproxy's onboarding serves the same three (its `.cer` holds
PEM text; here it is DER, which every importer that takes `.cer` reads, Windows' and Android's
included). The forms are made once from the certificate in memory, so a confdir that lacks
mitmproxy's side files (`mitmproxy-ca-cert.p12`, …) serves them all the same.
"""

from __future__ import annotations

from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.serialization import pkcs12

FILE_STEM = "reshape-ca-cert"
FRIENDLY_NAME = b"reshape interception CA"


@dataclass(frozen=True)
class Download:
    """One form of the certificate: its bytes, media type and the file name offered."""

    body: bytes
    content_type: str
    filename: str


@dataclass(frozen=True)
class CaDownloads:
    """The certificate by form (`pem`, `cer`, `p12`), with what a user checks it by."""

    forms: dict[str, Download]
    sha256_fingerprint: str
    subject: str

    @classmethod
    def of(cls, certificate: x509.Certificate) -> CaDownloads:
        pem = certificate.public_bytes(serialization.Encoding.PEM)
        der = certificate.public_bytes(serialization.Encoding.DER)
        p12 = pkcs12.serialize_key_and_certificates(
            name=FRIENDLY_NAME,
            key=None,
            cert=certificate,
            cas=None,
            encryption_algorithm=serialization.NoEncryption(),
        )
        # application/x-x509-ca-cert is what Android, iOS Safari and Windows offer to install.
        forms = {
            "pem": Download(pem, "application/x-x509-ca-cert", f"{FILE_STEM}.pem"),
            "cer": Download(der, "application/x-x509-ca-cert", f"{FILE_STEM}.cer"),
            "p12": Download(p12, "application/x-pkcs12", f"{FILE_STEM}.p12"),
        }
        digest = certificate.fingerprint(hashes.SHA256())
        return cls(
            forms,
            ":".join(f"{b:02X}" for b in digest),
            certificate.subject.rfc4514_string(),
        )
