"""Set-up files agree with each other: one Python version, one pinned install path."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_python_version_is_the_same_everywhere() -> None:
    version = (REPO / ".python-version").read_text().strip()
    assert version == "3.12"
    assert f"FROM python:{version}-slim" in (REPO / "Dockerfile").read_text()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == f"=={version}.*"


def test_direct_dependencies_are_pinned_exactly_and_locked() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    lock = {
        re.split("==", line)[0].lower().replace("_", "-"): line.split("==")[1]
        for line in (REPO / "requirements.lock").read_text().splitlines()
        + (REPO / "requirements-test.lock").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    }
    extras = pyproject["project"]["optional-dependencies"]
    direct = pyproject["project"]["dependencies"] + extras["report"] + extras["test"]
    for requirement in direct:
        if requirement.startswith("reshape["):
            continue  # the test extra includes the report extra
        name, version = re.fullmatch(
            r"([A-Za-z0-9_.\-]+)(?:\[[a-z0-9,]+\])?==(\S+)", requirement
        ).groups()
        assert lock[name.lower().replace("_", "-")] == version, requirement
    assert lock["mitmproxy"] == "12.2.3"


def test_dockerfile_installs_exactly_like_make() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "RUN make venv" in dockerfile
    assert "USER 10001:10001" in dockerfile
    assert 'CMD ["reshape", "health"]' in dockerfile  # GET /healthz on RESHAPE_ADMIN
    assert "EXPOSE 8080 9464" in dockerfile
    makefile = (REPO / "Makefile").read_text()
    assert (
        "pip install --quiet --disable-pip-version-check --no-deps -r requirements.lock" in makefile
    )


def test_ci_runs_make_test_and_keeps_pytest_status() -> None:
    ci = (REPO / ".ci" / "run").read_text()
    assert "make test" in ci and "|| true" not in ci
