"""Done-when of the one-package layout: the wheel installs into a fresh virtualenv next to
proxy.py (whose import name is `proxy`, as reshape's used to be) without breaking either, and
from a directory outside the checkout `reshape --version`, `python -m reshape --version` and
`reshape run` with no `--policy` (the policy shipped in the package) work and serve a request.

The wheel is built from this checkout (build isolation fetches setuptools from the package
registry, as any build does); reshape's dependencies come from requirements.lock, proxy.py with
no dependencies of its own pulled in.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from labkit import processes
from labkit.origins import Origin
from tests.support.reshape_process import REPO

pytestmark = pytest.mark.slow

PROXY_PY = "proxy.py==2.4.10"


def run(argv: list[str | Path], cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"{argv}: {done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture
def site_root(tmp_path: Path) -> Path:
    root = tmp_path / "site"
    root.mkdir()
    (root / "blob.bin").write_bytes(b"x" * 1000)
    return root


def test_the_wheel_installs_beside_proxy_py_and_runs_from_anywhere(
    tmp_path: Path, http_origin: Origin
) -> None:
    wheels, venv, elsewhere = tmp_path / "wheels", tmp_path / "venv", tmp_path / "elsewhere"
    elsewhere.mkdir()
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    run([*pip, "wheel", "--no-deps", "-w", wheels, REPO], cwd=tmp_path)
    [wheel] = wheels.glob("reshape-*.whl")
    run([sys.executable, "-m", "venv", venv], cwd=tmp_path)
    python = venv / "bin" / "python"
    venv_pip = [python, "-m", "pip", "--disable-pip-version-check", "-q", "install", "--no-deps"]
    run([*venv_pip, "-r", REPO / "requirements.lock"], cwd=tmp_path)
    run([*venv_pip, wheel, PROXY_PY], cwd=tmp_path)

    env = {**os.environ, "HOME": str(tmp_path / "home")}
    env.pop("PYTHONPATH", None)  # nothing of the checkout: only what the venv installed
    version = run([venv / "bin" / "reshape", "--version"], cwd=elsewhere, env=env)
    assert version.startswith("reshape ")
    assert run([python, "-m", "reshape", "--version"], cwd=elsewhere, env=env) == version
    # Both packages import, each as itself.
    places = run(
        [python, "-c", "import proxy, reshape; print(proxy.__file__); print(reshape.__file__)"],
        cwd=elsewhere,
        env=env,
    ).split()
    assert all(str(venv) in place for place in places)
    assert places[0].endswith("proxy/__init__.py") and "reshape" in places[1]

    listen, admin = processes.free_port(), processes.free_port()
    log = tmp_path / "reshape.log"
    argv = [
        venv / "bin" / "reshape",
        "run",
        "--listen",
        f"127.0.0.1:{listen}",
        "--admin",
        f"127.0.0.1:{admin}",
    ]
    with processes.running(
        "reshape (from the wheel)",
        [str(a) for a in argv],
        log=log,
        is_ready=lambda: processes.accepts("127.0.0.1", listen),
        cwd=elsewhere,
        env=env,
    ):
        fetched = subprocess.run(
            [
                "curl",
                "-sS",
                "--max-time",
                "10",
                "-x",
                f"127.0.0.1:{listen}",
                http_origin.url("/blob.bin"),
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert fetched.stdout == "200", fetched.stderr + log.read_text()
    assert "default 'baseline'" in log.read_text()  # the policy shipped in the package
