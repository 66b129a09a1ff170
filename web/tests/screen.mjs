// A VM's screen in Chromium, against a console and a box that
// internal/test/browser started, the box running a real QEMU guest: an
// admin opens the guest's screen from the box's page and finds it painted,
// then watches it view only and finds the same; the Sessions page lists
// both; on a box kept to four eyes the page offers to ask for approval,
// a second maintainer approves the request on the Sessions page, and the
// screen opens and paints; a screen asked for and closed before its
// approval ends its request; a viewer is offered no screen. Each step logs
// "ok <step>" or fails the run, and saves a screenshot of the page it ends
// on.
import { launch, steady } from './browser.mjs';
import { join } from 'node:path';

const env = (k) => {
  const v = process.env[k];
  if (!v) throw new Error(`${k} is not set`);
  return v;
};
const url = env('EDGEBOX_URL');
const shots = env('EDGEBOX_SCREENSHOTS');
const boxID = env('EDGEBOX_BOX');
const vm = env('EDGEBOX_WORKLOAD');

const browser = await launch();

let n = 0;
const problems = [];

/** newPage opens a page in a fresh browser context (its own cookies). */
async function newPage() {
  const ctx = await browser.newContext({ ignoreHTTPSErrors: true, locale: 'en-US', timezoneId: 'Asia/Shanghai', viewport: { width: 1280, height: 900 } });
  return watched(steady(await ctx.newPage()));
}

/** watched makes every dialog, CSP refusal and uncaught error on page a problem of the step. */
function watched(page) {
  page.on('dialog', (d) => {
    problems.push(`a dialog opened: ${d.message()}`);
    d.dismiss();
  });
  page.on('console', (m) => {
    if (m.type() === 'error' && /Content Security Policy|Refused to/.test(m.text())) problems.push(`CSP: ${m.text()}`);
  });
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  return page;
}

async function step(page, name, fn) {
  n++;
  const file = join(shots, `${String(n).padStart(2, '0')}-${name.replace(/[^a-z0-9]+/gi, '-')}.png`);
  let failed = false;
  try {
    await fn();
    if (problems.length) throw new Error(problems.splice(0).join('; '));
    console.log(`ok ${name}`);
  } catch (e) {
    failed = true;
    console.log(`FAIL ${name}: ${[e.message, ...problems.splice(0)].join('; ')}`);
  } finally {
    await page.screenshot({ path: file, fullPage: true }).catch(() => {});
  }
  if (failed) {
    await browser.close();
    process.exit(1);
  }
}

const expect = (cond, msg) => {
  if (!cond) throw new Error(msg);
};

async function login(page, user, password) {
  await page.goto(`${url}/`);
  await page.fill('input[name=user]', user);
  await page.fill('input[name=password]', password);
  await page.click('button[type=submit]');
  await page.waitForSelector('[data-testid=whoami]');
}

/**
 * painted reads the screen's canvas, as noVNC drew it, in the page: its
 * size, how many of its pixels are not black (lit), how many of those are
 * in its top eighth (top), and the size it is shown at.
 */
const painted = (page) =>
  page.evaluate(() => {
    const c = document.querySelector('[data-testid=screen] canvas');
    if (!c || c.width === 0 || c.height === 0) return { w: 0, h: 0, lit: 0, top: 0 };
    const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
    const topEnd = c.width * Math.floor(c.height / 8) * 4;
    let lit = 0;
    let top = 0;
    for (let i = 0; i < px.length; i += 4) {
      if (px[i + 3] === 0 || (px[i] | px[i + 1] | px[i + 2]) === 0) continue;
      lit++;
      if (i < topEnd) top++;
    }
    const r = c.getBoundingClientRect();
    const host = c.closest('.screenhost').getBoundingClientRect();
    return { w: c.width, h: c.height, lit, top, shownW: r.width, shownH: r.height, hostW: host.width, hostH: host.height };
  });

/**
 * waitPainted waits until the screen shows what the guest drew, and
 * returns what painted saw. The guest's firmware writes from the top
 * line down ("SeaBIOS (version …)", "Booting from ROM..."); a VM without
 * a display device shows QEMU's own one line in the middle of the
 * screen instead ("This VM has no graphic display device."), which
 * lights nothing in the top eighth.
 */
async function waitPainted(page, timeout = 30000) {
  const end = Date.now() + timeout;
  for (;;) {
    const p = await painted(page);
    if (p.lit > 200 && p.top > 50) return p;
    if (Date.now() > end) {
      const what = p.lit > 200 ? "only the middle of the screen is painted: QEMU's \"no graphic display device\", not the guest's" : 'the screen is not painted';
      throw new Error(`${what}: ${JSON.stringify(p)}`);
    }
    await page.waitForTimeout(250);
  }
}

/** shown waits until the screen is shown (want: running or watching), and fails with what the page says when it ends instead. */
async function shown(page, want) {
  const st = await page.waitForSelector(
    `[data-testid=screen-status]:is([data-state=${want}], [data-state=ended], [data-state=failed])`,
    { timeout: 30000 },
  );
  const state = await st.getAttribute('data-state');
  expect(state === want, `the screen is ${state}: ${await st.textContent()}`);
}

const row = `[data-workload="${vm}"]`;
const admin = await newPage();

await step(admin, "an admin opens the VM's screen from the box's page and sees it painted", async () => {
  await login(admin, env('EDGEBOX_ADMIN'), env('EDGEBOX_ADMIN_PASSWORD'));
  await admin.goto(`${url}/boxes/${boxID}`);
  await admin.waitForSelector(`${row} [data-testid=workload-screen]:not([disabled])`);
  const early = await admin.evaluate(() => performance.getEntriesByType('resource').filter((e) => /\/assets\/screen-/.test(e.name)).length);
  expect(early === 0, 'the screen code loaded before a screen was opened');
  await admin.click(`${row} [data-testid=workload-screen]`);
  await shown(admin, 'running');
  const title = await admin.textContent('[data-testid=screen] .termbar strong');
  expect(title.includes(vm) && title.startsWith('Screen of'), `the screen's title is ${title}`);
  const p = await waitPainted(admin);
  console.log(`  the screen: ${p.w}x${p.h}, ${p.lit} pixels lit, ${p.top} in its top eighth, shown at ${Math.round(p.shownW)}x${Math.round(p.shownH)} in ${Math.round(p.hostW)}x${Math.round(p.hostH)}`);
  // Scaled to fit its box: the whole screen, as large as the box allows.
  expect(p.shownW <= p.hostW + 1 && p.shownH <= p.hostH + 1, 'the screen is larger than its box');
  expect(p.shownW >= p.hostW - 2 || p.shownH >= p.hostH - 2, 'the screen does not fill its box in either direction');
  expect(await admin.isEnabled('[data-testid=screen-cad]'), 'no Ctrl-Alt-Del on an interactive screen');
  // Another VM's screen waits until this one is closed.
  expect(await admin.isDisabled(`${row} [data-testid=workload-watch-screen]`), 'a second screen may be opened beside the first');
});

await step(admin, 'the admin closes the screen and watches it view only: the same screen, and no Ctrl-Alt-Del', async () => {
  await admin.click('[data-testid=screen-close]');
  await admin.waitForSelector('[data-testid=screen]', { state: 'detached' });
  await admin.click(`${row} [data-testid=workload-watch-screen]:not([disabled])`);
  await admin.waitForSelector('[data-testid=screen][data-view-only=true]');
  await shown(admin, 'watching');
  const title = await admin.textContent('[data-testid=screen] .termbar strong');
  expect(title.startsWith('Watching the screen of'), `the view-only screen's title is ${title}`);
  const p = await waitPainted(admin);
  console.log(`  the screen, view only: ${p.w}x${p.h}, ${p.lit} pixels lit, ${p.top} in its top eighth`);
  expect(!(await admin.$('[data-testid=screen-cad]')), 'Ctrl-Alt-Del on a view-only screen');
  await admin.click('[data-testid=screen-close]');
  await admin.waitForSelector('[data-testid=screen]', { state: 'detached' });
});

await step(admin, 'the Sessions page lists both screens, the second view only, in English and Chinese', async () => {
  await admin.click('nav a[href="/sessions"]');
  const rows = `[data-testid=past-sessions] tr[data-user="${env('EDGEBOX_ADMIN')}"]`;
  await admin.waitForFunction((sel) => document.querySelectorAll(sel).length === 2, rows, { timeout: 20000 });
  const kinds = async () => admin.$$eval(`${rows} td:nth-child(4)`, (tds) => tds.map((td) => td.textContent));
  const en = await kinds();
  expect(JSON.stringify(en) === JSON.stringify(['screen, view only', 'screen']), `the kinds: ${JSON.stringify(en)}`);
  await admin.selectOption('[data-testid=lang]', 'zh-CN');
  await admin.waitForFunction(() => document.querySelector('h1')?.textContent === '远程会话');
  const zh = await kinds();
  expect(JSON.stringify(zh) === JSON.stringify(['屏幕（只读）', '屏幕']), `the kinds in Chinese: ${JSON.stringify(zh)}`);
  await admin.selectOption('[data-testid=lang]', 'en');
});

let request = '';
await step(admin, 'on a box kept to four eyes the page offers to ask for approval, and the admin asks', async () => {
  // The tenant keeps the box's site to four eyes: through the API, as the
  // page's own session.
  const status = await admin.evaluate(async (site) => {
    const me = await (await fetch('/api/v1/me')).json();
    const r = await fetch('/api/v1/session-rules', {
      method: 'PUT',
      headers: { 'Content-Type': 'application/json', 'X-CSRF-Token': me.csrf },
      body: JSON.stringify({ four_eyes: [{ site }] }),
    });
    return r.status;
  }, env('EDGEBOX_SITE'));
  expect(status === 200, `setting the session rules answered ${status}`);
  await admin.goto(`${url}/boxes/${boxID}`);
  await admin.click(`${row} [data-testid=workload-screen]:not([disabled])`);
  const st = await admin.waitForSelector('[data-testid=screen-status]:is([data-state=approval], [data-state=failed])', { timeout: 20000 });
  const text = await st.textContent();
  console.log(`  the page says: ${text}`);
  expect((await st.getAttribute('data-state')) === 'approval' && text.includes('approval'), `the refused screen is ${await st.getAttribute('data-state')}: ${text}`);
  expect(!(await admin.$('[data-testid=screen] canvas')), 'a refused screen shows a canvas');
  await admin.click('[data-testid=screen-ask]');
  const asking = await admin.waitForSelector('[data-testid=screen-asking]', { timeout: 10000 });
  request = await asking.getAttribute('data-request');
  const said = await asking.textContent();
  expect(/^s[0-9a-f]{15}$/.test(request) && said.includes(`request ${request}`) && said.includes(`edgebox session approve ${request}`), `the page waits with: ${said}`);
  expect((await admin.getAttribute('[data-testid=screen-status]', 'data-state')) === 'asking', 'the screen does not say it waits');
});

const second = await newPage();
await step(second, 'a second maintainer approves the request on the Sessions page, and the screen opens and paints', async () => {
  await login(second, env('EDGEBOX_MAINTAINER'), env('EDGEBOX_MAINTAINER_PASSWORD'));
  await second.click('nav a[href="/sessions"]');
  const live = `[data-testid=live-sessions] tr[data-session="${request}"]`;
  await second.waitForSelector(`${live} [data-testid=approve]`, { timeout: 20000 });
  const text = await second.textContent(live);
  expect(text.includes('screen') && text.includes('needs a second user') && text.includes(env('EDGEBOX_ADMIN')), `the request's row: ${text}`);
  // Until it is approved the page waits, asking every 2 s, and opens nothing.
  await admin.waitForTimeout(4500);
  expect((await admin.getAttribute('[data-testid=screen-status]', 'data-state')) === 'asking', 'the screen did not wait for its approval');
  await second.click(`${live} [data-testid=approve]`);
  await second.waitForSelector('[data-testid=done]');
  await shown(admin, 'running');
  const p = await waitPainted(admin);
  console.log(`  the approved screen: ${p.w}x${p.h}, ${p.lit} pixels lit, ${p.top} in its top eighth`);
  expect(!(await admin.$('[data-testid=screen-asking]')) && !(await admin.$('[data-testid=screen-approval]')), 'the open screen still says it waits');
  await admin.click('[data-testid=screen-close]');
  await admin.waitForSelector('[data-testid=screen]', { state: 'detached' });
});

await step(admin, 'a screen asked for and closed before its approval ends its request', async () => {
  await admin.click(`${row} [data-testid=workload-screen]:not([disabled])`);
  await admin.waitForSelector('[data-testid=screen-status][data-state=approval]', { timeout: 20000 });
  await admin.click('[data-testid=screen-ask]');
  const asking = await admin.waitForSelector('[data-testid=screen-asking]', { timeout: 10000 });
  const id = await asking.getAttribute('data-request');
  await admin.click('[data-testid=screen-close]');
  await admin.waitForSelector('[data-testid=screen]', { state: 'detached' });
  let r = {};
  for (let i = 0; i < 50 && !r.ended; i++) {
    await admin.waitForTimeout(100);
    r = await admin.evaluate(async (id) => (await fetch(`/api/v1/sessions/${id}`)).json(), id);
  }
  expect(r.ended && r.ended_by === `user:${env('EDGEBOX_ADMIN')}` && !r.approved_by, `the closed request: ${JSON.stringify(r)}`);
});

const viewer = await newPage();
await step(viewer, 'a viewer is offered no screen', async () => {
  await login(viewer, env('EDGEBOX_VIEWER'), env('EDGEBOX_VIEWER_PASSWORD'));
  await viewer.goto(`${url}/boxes/${boxID}`);
  await viewer.waitForSelector(row);
  expect(!(await viewer.$('[data-testid=workload-screen]')) && !(await viewer.$('[data-testid=workload-watch-screen]')), 'a viewer sees a Screen button');
  // The API refuses a viewer's screen before any WebSocket.
  const status = await viewer.evaluate(
    async ([id, w]) => (await fetch(`/api/v1/boxes/${id}/workloads/${w}/screen?view_only=1`)).status,
    [boxID, vm],
  );
  expect(status === 403, `a viewer's screen answered ${status}`);
});

await browser.close();
console.log(`${n} steps passed`);
