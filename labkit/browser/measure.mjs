// One page load in a browser context the caller made, measured: shared by load_page.mjs (a fresh
// Chromium per load) and session.mjs (one Chromium, a fresh context per load).
//
// request: {url, timeoutMs, bodies?: bool (default true), doneGlobal?: name,
//           resourceTiming?: bool (default false)}
// result:  {ok: true, loadMs, fcpMs, resources: [{url, status, sha256, size, method, protocol,
//           connectionId}], failures: [text], doneMs?, timings?: [PerformanceResourceTiming],
//           navigation?: {connectEnd, requestStart, responseStart, responseEnd}}
// A cross-origin timing's requestStart and responseStart are 0 unless its origin sends
// Timing-Allow-Origin (the lab's origins do: labkit/origins.py, labkit/static_app.py).
// Without bodies, sha256 is empty and size is the sum of the decoded bytes Chromium reported as
// they arrived (DevTools Network.dataReceived), which costs far less than reading bodies back.
import { createHash } from 'node:crypto';

async function recordBody(response) {
  const entry = {
    url: response.url(),
    status: response.status(),
    sha256: '',
    size: 0,
    method: response.request().method(),
  };
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

// Responses as DevTools reports them, by request id: no body is ever copied out of Chromium.
async function watchNetwork(context, page) {
  const cdp = await context.newCDPSession(page);
  const byId = new Map();
  cdp.on('Network.requestWillBeSent', (event) => {
    byId.set(event.requestId, {
      url: event.request.url,
      status: 0,
      sha256: '',
      size: 0,
      method: event.request.method,
      protocol: '',
      connectionId: 0,
    });
  });
  cdp.on('Network.responseReceived', (event) => {
    const entry = byId.get(event.requestId);
    if (entry === undefined) return;
    entry.url = event.response.url;
    entry.status = event.response.status;
    entry.protocol = event.response.protocol ?? '';
    entry.connectionId = event.response.connectionId ?? 0;
  });
  cdp.on('Network.dataReceived', (event) => {
    const entry = byId.get(event.requestId);
    if (entry !== undefined) entry.size += event.dataLength;
  });
  await cdp.send('Network.enable');
  return () =>
    [...byId.values()].filter((entry) => entry.status > 0 && /^https?:/.test(entry.url));
}

export async function measure(context, page, request) {
  if (request.resourceTiming) {
    // The default buffer of 250 entries would drop the rest of a busy page's resources.
    await context.addInitScript(() => performance.setResourceTimingBufferSize(100000));
  }
  const bodies = [];
  const failures = [];
  let networkEntries = null;
  if (request.bodies === false) {
    networkEntries = await watchNetwork(context, page);
  } else {
    page.on('response', (response) => {
      if (/^https?:/.test(response.url())) bodies.push(recordBody(response));
    });
  }
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
  if (request.doneGlobal) {
    // The page's own "finished" mark, for work (XHRs) that does not delay `load`.
    const done = await page.waitForFunction(
      (name) => {
        const value = window[name];
        return typeof value === 'number' || typeof value === 'string' ? { value } : false;
      },
      request.doneGlobal,
      { timeout: Math.max(1, deadline - Date.now()) },
    );
    const { value } = await done.jsonValue();
    if (typeof value === 'string') failures.push(`page reported: ${value}`);
    else timing.doneMs = value;
  }
  if (request.resourceTiming) {
    // The HTML's own exchange: when its connection was ready (TCP and TLS, or through a proxy
    // the tunnel and TLS), its request went out, and its first and last bytes came back.
    timing.navigation = await page.evaluate(() => {
      const entry = performance.getEntriesByType('navigation')[0];
      return {
        connectEnd: entry.connectEnd,
        requestStart: entry.requestStart,
        responseStart: entry.responseStart,
        responseEnd: entry.responseEnd,
      };
    });
    timing.timings = await page.evaluate(() =>
      performance.getEntriesByType('resource').map((entry) => ({
        name: entry.name,
        initiatorType: entry.initiatorType,
        startTime: entry.startTime,
        requestStart: entry.requestStart,
        responseStart: entry.responseStart,
        responseEnd: entry.responseEnd,
        nextHopProtocol: entry.nextHopProtocol,
        transferSize: entry.transferSize,
      })),
    );
  }
  const resources = networkEntries !== null ? networkEntries() : await Promise.all(bodies);
  for (const entry of resources) {
    if (entry.bodyError) failures.push(`${entry.url}: body unavailable: ${entry.bodyError}`);
    delete entry.bodyError;
  }
  return { ok: true, ...timing, resources, failures };
}

export function errorResult(error) {
  // Playwright colours its call log even when not on a terminal.
  return { ok: false, error: String(error.message ?? error).replace(/\x1b\[[0-9;]*m/g, '') };
}
