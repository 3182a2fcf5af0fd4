from __future__ import annotations

import stat
from pathlib import Path

import pytest
from cryptography import x509

from reshape.app.authority import CAError, init_ca, load_ca, paths, trust_instructions


def test_init_creates_a_private_key_file_and_reuses_it(tmp_path: Path) -> None:
    ca, created = init_ca(tmp_path / "conf")
    assert created
    assert stat.S_IMODE(ca.key_path.stat().st_mode) == 0o600
    again, created_again = init_ca(tmp_path / "conf")
    assert not created_again
    assert again.sha256_fingerprint == ca.sha256_fingerprint
    assert "reshape" in ca.subject


def test_cert_file_matches_and_holds_no_key(tmp_path: Path) -> None:
    ca, _ = init_ca(tmp_path)
    pem = ca.cert_path.read_bytes()
    assert b"PRIVATE KEY" not in pem and b"PRIVATE KEY" not in ca.cert_pem()
    assert x509.load_pem_x509_certificate(pem) == ca.certificate
    basic = ca.certificate.extensions.get_extension_for_class(x509.BasicConstraints)
    assert basic.value.ca


def test_fingerprint_format(tmp_path: Path) -> None:
    ca, _ = init_ca(tmp_path)
    parts = ca.sha256_fingerprint.split(":")
    assert len(parts) == 32 and all(len(p) == 2 for p in parts)


def test_missing_ca_says_how_to_create_it(tmp_path: Path) -> None:
    with pytest.raises(CAError, match="reshape ca init"):
        load_ca(tmp_path)


def test_group_readable_key_is_refused(tmp_path: Path) -> None:
    ca, _ = init_ca(tmp_path)
    ca.key_path.chmod(0o640)
    with pytest.raises(CAError, match="readable by group or others.*chmod 600"):
        load_ca(tmp_path)


def test_corrupt_key_is_refused(tmp_path: Path) -> None:
    key_path, _ = paths(tmp_path)
    key_path.write_text("not a key")
    key_path.chmod(0o600)
    with pytest.raises(CAError, match="is not a PEM key and certificate"):
        load_ca(tmp_path)


def test_key_that_is_a_directory_is_refused(tmp_path: Path) -> None:
    key_path, _ = paths(tmp_path)
    key_path.mkdir(mode=0o700)
    with pytest.raises(CAError):
        load_ca(tmp_path)


def test_uncreatable_confdir(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(CAError, match="cannot create the CA"):
        init_ca(blocker / "conf")


def test_trust_instructions_cover_browsers_and_os(tmp_path: Path) -> None:
    ca, _ = init_ca(tmp_path)
    text = trust_instructions(ca, "http://127.0.0.1:9464")
    for needle in (
        "Chromium",
        "Firefox",
        "update-ca-certificates",
        str(ca.cert_path),
        "http://127.0.0.1:9464/ca.pem",
    ):
        assert needle in text
