"""One page load in headless Chromium, with the timings bench/ttfb reports.

Like labkit/browser.load_page (same Chromium, flags, fresh profile and NSS database that
trusts only the given CAs), but it also reads, from the page itself, when the first bytes of the
HTML were usable: the page's first element is an inline script that sets a performance mark, so
the mark's time is when the parser had the HTML's first bytes — decrypted, which needs the whole
TLS record that carried them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from labkit.browser import PageLoadError, drive_page_load

FIRST_BYTES_MARK = "ttfb-first-bytes"
_SHUTDOWN_GRACE = 20.0

# run_driver runs it in the browser project, where 'playwright-core' resolves.
_DRIVER = r"""
import { createHash } from 'node:crypto';
import { chromium } from 'playwright-core';

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const request = JSON.parse(Buffer.concat(chunks).toString('utf8'));
let result;
try {
  const context = await chromium.launchPersistentContext(request.userDataDir, {
    executablePath: request.executablePath, headless: true, args: request.args,
    timeout: request.timeoutMs,
  });
  try {
    const page = context.pages()[0] ?? (await context.newPage());
    const bodies = [];
    const failures = [];
    page.on('response', (response) => {
      const digest = (body) => createHash('sha256').update(body).digest('hex');
      bodies.push(response.body().then(
        (body) => [response.url(), response.status(), digest(body)],
        (error) => [response.url(), response.status(), `unavailable: ${error.message}`],
      ));
    });
    page.on('requestfailed', (r) => failures.push(`${r.url()}: ${r.failure()?.errorText}`));
    const response = await page.goto(
      request.url, { waitUntil: 'load', timeout: request.timeoutMs },
    );
    if (response?.status() !== 200) throw new Error(`page answered ${response?.status()}`);
    // A busy machine may paint only after the load event.
    await page.waitForFunction(
      () => performance.getEntriesByType('navigation')[0]?.loadEventEnd > 0
        && performance.getEntriesByName('first-contentful-paint').length > 0,
      undefined, { timeout: request.timeoutMs, polling: 50 },
    );
    const timing = await page.evaluate((markName) => {
      const navigation = performance.getEntriesByType('navigation')[0];
      const mark = performance.getEntriesByName(markName)[0];
      const paint = performance.getEntriesByName('first-contentful-paint')[0];
      return {
        responseStartMs: navigation.responseStart,
        firstBytesMs: mark ? mark.startTime : null,
        fcpMs: paint ? paint.startTime : null,
        htmlEndMs: navigation.responseEnd,
        loadMs: navigation.loadEventEnd,
      };
    }, request.mark);
    result = { ok: true, ...timing, resources: await Promise.all(bodies), failures };
  } finally {
    await context.close();
  }
} catch (error) {
  result = { ok: false, error: String(error.message ?? error).replace(/\x1b\[[0-9;]*m/g, '') };
}
process.stdout.write(JSON.stringify(result) + '\n');
"""


@dataclass(frozen=True)
class PageTiming:
    """Milliseconds from navigation start (Navigation Timing's startTime)."""

    first_bytes_ms: float  # the HTML's first bytes reached the parser
    response_start_ms: float  # the HTML's response head arrived
    fcp_ms: float  # first contentful paint
    html_end_ms: float  # the HTML's last byte arrived
    load_ms: float  # load event end

    @property
    def head_to_first_bytes_ms(self) -> float:
        """From the response head to the first usable body bytes: what the first record costs,
        without the noise of connection set-up."""
        return self.first_bytes_ms - self.response_start_ms


def timed_load(
    url: str, *, proxy: str, trusted_ca: Path, expected: dict[str, str], timeout: float = 90.0
) -> PageTiming:
    """Loads `url` through `proxy`; raises PageLoadError unless every response in `expected`
    (URL → sha256 of its body) arrived intact, with nothing else failing."""
    stdout, stderr = drive_page_load(
        ["--input-type=module", "-e", _DRIVER],
        url,
        proxy=proxy,
        trusted_cas=[trusted_ca],
        timeout=timeout,
        mark=FIRST_BYTES_MARK,
    )
    try:
        result = json.loads(stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        raise PageLoadError(
            f"loading {url}: no result from the driver:\n{(stdout + stderr)[-2000:]}"
        ) from None
    if not result["ok"]:
        raise PageLoadError(f"loading {url} failed: {result['error']}")
    received = {resource_url: digest for resource_url, _, digest in result["resources"]}
    problems = list(result["failures"])
    problems += [f"{u}: missing or altered" for u, d in expected.items() if received.get(u) != d]
    if problems:
        raise PageLoadError(f"loading {url}: " + "; ".join(problems))
    if result["firstBytesMs"] is None or result["fcpMs"] is None:
        raise PageLoadError(f"loading {url}: Chromium reported no first-bytes mark or no FCP")
    return PageTiming(
        first_bytes_ms=result["firstBytesMs"],
        response_start_ms=result["responseStartMs"],
        fcp_ms=result["fcpMs"],
        html_end_ms=result["htmlEndMs"],
        load_ms=result["loadMs"],
    )
