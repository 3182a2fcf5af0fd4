"""deploy/ and the Dockerfile, checked without a Docker engine or a running systemd (neither is
available where the suite runs): hadolint on the Dockerfile; the image's stages, environment and
health check against `reshape run`'s own checks; the build stage done for real (`make venv` on
exactly what the Dockerfile copies) and the final stage's files run as the image would run them;
the systemd unit through systemd-analyze (verify, and the offline security assessment); the
logrotate configuration through Debian's logrotate."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from reshape.cli import _parser, run_config
from tests.support.reshape_process import REPO

DOCKERFILE = REPO / "Dockerfile"
UNIT = REPO / "deploy" / "systemd" / "reshape.service"
LOGROTATE_CONFIG = REPO / "deploy" / "logrotate" / "reshape"
HADOLINT = Path(sys.executable).with_name("hadolint")


@dataclass
class Stage:
    name: str
    instructions: list[tuple[str, str]]  # (INSTRUCTION, arguments), continuation lines joined

    def all(self, instruction: str) -> list[str]:
        return [args for name, args in self.instructions if name == instruction]


def stages() -> list[Stage]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    found: list[Stage] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, args = line.partition(" ")
        if instruction == "FROM":
            found.append(Stage(args.split(" AS ")[-1] if " AS " in args else "", []))
        found[-1].instructions.append((instruction, args.strip()))
    return found


def image_environment() -> dict[str, str]:
    """The final stage's ENV, as the container's process sees it (PATH left out)."""
    environment = {}
    for args in stages()[-1].all("ENV"):
        for assignment in shlex.split(args):
            name, _, value = assignment.partition("=")
            environment[name] = value
    environment.pop("PATH", None)
    return environment


def json_list(args: str) -> list[str]:
    import json

    value: list[str] = json.loads(args)
    return value


@pytest.fixture
def image_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    environment = image_environment()
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    return environment


def test_hadolint_finds_nothing() -> None:
    result = subprocess.run(
        [str(HADOLINT), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_two_stages_and_the_image_gets_only_the_venv_and_the_package() -> None:
    build, final = stages()
    assert build.name == "build" and any("make venv" in run for run in build.all("RUN"))
    assert final.all("COPY") == [
        "--from=build /app/.venv /app/.venv",
        "--from=build /app/reshape /app/reshape",
    ]
    copied = " ".join(build.all("COPY"))
    assert "tests" not in copied and "bench" not in copied and not re.search(r"(^| )\. ", copied)
    ignore = (REPO / ".dockerignore").read_text().splitlines()
    assert ignore[ignore.index("*")] == "*"  # everything out, then only what the build copies
    included = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    assert included == {
        "Makefile",
        "pyproject.toml",
        "requirements.lock",
        ".python-version",
        "README.md",
        "reshape",
    }
    sources = {p for args in build.all("COPY") for p in args.split()[:-1]}
    assert sources <= included | {"reshape"}


def test_the_image_runs_as_its_own_user_with_the_ca_in_a_volume() -> None:
    final = stages()[-1]
    (user,) = final.all("USER")
    assert user == "10001:10001"
    assert any("--uid 10001" in run and "--gid 10001" in run for run in final.all("RUN"))
    assert final.all("VOLUME") == ['["/home/reshape/.reshape"]']
    assert image_environment()["RESHAPE_CONFDIR"] == "/home/reshape/.reshape"


def test_the_images_command_passes_reshapes_own_checks(image_env: dict[str, str]) -> None:
    final = stages()[-1]
    assert json_list(final.all("ENTRYPOINT")[0]) == ["reshape"]
    config = run_config(_parser().parse_args(json_list(final.all("CMD")[0])))
    assert config.listen.is_wildcard and config.admin.is_wildcard and config.allow_clients
    (exposed,) = final.all("EXPOSE")
    assert {str(config.listen.port), str(config.admin.port)} == set(exposed.split())


def test_the_health_check_asks_the_configured_admin_port(image_env: dict[str, str]) -> None:
    (check,) = stages()[-1].all("HEALTHCHECK")
    command = json_list(check.split(" CMD ", 1)[1])
    assert command == ["reshape", "health"]
    args = _parser().parse_args(command[1:])
    assert args.admin == image_env["RESHAPE_ADMIN"]  # the same variable `run` listens by


def test_the_systemd_unit_verifies_and_is_hardened(tmp_path: Path) -> None:
    # systemd-analyze checks that ExecStart exists: the unit as installed in this checkout.
    unit = tmp_path / "reshape.service"
    unit.write_text(UNIT.read_text().replace("/opt/reshape/.venv/bin/reshape", str(_reshape())))
    verify = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert verify.returncode == 0 and verify.stderr == "", verify.stderr
    security = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    overall = r"Overall exposure level for reshape.service: ([\d.]+) (\w+)"
    match = re.search(overall, security.stdout)
    assert match, security.stdout + security.stderr
    assert float(match[1]) <= 2.0 and match[2] == "OK", security.stdout


def test_the_systemd_units_command_passes_reshapes_own_checks() -> None:
    text = re.sub(r"\\\n", " ", UNIT.read_text())
    (exec_start,) = re.findall(r"^ExecStart=(.*)$", text, re.M)
    program, *args = shlex.split(exec_start)
    assert program == "/opt/reshape/.venv/bin/reshape"
    config = run_config(_parser().parse_args(args))
    assert config.listen.is_loopback and config.admin.is_loopback
    assert str(config.confdir) == "/var/lib/reshape" and "StateDirectory=reshape" in text
    assert str(config.request_log).startswith("/var/log/reshape/")
    assert "LogsDirectory=reshape" in text
    assert "ExecReload=/bin/kill -HUP $MAINPID" in text  # the policy reload


def test_the_logrotate_configuration_rotates_what_the_unit_writes(tmp_path: Path) -> None:
    result = subprocess.run(
        ["/usr/sbin/logrotate", "--debug", "--state", str(tmp_path / "state")]
        + [str(LOGROTATE_CONFIG)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "considering log /var/log/reshape/requests.jsonl" in result.stderr
    text = LOGROTATE_CONFIG.read_text()
    assert re.search(r"^\s+delaycompress$", text, re.M) and "copytruncate\n" not in text
    assert "--signal=USR1" in text


def _reshape() -> Path:
    return Path(sys.executable).with_name("reshape")


@pytest.fixture(scope="module")
def image_files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The final stage's files, made as the Dockerfile makes them: the build stage's COPYs into
    an empty directory, its RUN make venv, then only what the final stage copies is kept."""
    app = tmp_path_factory.mktemp("image") / "app"
    app.mkdir()
    build = stages()[0]
    for args in build.all("COPY"):
        *sources, destination = args.split()
        for source in sources:
            target = app / destination if destination != "./" else app
            if (REPO / source).is_dir():
                shutil.copytree(
                    REPO / source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
                )
            else:
                shutil.copy2(REPO / source, target / source if destination == "./" else target)
    (run,) = [r for r in build.all("RUN") if "make venv" in r]
    subprocess.run(shlex.split(run), cwd=app, check=True, capture_output=True, timeout=900)
    kept = {Path(args.split()[-1]).name for args in stages()[-1].all("COPY")}
    for entry in app.iterdir():
        if entry.name not in kept:
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    assert sorted(p.name for p in app.iterdir()) == [".venv", "reshape"]
    yield app


@pytest.mark.slow
def test_the_final_stage_runs_and_its_health_check_follows_the_admin_port(
    image_files: Path, tmp_path: Path
) -> None:
    """`docker run` with the image's environment, then with RESHAPE_ADMIN moved: the image's
    fixed ports (8080, 9464 on all interfaces) in a network namespace of their own."""
    if os.geteuid() != 0:
        pytest.skip("a network namespace of its own (unshare -n) needs root")
    bin_dir = image_files / ".venv" / "bin"
    environment = {
        **image_environment(),
        "PATH": f"{bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(tmp_path),
        "RESHAPE_CONFDIR": str(tmp_path / "ca"),
    }
    final = stages()[-1]
    command = " ".join(json_list(final.all("ENTRYPOINT")[0]) + json_list(final.all("CMD")[0]))
    health = " ".join(json_list(final.all("HEALTHCHECK")[0].split(" CMD ", 1)[1]))
    script = f"""
ip link set lo up
{command} > {tmp_path}/run.log 2>&1 &
for i in $(seq 100); do {health} >/dev/null 2>&1 && break; sleep 0.2; done
{health} || exit 11
RESHAPE_ADMIN=0.0.0.0:9999 {health} && exit 12  # nothing there yet: unhealthy
kill -TERM %1; wait %1 || exit 13
export RESHAPE_ADMIN=0.0.0.0:9999
{command} > {tmp_path}/run2.log 2>&1 &
for i in $(seq 100); do {health} >/dev/null 2>&1 && break; sleep 0.2; done
{health} || exit 14
kill -TERM %1; wait %1 || exit 15
"""
    result = subprocess.run(
        ["unshare", "-n", "bash", "-c", script],
        env=environment,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    logs = "".join(p.read_text() for p in sorted(tmp_path.glob("run*.log")))
    assert result.returncode == 0, result.stdout + result.stderr + logs
    assert "healthy: http://127.0.0.1:9464/healthz" in result.stdout
    assert "healthy: http://127.0.0.1:9999/healthz" in result.stdout
    assert '"message": "proxy listening on 0.0.0.0:8080"' in logs  # JSON logs, as configured
