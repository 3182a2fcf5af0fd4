"""Fixtures shared by every suite: a test PKI for origins, `reshape run` as a real subprocess,
and nginx origins. What they use is in tests/support/."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from labkit.origins import Origin, nginx_origin
from labkit.pki import OriginPKI
from tests.support.reshape_process import ReshapeLauncher, StartProxy


@pytest.fixture(scope="session")
def origin_pki(tmp_path_factory: pytest.TempPathFactory) -> OriginPKI:
    return OriginPKI(tmp_path_factory.mktemp("origin-pki"))


# The proxies a test started, for its report should it fail.
LAUNCHER = pytest.StashKey[ReshapeLauncher]()
# How much of each proxy's log a failed test's report shows: its end, where the cause usually is.
LOG_LINES_ON_FAILURE = 120


@pytest.fixture
def start_reshape(
    request: pytest.FixtureRequest, tmp_path: Path, origin_pki: OriginPKI
) -> Iterator[StartProxy]:
    """Start `reshape run` on free loopback ports; every proxy is stopped after the test."""
    launcher = request.node.stash[LAUNCHER] = ReshapeLauncher(tmp_path, origin_pki)
    yield launcher.start
    launcher.stop_all()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test that ran proxies shows the end of their logs: on CI, where the test's
    directory is gone, the proxy's side of a failure is otherwise lost."""
    report: pytest.TestReport = yield
    launcher = item.stash.get(LAUNCHER, None)
    if report.failed and launcher is not None:
        for running in launcher.started:
            lines = running.log().splitlines()[-LOG_LINES_ON_FAILURE:]
            report.sections.append((f"{running.log_path.name}, last lines", "\n".join(lines)))
    return report


# nginx serving the test module's own `site_root` fixture (a directory), on 127.0.0.2 (http) and
# 127.0.0.3 (https, certificate from origin_pki).
@pytest.fixture
def http_origin(site_root: Path) -> Iterator[Origin]:
    with nginx_origin(site_root, "127.0.0.2") as origin:
        yield origin


@pytest.fixture
def https_origin(site_root: Path, origin_pki: OriginPKI) -> Iterator[Origin]:
    with nginx_origin(site_root, "127.0.0.3", tls=origin_pki.issue(["127.0.0.3"])) as origin:
        yield origin
