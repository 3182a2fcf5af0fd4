"""HTTP/2 conformance of reshape's client side: h2spec (all 145 cases: generic, http2, hpack)
through a CONNECT tunnel, against reshape with policy {} and with a pooled policy, an nginx h2
origin behind. Plain mitmproxy 12.2.3 passes 144: http2/4.2/3 (a HEADERS frame above the
protocol's default SETTINGS_MAX_FRAME_SIZE must be a FRAME_SIZE_ERROR) is fixed by
reshape/mitm/patches/http2_frame_size.py (issue 15, finding 13).

h2spec is built by `make test-deps` (`go install`, into .venv/bin)."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from labkit.origins import nginx_origin
from labkit.pki import OriginPKI
from tests.support.connect_shim import ConnectShim
from tests.support.reshape_process import StartProxy

POLICIES = {
    "direct": "version: 1\ndefault: p\npolicies:\n  p: {}\n",
    "pooled": "version: 1\ndefault: p\npolicies:\n  p:\n    upstream: {}\n",
}
H2SPEC = Path(sys.executable).parent / "h2spec"
CASES = 145  # h2spec 2.2.1: generic 44, http2 94, hpack 7 (its server tests)


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
def test_h2spec_passes_every_case(
    start_reshape: StartProxy, tmp_path: Path, origin_pki: OriginPKI, policy: str
) -> None:
    if not H2SPEC.exists():
        pytest.fail(f"{H2SPEC} is missing: run `make test-deps` (go install of h2spec)")
    policy_path = tmp_path / "policy.yaml"
    policy_path.write_text(POLICIES[policy])
    proxy = start_reshape(policy=policy_path)
    host, port = proxy.listen.split(":")
    root = tmp_path / "www"
    root.mkdir()
    (root / "index.html").write_text("hello\n")
    report = tmp_path / "h2spec.xml"
    with (
        nginx_origin(
            root, "127.0.0.73", tls=origin_pki.issue(["127.0.0.73"]), http2=True
        ) as origin,
        ConnectShim((host, int(port)), f"{origin.host}:{origin.port}") as shim,
    ):
        result = subprocess.run(
            # -t TLS, -k: the certificate is reshape's own CA's; -o: seconds per case.
            [str(H2SPEC), "-t", "-k", "-h", shim.host, "-p", str(shim.port), "-o", "10"]
            + ["-j", str(report)],
            capture_output=True,
            text=True,
            timeout=900,
        )
    failures = result.stdout.partition("Failures:")[2] or result.stdout[-3000:]
    suites = ElementTree.parse(report).getroot().findall("testsuite")
    counts = {
        key: sum(int(suite.get(key, "0")) for suite in suites)
        for key in ("tests", "failures", "errors", "skipped")
    }
    assert counts == {"tests": CASES, "failures": 0, "errors": 0, "skipped": 0}, failures
    assert result.returncode == 0, failures
    assert "mitmproxy has crashed" not in proxy.log()
