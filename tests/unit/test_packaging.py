"""Set-up files agree with each other: one Python version, one pinned install path."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


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


def _third_party_imports(paths: list[Path]) -> dict[str, set[Path]]:
    """Top-level module → the files that import it, for modules outside the standard library."""
    import ast
    import sys

    found: dict[str, set[Path]] = {}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in ("reshape", "__future__"):
                    found.setdefault(top, set()).add(path)
    return found


def _declared(requirements: list[str]) -> set[str]:
    return {re.split(r"[\[=<>]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}


def test_every_package_the_code_imports_is_declared() -> None:
    from importlib.metadata import packages_distributions

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    runtime = _declared(project["dependencies"])
    report = _declared(project["optional-dependencies"]["report"])
    distributions = packages_distributions()
    for module, files in _third_party_imports(sorted((REPO / "reshape").rglob("*.py"))).items():
        (distribution,) = {d.lower().replace("_", "-") for d in distributions[module]}
        where = sorted(str(f.relative_to(REPO)) for f in files)
        if distribution in runtime:
            continue
        # The report extra is for `reshape report` alone: a gateway runs without it.
        assert distribution in report, f"{distribution} ({module}) is not declared: {where}"
        assert all("reshape/report/" in w for w in where), f"{distribution} outside report: {where}"
    tests = _declared(project["optional-dependencies"]["test"]) | runtime | report
    imported = _third_party_imports(sorted((REPO / "tests").rglob("*.py")))
    for module in imported:
        if module in ("tests", "labkit", "bench"):
            continue
        (distribution,) = {d.lower().replace("_", "-") for d in distributions[module]}
        assert distribution in tests, f"tests import {module} ({distribution}), not declared"
