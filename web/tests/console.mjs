// The web console in Chromium, against a real console and agents that
// internal/test/browser started: it passes what they are in the
// environment. Each step logs "ok <step>" or fails the run, and saves a
// screenshot of the page it ends on.
import { chromium } from 'playwright-core';
import { join } from 'node:path';

const env = (k) => {
  const v = process.env[k];
  if (!v) throw new Error(`${k} is not set`);
  return v;
};
const url = env('EDGEBOX_URL');
const shots = env('EDGEBOX_SCREENSHOTS');
const firstBox = env('EDGEBOX_FIRST_BOX');

const browser = await chromium.launch({
  executablePath: process.env.EDGEBOX_CHROMIUM || '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update', '--disable-sync', '--no-first-run'],
});

let n = 0;
let failed = false;
const problems = [];

/** newPage opens a page in a fresh browser context (its own cookies). */
async function newPage() {
  // The console's certificate is its own CA's; the test trusts it as an
  // operator who pinned it would.
  const ctx = await browser.newContext({ ignoreHTTPSErrors: true, locale: 'en-US', timezoneId: 'Asia/Shanghai', viewport: { width: 1280, height: 800 } });
  const page = await ctx.newPage();
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
  try {
    await fn();
    if (problems.length) throw new Error(problems.splice(0).join('; '));
    console.log(`ok ${name}`);
  } catch (e) {
    failed = true;
    console.log(`FAIL ${name}: ${e.message}`);
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
  await page.fill('input[name=user]', user);
  await page.fill('input[name=password]', password);
  await page.click('button[type=submit]');
}

const page = await newPage();

await step(page, 'a page asks to log in first, with a strict CSP', async () => {
  const resp = await page.goto(`${url}/boxes/${firstBox}`);
  const csp = resp.headers()['content-security-policy'] || '';
  expect(csp.includes("script-src 'self'") && !csp.includes('unsafe-inline'), `CSP ${csp}`);
  await page.waitForSelector('[data-testid=login-form]');
  expect(page.url().includes('/login?next='), `at ${page.url()}`);
});

await step(page, 'log in and land where we were going', async () => {
  await login(page, 'admin', env('EDGEBOX_ADMIN_PASSWORD'));
  await page.waitForSelector('[data-testid=box-name]');
  expect((await page.textContent('[data-testid=box-name]')).includes('shop-1-box'), 'not on the box page');
  expect(new URL(page.url()).pathname === `/boxes/${firstBox}`, `at ${page.url()}`);
  const facts = await page.textContent('.facts');
  expect(facts.includes('Address seen127.0.0.1'), `facts ${facts}`);
});

await step(page, 'the fleet, with hostile labels shown as text', async () => {
  await page.click('nav >> text=Fleet');
  await page.waitForSelector('[data-box="shop-1-box"]');
  const row = await page.textContent('[data-box="shop-1-box"]');
  expect(row.includes('<img src=x onerror="window.__xss=1">'), `row ${row}`);
  expect((await page.evaluate(() => window.__xss)) === undefined, 'the label ran as markup');
  const counts = await page.textContent('[data-testid=fleet-counts]');
  expect(counts.includes('1 online') && counts.includes('1 waiting'), `counts ${counts}`);
  await page.fill('[data-testid=search]', 'shop-2');
  await page.waitForFunction(() => document.querySelector('[data-testid=shown]')?.textContent?.startsWith('1 of 2'));
  await page.fill('[data-testid=search]', '');
});

await step(page, 'create an enrollment token and read its install lines', async () => {
  await page.click('nav >> text=Enroll a box');
  await page.fill('input[name=region]', 'west');
  await page.fill('input[name=site]', 'shop-9');
  await page.click('[data-testid=enroll-form] button[type=submit]');
  await page.waitForSelector('[data-testid=install-linux]');
  const linux = await page.textContent('[data-testid=install-linux]');
  const windows = await page.textContent('[data-testid=install-windows]');
  expect(linux.includes('install.sh') && linux.includes('ebx1.'), `linux line ${linux}`);
  expect(windows.includes('install.ps1'), `windows line ${windows}`);
});

await step(page, 'approve the waiting box and watch it come online without reloading', async () => {
  await page.click('nav >> text=Waiting room');
  await page.waitForSelector('[data-testid=waiting] [data-box="shop-2-box"]');
  await page.click('[data-box="shop-2-box"] >> text=Approve');
  await page.waitForSelector('[data-testid=done]');
  await page.click('nav >> text=Fleet');
  await page.waitForFunction(() => document.querySelector('[data-testid=fleet-counts]')?.textContent?.startsWith('2 online'), null, {
    timeout: 30000,
  });
});

await step(page, "a bad release shows the console's message by field", async () => {
  await page.click('nav >> text=Apps');
  await page.fill('[data-testid=app-form] input[name=app]', 'clock');
  await page.click('[data-testid=app-form] button[type=submit]');
  await page.click('[data-testid=apps] >> text=clock');
  await page.waitForSelector('[data-testid=release-form]');
  await page.fill('[data-testid=release-form] input[name=version]', 'not a version!');
  await page.click('[data-testid=release-form] button[type=submit]');
  await page.waitForSelector('[data-field-error=version]');
  expect(await page.$('[data-field-error=image]'), 'no message under the image field');
});

await step(page, 'one-click deploy to a region: see the impact, confirm, watch both boxes run and turn healthy', async () => {
  await page.fill('[data-testid=release-form] input[name=version]', '1.0');
  await page.selectOption('[data-testid=release-form] select[name=runtime]', 'process');
  await page.fill('[data-testid=release-form] input[name=image]', '/bin/sh');
  await page.fill('[data-testid=release-form] textarea[name=args]', '-c\nwhile :; do echo tick from the clock; echo \'<img src=x onerror="window.__xss=2">\'; sleep 1; done');
  await page.fill('[data-testid=release-form] input[name=probe]', env('EDGEBOX_PROBE_URL'));
  await page.click('[data-testid=release-form] button[type=submit]');
  await page.waitForSelector('[data-testid=releases] [data-release="1.0"]');
  await page.click('[data-testid=scope-tree] >> text=region east');
  await page.waitForSelector('[data-testid=impact]');
  const impact = await page.textContent('[data-testid=impact]');
  expect(impact.includes('2 boxes, 0 offline, 0 without a free key'), `impact ${impact}`);
  await page.click('[data-testid=confirm-deploy]');
  await page.waitForSelector('[data-testid=deploy-result]');
  await page.waitForFunction(
    () => {
      const rows = [...document.querySelectorAll('[data-testid=app-status] tbody tr')];
      return rows.length === 2 && rows.every((r) => /Running/i.test(r.textContent) && r.textContent.includes('healthy') && !r.textContent.includes('unhealthy'));
    },
    null,
    { timeout: 90000 },
  );
});

await step(page, 'the app × box matrix', async () => {
  await page.click('nav >> text=Status matrix');
  await page.waitForFunction(() => {
    const rows = [...document.querySelectorAll('[data-testid=matrix] tbody tr')];
    return rows.length === 2 && rows.every((r) => r.textContent.includes('Running') && r.textContent.includes('healthy'));
  });
});

await step(page, "read a workload's logs", async () => {
  await page.goto(`${url}/boxes/${firstBox}`);
  await page.click('[data-workload=clock] >> text=Logs');
  await page.waitForFunction(() => document.querySelector('[data-testid=logs]')?.textContent?.includes('tick from the clock'), null, { timeout: 20000 });
  const text = await page.textContent('[data-testid=logs]');
  expect(text.includes('<img src=x onerror="window.__xss=2">'), 'the log line with markup is not shown as text');
  expect((await page.evaluate(() => window.__xss)) === undefined, 'a log line ran as markup');
});

await step(page, 'label a key and lease it to a robot, and read its history', async () => {
  await page.click('nav >> text=Keys');
  await page.waitForSelector('[data-testid=keys] [data-key]');
  const row = await page.textContent('[data-testid=keys] [data-key]');
  expect(row.includes('ICBC <b>U-Key</b>'), `a key's product with markup is not shown as text: ${row}`);
  await page.fill('[data-testid=key-label]', 'bank=icbc');
  await page.click('[data-testid=keys] button:text-is("Label")');
  await page.waitForFunction(() => document.querySelector('[data-testid=keys] [data-key]')?.textContent?.includes('bank=icbc'));
  await page.fill('[data-testid=key-workload]', 'robot');
  await page.click('[data-testid=keys] button:text-is("Lease")');
  await page.waitForSelector('[data-testid=keys] button:text-is("Release")');
  await page.click('[data-testid=keys] [data-key] a');
  await page.waitForSelector('[data-testid=key-history] >> text=robot');
});

await step(page, 'find what was done in the audit page, and export it', async () => {
  await page.click('nav >> text=Audit');
  await page.waitForSelector('[data-testid=audit] [data-action="key.lease"]');
  for (const a of ['token.create', 'box.approve', 'key.label', 'user.login', 'app.deploy', 'release.create']) {
    expect(await page.$(`[data-testid=audit] [data-action="${a}"]`), `no ${a} in the audit page`);
  }
  await page.fill('[data-testid=audit-filter] input[name=action]', 'key.');
  await page.click('[data-testid=audit-filter] button[type=submit]');
  await page.waitForFunction(() => !document.querySelector('[data-testid=audit] [data-action="token.create"]'));
  const [download] = await Promise.all([page.waitForEvent('download'), page.click('[data-testid=export]')]);
  const path = join(shots, 'audit.csv');
  await download.saveAs(path);
  const csv = (await import('node:fs')).readFileSync(path, 'utf8');
  expect(csv.startsWith('seq,time,actor,action') && csv.includes('key.lease') && !csv.includes('token.create'), `csv ${csv}`);
});

await step(page, 'a cross-site change is refused', async () => {
  const status = await page.evaluate(async (id) => {
    const r = await fetch(`/api/v1/boxes/${id}/labels`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: '{"labels":{"x":"y"}}' });
    return r.status;
  }, firstBox);
  expect(status === 403, `a change without the CSRF token answered ${status}`);
});

await step(page, 'switch to Simplified Chinese', async () => {
  await page.click('nav >> text=Fleet');
  await page.waitForSelector('[data-box="shop-1-box"]');
  await page.selectOption('[data-testid=lang]', 'zh-CN');
  await page.waitForSelector('nav >> text=设备群');
  expect((await page.textContent('h1')) === '设备群', 'the heading is not translated');
  expect((await page.getAttribute('html', 'lang')) === 'zh-CN', 'html lang');
  await page.selectOption('[data-testid=lang]', 'en');
  await page.waitForSelector('nav >> text=Fleet');
});

await step(page, 'an ended session sends us to log in and back to the same page', async () => {
  await page.goto(`${url}/boxes/${firstBox}`);
  await page.waitForSelector('[data-testid=box-name]');
  // Logged out everywhere by another client (the admin's API token).
  const r = await page.request.post(`${url}/api/v1/logout/everywhere`, { headers: { Authorization: `Bearer ${env('EDGEBOX_ADMIN_TOKEN')}` } });
  expect(r.status() === 204, `logout everywhere: ${r.status()} ${await r.text()}`);
  await page.waitForSelector('[data-testid=expired]', { timeout: 15000 });
  await login(page, 'admin', env('EDGEBOX_ADMIN_PASSWORD'));
  await page.waitForSelector('[data-testid=box-name]');
  expect(new URL(page.url()).pathname === `/boxes/${firstBox}`, `back at ${page.url()}`);
});

await step(page, 'log out', async () => {
  await page.click('[data-testid=logout]');
  await page.waitForSelector('[data-testid=login-form]');
  await page.goto(`${url}/`);
  await page.waitForSelector('[data-testid=login-form]');
});

const viewer = await newPage();
await step(viewer, 'a viewer sees no button it may not use, and the API refuses anyway', async () => {
  await viewer.goto(`${url}/`);
  await login(viewer, env('EDGEBOX_VIEWER'), env('EDGEBOX_VIEWER_PASSWORD'));
  await viewer.waitForSelector('[data-box="shop-1-box"]');
  const nav = await viewer.textContent('nav');
  expect(!nav.includes('Waiting room') && !nav.includes('Enroll') && !nav.includes('Users'), `nav ${nav}`);
  await viewer.goto(`${url}/apps/clock`);
  await viewer.waitForSelector('[data-testid=releases] [data-release="1.0"]');
  expect(!(await viewer.$('[data-testid=deploy]')) && !(await viewer.$('[data-testid=release-form]')), 'a viewer sees the deploy panel');
  expect(!(await viewer.$('[data-testid=pins] button')), 'a viewer sees an undeploy button');
  const status = await viewer.evaluate(async (id) => {
    const me = await (await fetch('/api/v1/me')).json();
    const r = await fetch(`/api/v1/boxes/${id}/approve`, { method: 'POST', headers: { 'X-CSRF-Token': me.csrf } });
    return r.status;
  }, firstBox);
  expect(status === 403, `a viewer's approve answered ${status}`);
});

await browser.close();
console.log(`${n} steps passed`);
