// Many page loads in one system Chromium, each in a fresh browser context: its own empty cache,
// cookies, storage and connection pools, as a fresh profile would have, without the second or
// two a browser launch costs.
//
// Driven by labkit/browser.py (BrowserSession). The first line on stdin is
//   {executablePath, args}
// then one JSON line per load, {url, proxy: "http://HOST:PORT" | null, timeoutMs, bodies?,
// doneGlobal?, resourceTiming?}, each answered with one JSON line on stdout as in measure.mjs.
// Trust (the NSS database under $HOME) is set up by the caller.
import { createInterface } from 'node:readline';
import { chromium } from 'playwright-core';
import { errorResult, measure } from './measure.mjs';

const lines = createInterface({ input: process.stdin, crlfDelay: Infinity })[Symbol.asyncIterator]();
const setup = JSON.parse((await lines.next()).value);
const browser = await chromium.launch({
  executablePath: setup.executablePath,
  headless: true,
  args: setup.args,
});
process.stdout.write(JSON.stringify({ ok: true, ready: true }) + '\n');

async function loadOne(request) {
  // Playwright proxies loopback too (it adds <-loopback> to the context's bypass list).
  const context = await browser.newContext(
    request.proxy ? { proxy: { server: request.proxy } } : {},
  );
  try {
    const page = await context.newPage();
    return await measure(context, page, request);
  } finally {
    await context.close();
  }
}

try {
  for (;;) {
    const next = await lines.next();
    if (next.done) break;
    let result;
    try {
      result = await loadOne(JSON.parse(next.value));
    } catch (error) {
      result = errorResult(error);
    }
    process.stdout.write(JSON.stringify(result) + '\n');
  }
} finally {
  await browser.close();
}
