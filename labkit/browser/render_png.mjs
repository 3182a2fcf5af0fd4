// Renders SVG documents to PNG files with the system Chromium (no plotting library needed).
//
// Driven by labkit/browser.py (render_svgs): a JSON request on stdin
//   {executablePath, args, jobs: [{svg: path, png: path, width, height}]}
// and one JSON line on stdout: {ok: true} or {ok: false, error}.
import { readFile } from 'node:fs/promises';
import { chromium } from 'playwright-core';

async function readStdin() {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  return JSON.parse(Buffer.concat(chunks).toString('utf8'));
}

async function render(request) {
  const browser = await chromium.launch({
    executablePath: request.executablePath,
    headless: true,
    args: request.args,
  });
  try {
    for (const job of request.jobs) {
      const context = await browser.newContext({
        viewport: { width: job.width, height: job.height },
        deviceScaleFactor: 1,
      });
      const page = await context.newPage();
      const svg = await readFile(job.svg, 'utf8');
      await page.setContent(`<!doctype html><body style="margin:0;background:#fff">${svg}</body>`);
      await page.screenshot({ path: job.png, clip: { x: 0, y: 0, width: job.width, height: job.height } });
      await context.close();
    }
  } finally {
    await browser.close();
  }
}

let result;
try {
  await render(await readStdin());
  result = { ok: true };
} catch (error) {
  result = { ok: false, error: String(error.message ?? error).replace(/\x1b\[[0-9;]*m/g, '') };
}
process.stdout.write(JSON.stringify(result) + '\n');
