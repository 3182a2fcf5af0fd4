// Opens one page in the system Chromium (playwright-core from labkit/browser) and reports what a
// user sees: status, text, links, images and SVGs with their rendered sizes; optionally a
// full-page screenshot and the files that clicking given links downloads.
//
// Driven by tests/support/browser_page.py: a JSON request on stdin, one JSON line on stdout.
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';

const request = JSON.parse(readFileSync(0, 'utf8'));
const require = createRequire(request.nodeProject + '/');
const { chromium } = require('playwright-core');

async function inspect() {
  const context = await chromium.launchPersistentContext(request.userDataDir, {
    executablePath: request.executablePath,
    headless: true,
    args: request.args,
    acceptDownloads: true,
    viewport: { width: request.width, height: request.height },
  });
  try {
    const page = await context.newPage();
    const response = await page.goto(request.url, { waitUntil: 'load', timeout: request.timeoutMs });
    const result = {
      status: response ? response.status() : null,
      title: await page.title(),
      text: await page.innerText('body'),
      links: await page.$$eval('a', (as) =>
        as.map((a) => ({ id: a.id, href: a.href, text: a.textContent.trim() }))),
      images: await page.$$eval('img, body svg', (elements) =>
        elements.map((e) => {
          const box = e.getBoundingClientRect();
          return {
            tag: e.tagName.toLowerCase(),
            width: box.width,
            height: box.height,
            loaded: e.tagName.toLowerCase() !== 'img' || (e.complete && e.naturalWidth > 0),
          };
        })),
      downloads: [],
    };
    if (request.screenshot) await page.screenshot({ path: request.screenshot, fullPage: true });
    for (const selector of request.download) {
      const [download] = await Promise.all([page.waitForEvent('download'), page.click(selector)]);
      const path = `${request.downloadDir}/${download.suggestedFilename()}`;
      await download.saveAs(path);
      result.downloads.push({ selector, url: download.url(), filename: download.suggestedFilename(), path });
    }
    return result;
  } finally {
    await context.close();
  }
}

let result;
try {
  result = { ok: true, ...(await inspect()) };
} catch (error) {
  result = { ok: false, error: String(error.message ?? error).replace(/\x1b\[[0-9;]*m/g, '') };
}
process.stdout.write(JSON.stringify(result) + '\n');
