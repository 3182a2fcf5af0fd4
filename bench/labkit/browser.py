"""Page loads in the system Chromium, driven by playwright-core (the node project in browser/).

Each load gets a fresh profile and a fresh NSS database that trusts exactly the given CAs, so
certificate checks are Chromium's real ones: the proxy's interception CA must be trusted to load
anything through it, and an origin signed by an untrusted CA fails as it would for a user.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

BROWSER_PROJECT = Path(__file__).with_name("browser")
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
# Beyond the page timeout, what launching and closing Chromium may take before node is killed.
_SHUTDOWN_GRACE = 20.0
_OUTPUT_TAIL = 2000


class PageLoadError(RuntimeError):
    """A page did not load, or loaded with failed requests; the message has Chromium's reason."""


@dataclass(frozen=True)
class ResourceLoad:
    """One response the page received, with a digest of its body."""

    url: str
    status: int
    # Of the body as Chromium received it (after any Content-Encoding is undone); empty for
    # redirects, which have no body.
    sha256: str
    size: int


@dataclass(frozen=True)
class PageLoad:
    """What one page load took and fetched."""

    load_ms: float  # Navigation Timing loadEventEnd - startTime
    fcp_ms: float | None  # first-contentful-paint, if Chromium reported one
    resources: list[ResourceLoad]  # every http(s) response, the page itself included


def ensure_node_deps() -> None:
    """Installs the pinned playwright-core with `npm ci` unless it is already installed."""
    # Concurrent test sessions would otherwise run `npm ci` over each other's node_modules.
    lock_path = Path(tempfile.gettempdir()) / "reshape-labkit-npm-ci.lock"
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _installed_playwright_version() == _pinned_playwright_version():
            return
        completed = subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund"],
            cwd=BROWSER_PROJECT,
            capture_output=True,
            text=True,
            check=False,
        )
        if completed.returncode != 0:
            raise RuntimeError(
                f"npm ci in {BROWSER_PROJECT} failed ({completed.returncode}):\n"
                f"{(completed.stdout + completed.stderr)[-_OUTPUT_TAIL:]}"
            )


def load_page(
    url: str, *, proxy: str | None, trusted_cas: list[Path], timeout: float = 60.0
) -> PageLoad:
    """Loads `url` in a fresh headless Chromium that trusts only `trusted_cas`.

    `proxy` is "HOST:PORT" (or "http://HOST:PORT") of an HTTP proxy for all traffic, loopback
    included; None means direct connections. Raises PageLoadError when navigation fails or times
    out, when the page answers an error status, or when any request of the page failed.
    """
    ensure_node_deps()
    # A browser process killed late may still hold files in the profile; leftovers are harmless.
    with tempfile.TemporaryDirectory(
        prefix="reshape-chromium-", ignore_cleanup_errors=True
    ) as scratch:
        home = Path(scratch) / "home"
        profile = Path(scratch) / "profile"
        trust_cas(home / ".pki" / "nssdb", trusted_cas)
        request = {
            "url": url,
            "executablePath": str(CHROMIUM),
            "userDataDir": str(profile),
            "args": [*CHROMIUM_FLAGS, *proxy_flags(proxy)],
            "timeoutMs": round(timeout * 1000),
        }
        # Chromium reads its NSS database from $HOME/.pki/nssdb.
        env = {**os.environ, "HOME": str(home)}
        stdout, stderr = _run_node(request, env, profile, timeout + _SHUTDOWN_GRACE)
    return _parse_result(url, stdout, stderr)


def trust_cas(nssdb: Path, cas: list[Path]) -> None:
    """Creates an NSS database in `nssdb` that trusts each of `cas` to issue server certificates."""
    nssdb.mkdir(parents=True, exist_ok=True)
    _certutil("-N", "-d", f"sql:{nssdb}", "--empty-password")
    for number, ca in enumerate(cas):
        name = f"reshape-lab-{number}"
        _certutil("-A", "-d", f"sql:{nssdb}", "-t", "C,,", "-n", name, "-i", str(ca))


def proxy_flags(proxy: str | None) -> list[str]:
    """Chromium flags that send all traffic through `proxy`, or none of it through any proxy."""
    if proxy is None:
        # Otherwise Chromium would honour http_proxy & co. from the environment.
        return ["--no-proxy-server"]
    server = proxy if "://" in proxy else f"http://{proxy}"
    # By default Chromium never proxies loopback; the lab's origins are all on loopback.
    return [f"--proxy-server={server}", "--proxy-bypass-list=<-loopback>"]


def _run_node(
    request: dict[str, object], env: dict[str, str], profile: Path, limit: float
) -> tuple[str, str]:
    process = subprocess.Popen(
        ["node", str(BROWSER_PROJECT / "load_page.mjs")],
        cwd=BROWSER_PROJECT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        return process.communicate(json.dumps(request), timeout=limit)
    except subprocess.TimeoutExpired:
        raise PageLoadError(
            f"loading {request['url']} did not finish within {limit:.0f}s; browser killed"
        ) from None
    finally:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
        # Playwright starts Chromium in a process group of its own, which a killed node leaves
        # behind; the profile path identifies this load's browser.
        _kill_browsers_using(profile)


def _parse_result(url: str, stdout: str, stderr: str) -> PageLoad:
    try:
        result = json.loads(stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        raise PageLoadError(
            f"loading {url}: the browser driver gave no result; its output:\n"
            f"{(stdout + stderr)[-_OUTPUT_TAIL:]}"
        ) from None
    if not result["ok"]:
        raise PageLoadError(f"loading {url} failed: {result['error']}")
    if result["failures"]:
        raise PageLoadError(
            f"loading {url}: {len(result['failures'])} request(s) failed:\n"
            + "\n".join(result["failures"])
        )
    return PageLoad(
        load_ms=float(result["loadMs"]),
        fcp_ms=None if result["fcpMs"] is None else float(result["fcpMs"]),
        resources=[
            ResourceLoad(entry["url"], entry["status"], entry["sha256"], entry["size"])
            for entry in result["resources"]
        ],
    )


def _kill_browsers_using(profile: Path) -> None:
    marker = f"--user-data-dir={profile}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            arguments = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker in arguments:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)


def _certutil(*arguments: str) -> None:
    completed = subprocess.run(
        ["certutil", *arguments], capture_output=True, text=True, check=False
    )
    if completed.returncode != 0:
        raise RuntimeError(
            f"certutil {' '.join(arguments)} failed ({completed.returncode}): "
            f"{(completed.stdout + completed.stderr).strip()}"
        )


def _pinned_playwright_version() -> str:
    package = json.loads((BROWSER_PROJECT / "package.json").read_text())
    version: str = package["dependencies"]["playwright-core"]
    return version


def _installed_playwright_version() -> str | None:
    installed = BROWSER_PROJECT / "node_modules" / "playwright-core" / "package.json"
    try:
        version: str = json.loads(installed.read_text())["version"]
    except FileNotFoundError:
        return None
    return version
