// Loads one page in the system Chromium and reports its timing and every response it received.
//
// Driven by labkit/browser.py: a JSON request on stdin
//   {url, executablePath, userDataDir, args, timeoutMs,
//    bodies?: bool (default true), doneGlobal?: name, resourceTiming?: bool (default false)}
// and one JSON line on stdout:
//   {ok: true, loadMs, fcpMs, resources: [...], failures: [text], doneMs?, timings?}
//   {ok: false, error}
// (fields as in measure.mjs, which does the measuring).
// Trust (the NSS database under $HOME) and the proxy (args) are set up by the caller.
import { chromium } from 'playwright-core';
import { errorResult, measure } from './measure.mjs';

async function readStdin() {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  return JSON.parse(Buffer.concat(chunks).toString('utf8'));
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
    return await measure(context, page, request);
  } finally {
    await context.close();
  }
}

let result;
try {
  result = await loadPage(await readStdin());
} catch (error) {
  result = errorResult(error);
}
process.stdout.write(JSON.stringify(result) + '\n');
