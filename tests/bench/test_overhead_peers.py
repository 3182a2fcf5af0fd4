"""bench/overhead/peers.py: a proxy's set-up step that fails or hangs is the bench's one-line
error (ProxyStartError, which every bench turns into status 1), not a traceback."""

from __future__ import annotations

import sys

import pytest

from bench.overhead import peers
from bench.overhead.peers import ProxyStartError


def test_a_step_that_hangs_is_a_start_error_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peers, "SET_UP_SECONDS", 0.5)
    with pytest.raises(ProxyStartError, match=r"reshape ca init did not finish within 0.5 s"):
        peers._set_up("reshape ca init", [sys.executable, "-c", "import time; time.sleep(30)"])


def test_a_step_that_fails_is_a_start_error_with_its_output() -> None:
    with pytest.raises(ProxyStartError, match=r"exited with status 3\nout\nerr") as failed:
        peers._set_up(
            "squid's certificate database",
            [
                sys.executable,
                "-c",
                "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)",
            ],
        )
    assert "squid's certificate database" in str(failed.value)
