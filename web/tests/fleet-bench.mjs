// The fleet page with a large fleet, in Chromium: how long from opening
// the page to its first row of boxes, and how long each search takes to
// show its matches. BenchmarkWebFleet (internal/test/bench) runs it and
// prints what it measures as one JSON line.
import { launch, steady } from './browser.mjs';

const env = (k) => {
  const v = process.env[k];
  if (!v) throw new Error(`${k} is not set`);
  return v;
};
const url = env('EDGEBOX_URL');
const total = Number(env('EDGEBOX_BOXES'));

const browser = await launch();
const ctx = await browser.newContext({ ignoreHTTPSErrors: true, viewport: { width: 1280, height: 900 } });
const page = steady(await ctx.newPage());
await page.goto(`${url}/login`);
await page.fill('input[name=user]', env('EDGEBOX_USER'));
await page.fill('input[name=password]', env('EDGEBOX_PASSWORD'));
await page.click('button[type=submit]');
await page.waitForSelector('[data-box]', { timeout: 60000 });

// First render: a fresh load of the fleet page, logged in, until the first
// row shows.
await page.goto('about:blank');
const t0 = Date.now();
await page.goto(`${url}/`);
await page.waitForSelector('[data-box]', { timeout: 60000 });
const firstRender = Date.now() - t0;
const shown = await page.textContent('[data-testid=shown]');
if (!shown.includes(`of ${total}`)) throw new Error(`the page shows ${shown}, want ${total} boxes`);

// Searches: from the keystroke to the list showing the matches, timed in
// the page.
const searchMs = [];
for (const q of ['box-07', 'box-001', 'box-09999', 'nothing-matches-this', '']) {
  const ms = await page.evaluate(async (q) => {
    const input = document.querySelector('[data-testid=search]');
    const before = document.querySelector('[data-testid=shown]').textContent;
    const t = performance.now();
    input.value = q;
    input.dispatchEvent(new Event('input', { bubbles: true }));
    for (;;) {
      await new Promise((r) => requestAnimationFrame(() => r()));
      const now = document.querySelector('[data-testid=shown]').textContent;
      if (now !== before) return performance.now() - t;
      if (performance.now() - t > 5000) throw new Error(`the search ${q} changed nothing in 5 s`);
    }
  }, q);
  searchMs.push(Math.round(ms * 10) / 10);
}
await browser.close();
console.log(JSON.stringify({ first_render_ms: firstRender, search_ms: searchMs }));
