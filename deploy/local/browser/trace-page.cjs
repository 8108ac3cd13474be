// Opens a trace page of the local Zipkin UI in a real browser (Debian's chromium, driven by
// playwright-core), waits for the named spans to be rendered as rows of the trace's
// timeline, saves a screenshot and prints what it found as one JSON line:
//   {"url": ..., "title": ..., "found": [...], "missing": [...], "screenshot": ...}
// It exits 0 whenever the page could be opened (the caller judges found and missing), and
// non-zero only when the browser itself failed.
//
// usage: NODE_PATH=.local/browser/node_modules node deploy/local/browser/trace-page.cjs \
//          URL SCREENSHOT.png TIMEOUT_MS 'service: span name'...
// Zipkin stores service and span names in lower case, so the rows are matched that way.
'use strict';

const { chromium } = require('playwright-core');

const BROWSER = process.env.HERALD_CHROMIUM || '/usr/bin/chromium';

async function main() {
  const [url, screenshot, timeoutArg, ...rows] = process.argv.slice(2);
  if (!url || !screenshot || !timeoutArg || rows.length === 0) {
    throw new Error('usage: trace-page.cjs URL SCREENSHOT TIMEOUT_MS ROW...');
  }
  const timeout = Number(timeoutArg);
  // Loading the page (and its scripts) has a bound of its own, so that a short wait for the
  // rows is spent on the rows only.
  const loadTimeout = 60000;
  // The flags this machine needs: no sandbox (root, no user namespaces), no GPU, and no
  // background traffic to the internet the machine does not have.
  const browser = await chromium.launch({
    executablePath: BROWSER,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking'],
  });
  try {
    const page = await browser.newPage({ viewport: { width: 1600, height: 1000 } });
    await page.goto(url, { waitUntil: 'load', timeout: loadTimeout });
    const deadline = Date.now() + timeout;
    const found = [];
    const missing = [];
    for (const row of rows.map((r) => r.toLowerCase())) {
      // A row of the timeline is a div that reads exactly "service: span name". The page's
      // title (an h6) repeats the root span's row, so headings do not count.
      const cell = page.getByText(row, { exact: true }).and(page.locator('div')).first();
      try {
        await cell.waitFor({ state: 'visible', timeout: Math.max(deadline - Date.now(), 1) });
        found.push(row);
      } catch (e) {
        if (e.name !== 'TimeoutError') throw e;
        missing.push(row);
      }
    }
    await page.screenshot({ path: screenshot, fullPage: true });
    const title = await page.title();
    process.stdout.write(JSON.stringify({ url, title, found, missing, screenshot }) + '\n');
  } finally {
    await browser.close();
  }
}

main().catch((e) => {
  process.stderr.write(`trace-page: ${e.stack || e}\n`);
  process.exit(2);
});
