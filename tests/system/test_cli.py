"""The command line as a user meets it: clear one-line errors and exit statuses, no tracebacks."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest

from labkit.processes import free_port
from tests.support.reshape_process import REPO, RESHAPE, StartProxy


def reshape(*args: str, cwd: Path = REPO, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*RESHAPE, *args], capture_output=True, text=True, cwd=cwd, timeout=timeout
    )


def assert_clean_error(result: subprocess.CompletedProcess[str], status: int, needle: str) -> None:
    assert result.returncode == status, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    errors = [line for line in result.stderr.splitlines() if line.startswith("reshape: error: ")]
    assert errors, result.stderr
    assert any(needle in line for line in errors), result.stderr


def run_args(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "run",
        "--listen",
        f"127.0.0.1:{free_port()}",
        "--admin",
        f"127.0.0.1:{free_port()}",
        "--confdir",
        str(tmp_path / "conf"),
        *extra,
    ]


def test_policy_check_accepts_the_default_file() -> None:
    result = reshape("policy", "check", "reshape/policy/default.yaml")
    assert result.returncode == 0
    assert "ok" in result.stdout


def test_policy_check_lists_every_problem_and_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\ndefault: fast\npolicies:\n  slow: {}\nrulez: []\n")
    result = reshape("policy", "check", str(bad))
    assert_clean_error(result, 2, f"{bad}: line 2: default: no policy named 'fast'")
    assert_clean_error(result, 2, f"{bad}: line 5: rulez: unknown key (did you mean 'rules'?)")


def test_run_refuses_a_bad_policy_file_the_same_way(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\ndefault: a\npolicies: {a: {}}\nrules: nope\n")
    result = reshape(*run_args(tmp_path, "--policy", str(bad)))
    assert_clean_error(result, 2, "line 4: rules: expected a list")


def test_run_refuses_a_missing_policy_file(tmp_path: Path) -> None:
    result = reshape(*run_args(tmp_path, "--policy", str(tmp_path / "absent.yaml")))
    assert_clean_error(result, 2, "no such file")


@pytest.mark.parametrize("workers", ["1", "2"])
def test_port_in_use(tmp_path: Path, workers: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = reshape(
            "run",
            "--listen",
            f"127.0.0.1:{port}",
            "--admin",
            f"127.0.0.1:{free_port()}",
            "--confdir",
            str(tmp_path / "c"),
            "--workers",
            workers,
        )
    assert_clean_error(result, 1, f"cannot listen on 127.0.0.1:{port}")
    assert "in use" in result.stderr


def test_admin_port_in_use(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = reshape(
            "run",
            "--listen",
            f"127.0.0.1:{free_port()}",
            "--admin",
            f"127.0.0.1:{port}",
            "--confdir",
            str(tmp_path / "c"),
        )
    assert_clean_error(result, 1, f"cannot listen on admin 127.0.0.1:{port}")


def test_unreadable_ca(tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    conf.mkdir()
    key = conf / "mitmproxy-ca.pem"
    key.write_text("-----BEGIN PRIVATE KEY-----\ngarbage\n-----END PRIVATE KEY-----\n")
    key.chmod(0o600)
    result = reshape(*run_args(tmp_path))
    assert_clean_error(result, 1, f"CA file {key} is not a PEM key and certificate")


def test_exposed_ca_key(tmp_path: Path) -> None:
    assert reshape("ca", "init", "--confdir", str(tmp_path / "conf")).returncode == 0
    (tmp_path / "conf" / "mitmproxy-ca.pem").chmod(0o644)
    result = reshape(*run_args(tmp_path))
    assert_clean_error(result, 1, "readable by group or others")


def test_bad_upstream_ca(tmp_path: Path) -> None:
    not_pem = tmp_path / "x.pem"
    not_pem.write_text("hello")
    result = reshape(*run_args(tmp_path, "--upstream-ca", str(not_pem)))
    assert_clean_error(result, 2, "--upstream-ca")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--listen", "nonsense"], "--listen: expected HOST:PORT"),
        (["--admin", "127.0.0.1:99999"], "--admin: port must be 0-65535"),
        (["--workers", "0"], "--workers must be 1 to 64 (one per core is usual), got 0"),
        (["--workers", "100000"], "--workers must be 1 to 64"),
    ],
)
def test_bad_arguments(tmp_path: Path, args: list[str], needle: str) -> None:
    result = reshape("run", "--confdir", str(tmp_path / "c"), *args)
    assert_clean_error(result, 2, needle)


def test_ca_init_then_show(tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    first = reshape("ca", "init", "--confdir", str(conf))
    assert first.returncode == 0 and first.stdout.startswith("created CA")
    second = reshape("ca", "init", "--confdir", str(conf))
    assert second.returncode == 0 and second.stdout.startswith("reusing CA")
    fingerprint = first.stdout.split("SHA-256 ")[1].strip()
    assert fingerprint in second.stdout
    shown = reshape("ca", "show", "--confdir", str(conf))
    assert shown.returncode == 0
    assert fingerprint in shown.stdout
    assert str(conf / "mitmproxy-ca-cert.pem") in shown.stdout
    assert "Firefox" in shown.stdout and "Chromium" in shown.stdout


def test_ca_show_without_a_ca(tmp_path: Path) -> None:
    assert_clean_error(reshape("ca", "show", "--confdir", str(tmp_path)), 1, "reshape ca init")


def test_startup_logs_one_line_per_fact(start_reshape: StartProxy) -> None:
    proxy = start_reshape()
    log = proxy.log()
    for fact in (
        f"proxy listening on {proxy.listen}",
        f"admin endpoint on http://{proxy.admin}",
        "SHA-256 ",
        "policy file ",
        "origins verified against",
    ):
        assert sum(fact in line for line in log.splitlines()) == 1, log
    assert proxy.stop() == 0


@pytest.mark.parametrize("option", ["--listen", "--admin"])
def test_listening_beyond_loopback_needs_an_allow_list(tmp_path: Path, option: str) -> None:
    args = run_args(tmp_path)
    args[args.index(option) + 1] = f"0.0.0.0:{free_port()}"
    result = reshape(*args)
    assert_clean_error(result, 2, f"{option} 0.0.0.0:")
    assert "--allow-clients" in result.stderr


def test_with_an_allow_list_it_listens_on_all_interfaces(start_reshape: StartProxy) -> None:
    proxy = start_reshape("--allow-clients", "10.0.0.0/8,192.168.0.0/16")
    assert proxy.stop() == 0


def test_bad_allow_list(tmp_path: Path) -> None:
    result = reshape(*run_args(tmp_path, "--allow-clients", "10.0.0.0/8,nonsense"))
    assert_clean_error(result, 2, "--allow-clients: 'nonsense' is not a network")
