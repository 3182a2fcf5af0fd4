"""PolicyChooser through `reshape run`: a client that keeps its cookie stays in its arm. Without
sockets: tests/unit/policy/test_chooser.py."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from labkit.origins import nginx_origin
from reshape.policy.chooser import UNIT_COOKIE
from tests.support.reshape_process import StartProxy


@pytest.mark.slow
def test_curl_with_a_cookie_jar_stays_in_its_arm(start_reshape: StartProxy, tmp_path: Path) -> None:
    root = tmp_path / "www"
    root.mkdir()
    (root / "page.txt").write_text("hello")
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "version: 1\ndefault: baseline\npolicies: {baseline: {}, capped: {}}\n"
        "experiments:\n  - name: trial\n    unit: cookie\n    arms:\n"
        "      control: {policy: baseline, weight: 50}\n"
        "      treatment: {policy: capped, weight: 50}\n"
    )
    log = tmp_path / "requests.jsonl"
    proxy = start_reshape("--request-log", str(log), policy=policy)
    with nginx_origin(root, "127.0.0.2") as origin:
        url = f"http://{origin.host}:{origin.port}/page.txt"
        arms_by_user = []
        for user in range(6):
            jar = tmp_path / f"jar{user}"
            for _ in range(3):  # a new connection each time: only the cookie ties them
                result = subprocess.run(
                    [
                        "curl",
                        "-sS",
                        "-c",
                        str(jar),
                        "-b",
                        str(jar),
                        "--proxy",
                        proxy.proxy_url,
                        url,
                    ],
                    capture_output=True,
                    timeout=30,
                )
                assert result.stdout == b"hello"
            arms_by_user.append(jar.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(log.read_text().splitlines()) < 18:
        time.sleep(0.2)
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(records) == 18
    for user in range(6):
        arms = {r["arm"] for r in records[3 * user : 3 * user + 3]}
        assert len(arms) == 1 and arms.pop().startswith("trial:"), records
        assert UNIT_COOKIE in arms_by_user[user]  # curl kept the cookie reshape set
