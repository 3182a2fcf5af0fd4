"""Done-when: `reshape report --html` rendered by headless Chromium shows both arms and their
charts; the screenshot is checked for content, not blankness."""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from reshape.report.charts import COLOURS
from tests.support.browser_page import view_page
from tests.support.reshape_process import REPO, RESHAPE

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def write_log(path: Path) -> None:
    rng = random.Random(11)
    arms = {"control": ("direct", 0.9, 0.030), "treatment": ("pooled", 0.2, 0.018)}
    with path.open("w") as log:
        for _ in range(300):
            for arm, (policy, new_share, latency) in arms.items():
                record = {
                    "time": "2026-01-01T00:00:00.000Z",
                    "policy": policy,
                    "arm": f"pool-vs-direct:{arm}",
                    "experiment": "pool-vs-direct",
                    "outcome": "ok",
                    "transaction_seconds": rng.expovariate(1 / latency),
                    "upstream_connection": "new" if rng.random() < new_share else "reused",
                    "queued": None,
                    "bytes": 2000 + rng.randint(0, 50),
                }
                log.write(json.dumps(record) + "\n")


def colour(hex_colour: str) -> tuple[int, int, int]:
    return tuple(int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))  # type: ignore[return-value]


def test_html_report_in_chromium_shows_both_arms_and_their_charts(tmp_path: Path) -> None:
    log, page = tmp_path / "requests.jsonl", tmp_path / "report.html"
    write_log(log)
    result = subprocess.run(
        [*RESHAPE, "report", "--experiment", "pool-vs-direct", "--log", str(log)]
        + ["--html", str(page)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    screenshot = tmp_path / "report.png"
    view = view_page(page.as_uri(), screenshot=screenshot, size=(1200, 900))
    assert view.title == "reshape report: pool-vs-direct"
    assert "control" in view.text and "treatment" in view.text
    assert "treatment − control" in view.text
    assert "upstream connections per request" in view.text
    charts = [i for i in view.images if i["tag"] == "img"]
    assert len(charts) == 7  # the latency distribution and one per measure with a value
    assert all(c["loaded"] and c["width"] > 400 and c["height"] > 200 for c in charts)

    with Image.open(screenshot) as image:
        pixels = np.asarray(image.convert("RGB"))
    assert pixels.shape[0] > 2000  # the whole page, tables and charts
    not_white = np.any(pixels < 245, axis=2).mean()
    assert not_white > 0.03, not_white  # text, tables and charts, not an empty page
    found = {tuple(p) for p in pixels.reshape(-1, 3)}
    # Both arms drawn in their colours (bars, curves, swatches in the table headings).
    for arm_colour in COLOURS[:2]:
        matching = np.all(pixels == colour(arm_colour), axis=2).sum()
        assert colour(arm_colour) in found and matching > 2000, arm_colour
