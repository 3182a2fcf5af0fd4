"""What a page shows in the system Chromium: text, links, rendered images, a screenshot, the
files its links download — through a proxy or not, trusting exactly the given CAs.

The lab's runner (labkit/browser.py) measures page loads; this one looks at a page the way a
person does, for the pages reshape itself serves (the onboarding page, the HTML report).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labkit.browser import (
    BROWSER_PROJECT,
    CHROMIUM,
    CHROMIUM_FLAGS,
    _kill_browsers_using,
    ensure_node_deps,
    proxy_flags,
    trust_cas,
)

SCRIPT = Path(__file__).with_name("browser_page.mjs")


@dataclass(frozen=True)
class PageView:
    status: int | None  # None for a file: URL
    title: str
    text: str
    links: list[dict[str, str]]
    images: list[dict[str, Any]]  # tag, width, height (rendered), loaded
    downloads: list[dict[str, str]]  # selector, url, filename, path


def view_page(
    url: str,
    *,
    proxy: str | None = None,
    trusted_cas: Sequence[Path] = (),
    screenshot: Path | None = None,
    download: Sequence[str] = (),
    download_dir: Path | None = None,
    size: tuple[int, int] = (1200, 900),
    timeout: float = 60.0,
) -> PageView:
    """Opens `url` in a fresh headless Chromium; `download`: CSS selectors of links to click,
    each of which must download a file (saved into `download_dir`)."""
    ensure_node_deps()
    with tempfile.TemporaryDirectory(prefix="reshape-page-", ignore_cleanup_errors=True) as tmp:
        scratch = Path(tmp)
        trust_cas(scratch / "home" / ".pki" / "nssdb", list(trusted_cas))
        request = {
            "url": url,
            "nodeProject": str(BROWSER_PROJECT),
            "executablePath": str(CHROMIUM),
            "userDataDir": str(scratch / "profile"),
            "args": [*CHROMIUM_FLAGS, *proxy_flags(proxy)],
            "width": size[0],
            "height": size[1],
            "timeoutMs": round(timeout * 1000),
            "screenshot": str(screenshot) if screenshot else None,
            "download": list(download),
            "downloadDir": str(download_dir or scratch),
        }
        env = {**os.environ, "HOME": str(scratch / "home")}
        process = subprocess.Popen(
            ["node", str(SCRIPT)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            stdout, stderr = process.communicate(json.dumps(request), timeout=timeout + 30)
        finally:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.communicate()
                # Playwright starts Chromium in a process group of its own.
                _kill_browsers_using(scratch / "profile")
    lines = stdout.strip().splitlines()
    result = json.loads(lines[-1]) if lines else {"ok": False, "error": stderr[-2000:]}
    if not result.pop("ok"):
        raise AssertionError(f"Chromium could not show {url}: {result['error']}")
    return PageView(**result)
