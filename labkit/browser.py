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
import queue
import subprocess
import tempfile
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO

from labkit import processes

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
    # redirects, which have no body, and when the load was told not to read bodies.
    sha256: str
    # Body bytes; without bodies read, the encoded body size Chromium reports for the response.
    size: int
    method: str = "GET"
    # Without bodies read: the protocol Chromium spoke (to the proxy, when there is one), and the
    # id of the connection that carried the response.
    protocol: str = ""
    connection_id: int = 0


@dataclass(frozen=True)
class ResourceTiming:
    """A PerformanceResourceTiming entry (ms since navigation start; cross-origin details such as
    sizes and connect times are 0 unless the origin sends Timing-Allow-Origin)."""

    url: str
    initiator_type: str
    start_ms: float
    request_start_ms: float
    response_start_ms: float
    response_end_ms: float
    next_hop_protocol: str
    transfer_size: int


@dataclass(frozen=True)
class NavigationTiming:
    """The page's own exchange (its Navigation Timing entry, ms since navigation start): when its
    connection was ready (TCP and TLS; through a proxy, the tunnel and TLS), its request left,
    and its first and last bytes arrived."""

    connect_end_ms: float
    request_start_ms: float
    response_start_ms: float
    response_end_ms: float


@dataclass(frozen=True)
class PageLoad:
    """What one page load took and fetched."""

    load_ms: float  # Navigation Timing loadEventEnd - startTime
    fcp_ms: float | None  # first-contentful-paint, if Chromium reported one
    resources: list[ResourceLoad]  # every http(s) response, the page itself included
    # The page's own completion mark (window[done_global], ms), when one was asked for.
    done_ms: float | None = None
    # Resource Timing entries, when asked for (the navigation itself excluded).
    timings: list[ResourceTiming] = field(default_factory=list)
    # The navigation's own timing, asked for with the Resource Timing entries.
    navigation: NavigationTiming | None = None


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
    url: str,
    *,
    proxy: str | None,
    trusted_cas: list[Path],
    timeout: float = 60.0,
    bodies: bool = True,
    done_global: str | None = None,
    resource_timing: bool = False,
) -> PageLoad:
    """Loads `url` in a fresh headless Chromium that trusts only `trusted_cas`.

    `proxy` is "HOST:PORT" (or "http://HOST:PORT") of an HTTP proxy for all traffic, loopback
    included; None means direct connections. Raises PageLoadError when navigation fails or times
    out, when the page answers an error status, or when any request of the page failed.

    `bodies=False` skips reading every body back from Chromium (which costs CPU during the load
    and so skews its timing): sizes are then Chromium's own count, digests empty.
    `done_global`: after `load`, wait until the page sets `window[done_global]` to a number (its
    own "finished" time in ms, e.g. after XHRs that do not delay `load`) and report it as
    `done_ms`; a string there is a failure the page reports. `resource_timing` returns the
    page's Resource Timing entries (the buffer is enlarged so none are dropped).
    """
    stdout, stderr = drive_page_load(
        [str(BROWSER_PROJECT / "load_page.mjs")],
        url,
        proxy=proxy,
        trusted_cas=trusted_cas,
        timeout=timeout,
        bodies=bodies,
        doneGlobal=done_global,
        resourceTiming=resource_timing,
    )
    return _parse_result(url, stdout, stderr)


def drive_page_load(
    node_arguments: list[str],
    url: str,
    *,
    proxy: str | None,
    trusted_cas: list[Path],
    timeout: float,
    **options: object,
) -> tuple[str, str]:
    """(stdout, stderr) of a page-load driver (`run_driver`) given `url` in a fresh Chromium
    profile whose NSS database trusts only `trusted_cas`, through `proxy` (None: direct). The
    request it reads: url, executablePath, userDataDir, args, timeoutMs, and `options`."""
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
            **options,
        }
        # Chromium reads its NSS database from $HOME/.pki/nssdb.
        env = {**os.environ, "HOME": str(home)}
        return run_driver(node_arguments, request, env, profile, timeout + _SHUTDOWN_GRACE)


class BrowserSession:
    """Page loads in one headless Chromium, each in a fresh browser context: an empty cache, its
    own cookies, storage and connection pools — what a fresh profile gives, without launching a
    browser (a second or two) per load. Trusts exactly `trusted_cas` (every CA any load needs).

    The browser is relaunched after `loads_per_browser` loads and after a load that did not
    finish in time. Use as a context manager, or call close().
    """

    def __init__(self, trusted_cas: list[Path], *, loads_per_browser: int = 150) -> None:
        self.trusted_cas = list(trusted_cas)
        self.loads_per_browser = loads_per_browser
        self._process: subprocess.Popen[str] | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._scratch: tempfile.TemporaryDirectory[str] | None = None
        self._marker = ""
        self._loads = 0

    def __enter__(self) -> BrowserSession:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def load(
        self,
        url: str,
        *,
        proxy: str | None,
        timeout: float = 60.0,
        bodies: bool = True,
        done_global: str | None = None,
        resource_timing: bool = False,
    ) -> PageLoad:
        """Loads `url` as `load_page` does (same arguments, same checks, same PageLoadError)."""
        if self._process is not None and self._loads >= self.loads_per_browser:
            self.close()
        if self._process is None:
            self._start()
        self._loads += 1
        server = None if proxy is None else (proxy if "://" in proxy else f"http://{proxy}")
        request = {
            "url": url,
            "proxy": server,
            "timeoutMs": round(timeout * 1000),
            "bodies": bodies,
            "doneGlobal": done_global,
            "resourceTiming": resource_timing,
        }
        result = self._exchange(request, timeout + _SHUTDOWN_GRACE)
        if result is None:
            self.close()
            raise PageLoadError(
                f"loading {url} did not finish within {timeout + _SHUTDOWN_GRACE:.0f}s; "
                "browser killed"
            )
        return _page_load(url, result)

    def close(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            if process.stdin is not None:
                with contextlib.suppress(OSError):
                    process.stdin.close()  # the driver closes the browser and exits
            processes.stop(process, _SHUTDOWN_GRACE, ask=False)
            processes.kill_processes_with_argument(self._marker)
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None

    def _start(self) -> None:
        ensure_node_deps()
        self._scratch = tempfile.TemporaryDirectory(
            prefix="reshape-chromium-", ignore_cleanup_errors=True
        )
        home = Path(self._scratch.name) / "home"
        trust_cas(home / ".pki" / "nssdb", self.trusted_cas)
        # An argument Chromium ignores, by which a browser left behind by a killed driver is found.
        self._marker = f"--reshape-lab-session={uuid.uuid4().hex}"
        self._lines = queue.Queue()
        self._loads = 0
        with (Path(self._scratch.name) / "driver.log").open("w") as log:
            self._process = processes.spawn(
                ["node", str(BROWSER_PROJECT / "session.mjs")],
                cwd=BROWSER_PROJECT,
                env={**os.environ, "HOME": str(home)},
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )
        threading.Thread(
            target=_forward_lines, args=(self._process.stdout, self._lines), daemon=True
        ).start()
        setup = {
            "executablePath": str(CHROMIUM),
            "args": [*CHROMIUM_FLAGS, "--no-proxy-server", self._marker],
        }
        ready = self._exchange(setup, _SHUTDOWN_GRACE)
        if ready is None or not ready.get("ok"):
            log_text = (Path(self._scratch.name) / "driver.log").read_text(errors="replace")
            self.close()
            raise PageLoadError(f"the browser session did not start:\n{log_text[-_OUTPUT_TAIL:]}")

    def _exchange(self, request: dict[str, object], limit: float) -> dict[str, object] | None:
        """Sends one request line; the answer line, or None if none came within `limit`."""
        assert self._process is not None and self._process.stdin is not None
        try:
            self._process.stdin.write(json.dumps(request) + "\n")
            self._process.stdin.flush()
            line = self._lines.get(timeout=limit)
        except (OSError, queue.Empty):
            return None
        if line is None:
            return None
        answer: dict[str, object] = json.loads(line)
        return answer


def _forward_lines(stream: IO[str], lines: queue.Queue[str | None]) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


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


def run_driver(
    node_arguments: list[str],
    request: dict[str, object],
    env: dict[str, str],
    profile: Path | str,
    limit: float,
) -> tuple[str, str]:
    """(stdout, stderr) of `node <node_arguments>`, a driver run in the browser project (where
    'playwright-core' resolves) that reads `request` as JSON on stdin; PageLoadError if it takes
    over `limit` seconds. `profile` (a --user-data-dir, or a marker argument) identifies the
    browser it starts, to kill it should the driver leave it behind."""
    process = processes.spawn(
        ["node", *node_arguments],
        cwd=BROWSER_PROJECT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        return process.communicate(json.dumps(request), timeout=limit)
    except subprocess.TimeoutExpired:
        raise PageLoadError(
            f"loading {request.get('url', 'a page')} did not finish within {limit:.0f}s; "
            "browser killed"
        ) from None
    finally:
        if process.poll() is None:
            processes.stop(process, 0, ask=False)
            process.communicate()
        # Playwright starts Chromium in a process group of its own, which a killed node leaves
        # behind; the profile path (or marker) identifies this driver's browser.
        if isinstance(profile, Path):
            _kill_browsers_using(profile)
        else:
            processes.kill_processes_with_argument(profile)


def _parse_result(url: str, stdout: str, stderr: str) -> PageLoad:
    try:
        result = json.loads(stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        raise PageLoadError(
            f"loading {url}: the browser driver gave no result; its output:\n"
            f"{(stdout + stderr)[-_OUTPUT_TAIL:]}"
        ) from None
    return _page_load(url, result)


def _page_load(url: str, result: dict[str, object]) -> PageLoad:
    if not result["ok"]:
        raise PageLoadError(f"loading {url} failed: {result['error']}")
    if result["failures"]:
        raise PageLoadError(
            f"loading {url}: {len(result['failures'])} request(s) failed:\n"
            + "\n".join(result["failures"])
        )
    done = result.get("doneMs")
    return PageLoad(
        load_ms=float(result["loadMs"]),
        fcp_ms=None if result["fcpMs"] is None else float(result["fcpMs"]),
        resources=[
            ResourceLoad(
                entry["url"],
                entry["status"],
                entry["sha256"],
                entry["size"],
                entry.get("method", "GET"),
                entry.get("protocol", ""),
                int(entry.get("connectionId", 0)),
            )
            for entry in result["resources"]
        ],
        done_ms=None if done is None else float(done),
        timings=[
            ResourceTiming(
                entry["name"],
                entry["initiatorType"],
                float(entry["startTime"]),
                float(entry["requestStart"]),
                float(entry["responseStart"]),
                float(entry["responseEnd"]),
                entry["nextHopProtocol"],
                int(entry["transferSize"]),
            )
            for entry in result.get("timings", [])
        ],
        navigation=_navigation_timing(result.get("navigation")),
    )


def _navigation_timing(entry: object) -> NavigationTiming | None:
    if not isinstance(entry, dict):
        return None
    return NavigationTiming(
        float(entry["connectEnd"]),
        float(entry["requestStart"]),
        float(entry["responseStart"]),
        float(entry["responseEnd"]),
    )


def _kill_browsers_using(profile: Path) -> None:
    processes.kill_processes_with_argument(f"--user-data-dir={profile}")


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
