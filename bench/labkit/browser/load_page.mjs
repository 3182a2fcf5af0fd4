// Loads one page in the system Chromium and reports its timing and every response it received.
//
// Driven by bench/labkit/browser.py: a JSON request on stdin
//   {url, executablePath, userDataDir, args, timeoutMs}
// and one JSON line on stdout:
//   {ok: true, loadMs, fcpMs, resources: [{url, status, sha256, size}], failures: [text]}
//   {ok: false, error}
// Trust (the NSS database under $HOME) and the proxy (args) are set up by the caller.
import { createHash } from 'node:crypto';
import { chromium } from 'playwright-core';

async function readStdin() {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  return JSON.parse(Buffer.concat(chunks).toString('utf8'));
}

async function recordBody(response) {
  const entry = { url: response.url(), status: response.status(), sha256: '', size: 0 };
  try {
    const body = await response.body();
    entry.sha256 = createHash('sha256').update(body).digest('hex');
    entry.size = body.length;
  } catch (error) {
    // Redirects carry no body; anything else is a real failure to report.
    if (entry.status < 300 || entry.status >= 400) {
      entry.bodyError = String(error.message ?? error).split('\n')[0];
    }
  }
  return entry;
}

async function loadPage(request) {
  const context = await chromium.launchPersistentContext(request.userDataDir, {
    executablePath: request.executablePath,
    headless: true,
    args: request.args,
    timeout: request.timeoutMs,
  });
  try {
    const page = context.pages()[0] ?? (await context.newPage());
    const bodies = [];
    const failures = [];
    page.on('response', (response) => {
      if (/^https?:/.test(response.url())) bodies.push(recordBody(response));
    });
    page.on('requestfailed', (failed) => {
      failures.push(`${failed.url()}: ${failed.failure()?.errorText ?? 'failed'}`);
    });
    const deadline = Date.now() + request.timeoutMs;
    const response = await page.goto(request.url, { waitUntil: 'load', timeout: request.timeoutMs });
    if (response === null) throw new Error(`no response for ${request.url}`);
    if (response.status() >= 400) throw new Error(`${request.url} answered ${response.status()}`);
    // loadEventEnd is set only once the load handlers have returned, just after `load` fires.
    await page.waitForFunction(
      () => performance.getEntriesByType('navigation')[0]?.loadEventEnd > 0,
      undefined,
      { timeout: Math.max(1, deadline - Date.now()) },
    );
    const timing = await page.evaluate(() => {
      const navigation = performance.getEntriesByType('navigation')[0];
      const paint = performance.getEntriesByName('first-contentful-paint')[0];
      return {
        loadMs: navigation.loadEventEnd - navigation.startTime,
        fcpMs: paint ? paint.startTime : null,
      };
    });
    const resources = await Promise.all(bodies);
    for (const entry of resources) {
      if (entry.bodyError) failures.push(`${entry.url}: body unavailable: ${entry.bodyError}`);
      delete entry.bodyError;
    }
    return { ok: true, ...timing, resources, failures };
  } finally {
    await context.close();
  }
}

let result;
try {
  result = await loadPage(await readStdin());
} catch (error) {
  // Playwright colours its call log even when not on a terminal.
  result = { ok: false, error: String(error.message ?? error).replace(/\x1b\[[0-9;]*m/g, '') };
}
process.stdout.write(JSON.stringify(result) + '\n');
