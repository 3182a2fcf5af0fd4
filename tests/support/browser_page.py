"""What a page shows in the system Chromium: text, links, rendered images, a screenshot, the
files its links download — through a proxy or not, trusting exactly the given CAs.

The lab's runner (labkit/browser.py) measures page loads; this one looks at a page the way a
person does, for the pages reshape itself serves (the onboarding page, the HTML report).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labkit.browser import BROWSER_PROJECT, drive_page_load

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
    with tempfile.TemporaryDirectory(prefix="reshape-page-") as scratch:
        stdout, stderr = drive_page_load(
            [str(SCRIPT)],
            url,
            proxy=proxy,
            trusted_cas=list(trusted_cas),
            timeout=timeout,
            nodeProject=str(BROWSER_PROJECT),
            width=size[0],
            height=size[1],
            screenshot=str(screenshot) if screenshot else None,
            download=list(download),
            downloadDir=str(download_dir or scratch),
        )
    lines = stdout.strip().splitlines()
    result = json.loads(lines[-1]) if lines else {"ok": False, "error": stderr[-2000:]}
    if not result.pop("ok"):
        raise AssertionError(f"Chromium could not show {url}: {result['error']}")
    return PageView(**result)
