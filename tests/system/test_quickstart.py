"""Done-when: the README's quick-start commands, verbatim, against `make run` on a clean checkout;
and `reshape run` with no flags from another directory.

The checkout is a fresh clone of this commit and HOME a temporary directory, so `~/.reshape` is
the test's own. `make run` and the README's commands use the fixed ports 8080 and 9464, which other
test runs on this machine may hold: they run in a network namespace of their own (`unshare -n`,
which needs root), where those ports are free and nobody else's. A namespace has no route to the
package registry, so the one step of `make run` that needs it, `make venv`, runs first, outside;
`make run` then finds the venv made and goes on as on any first run.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from tests.support.reshape_process import REPO

pytestmark = pytest.mark.slow

README = REPO / "README.md"


def quick_start() -> tuple[str, list[str]]:
    """The README's quick start: the command that starts the proxy, and the try-it commands."""
    text = README.read_text()
    section = text[text.index("## Quick start") :]
    section = section[: section.index("\n## ", 1)]
    blocks = re.findall(r"```console\n(.*?)```", section, re.S)
    start, tries = ([line for line in b.splitlines() if line.strip()] for b in blocks[:2])
    assert len(start) == 1 and start[0].startswith("make run")
    return start[0], tries


def clean_checkout(destination: Path) -> Path:
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout: nothing to clone")
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    subprocess.run(
        ["git", "clone", "--quiet", "--no-checkout", str(REPO), str(destination)], check=True
    )
    subprocess.run(
        ["git", "-C", str(destination), "checkout", "--quiet", "--detach", commit], check=True
    )
    return destination


def stop_leftovers(directory: Path) -> None:
    """Kill what a failed run left behind: every process started from `directory`."""
    marker = str(directory).encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker in (entry / "cmdline").read_bytes():
                    os.kill(int(entry.name), signal.SIGKILL)
            except (OSError, ProcessLookupError):
                continue


def test_readme_quick_start_verbatim_against_make_run(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("a network namespace of its own (unshare -n) needs root")
    start, tries = quick_start()
    checkout = clean_checkout(tmp_path / "checkout")
    home, user = tmp_path / "home", tmp_path / "user"
    home.mkdir()
    user.mkdir()
    environment = {
        **os.environ,
        "HOME": str(home),
        # HOME moved: keep pip's download cache where it was (the registry is asked the same).
        "PIP_CACHE_DIR": os.environ.get("PIP_CACHE_DIR", str(Path.home() / ".cache" / "pip")),
    }
    for name in ("VIRTUAL_ENV", "PYTHONPATH", "RESHAPE_LISTEN", "RESHAPE_ADMIN"):
        environment.pop(name, None)
    environment["PATH"] = os.pathsep.join(
        p for p in environment["PATH"].split(os.pathsep) if ".venv" not in p
    )
    venv = subprocess.run(
        ["make", "venv"], cwd=checkout, env=environment, capture_output=True, text=True, timeout=900
    )
    assert venv.returncode == 0, venv.stdout + venv.stderr

    commands = "\n".join(
        f"echo '>>> {i}'; bash -o pipefail -c {shlex.quote(line)}; echo \"<<< {i} $?\""
        for i, line in enumerate(tries)
    )
    script = f"""
ip link set lo up
healthy() {{
  for i in $(seq 300); do curl -fs 127.0.0.1:9464/healthz >/dev/null && return 0; sleep 0.2; done
  return 1
}}
set -m  # the proxy in a process group of its own, to stop make and reshape together
cd {shlex.quote(str(checkout))}
bash -c {shlex.quote(start)} > {tmp_path}/make-run.log 2>&1 &
runner=$!
healthy || {{ echo 'make run never became healthy'; kill -TERM -- -$runner; exit 20; }}
cd {shlex.quote(str(user))}
{commands}
kill -TERM -- -$runner; wait $runner

# `reshape run` with no flags, from a directory that is not the checkout.
mkdir -p {tmp_path}/elsewhere && cd {tmp_path}/elsewhere
{checkout}/.venv/bin/reshape run > {tmp_path}/bare.log 2>&1 &
bare=$!
healthy || {{ echo 'reshape run never became healthy'; kill -TERM $bare; exit 21; }}
curl -fsS -x 127.0.0.1:8080 -o /dev/null -w 'bare %{{http_code}}\\n' http://reshape.internal/
kill -TERM $bare; wait $bare; echo "bare exit $?"
"""
    try:
        result = subprocess.run(
            ["unshare", "-n", "bash", "-c", script],
            env=environment,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        stop_leftovers(tmp_path)
    logs = "".join(
        f"--- {p.name}\n{p.read_text(errors='replace')}" for p in sorted(tmp_path.glob("*.log"))
    )
    transcript = result.stdout + result.stderr + logs
    assert result.returncode == 0, transcript
    for i, line in enumerate(tries):
        status = re.search(rf"^<<< {i} (\d+)$", result.stdout, re.M)
        assert status and status[1] == "0", f"README command failed: {line}\n{transcript}"
    output = {
        i: result.stdout.split(f">>> {i}\n", 1)[1].split(f"<<< {i} ", 1)[0]
        for i in range(len(tries))
    }
    assert "<title>reshape: install the CA</title>" in output[0]
    assert (user / "reshape-ca.pem").read_text().startswith("-----BEGIN CERTIFICATE-----")
    assert output[2].strip() in ("200 2", "200 1.1")  # intercepted HTTPS, verified by curl
    assert re.search(r"^reshape_requests_total\{.*\} [1-9]", output[3], re.M)
    assert (home / ".reshape" / "mitmproxy-ca.pem").exists()  # make run's CA, in HOME
    assert "bare 200" in result.stdout and "bare exit 0" in result.stdout, transcript
    assert "stopped" in (tmp_path / "make-run.log").read_text()  # drained, not killed
