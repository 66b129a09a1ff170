// The web console in Chromium, against a real console and agents that
// internal/test/browser started: it passes what they are in the
// environment. Each step logs "ok <step>" or fails the run, and saves a
// screenshot of the page it ends on.
import { launch, steady } from './browser.mjs';
import { join } from 'node:path';

const env = (k) => {
  const v = process.env[k];
  if (!v) throw new Error(`${k} is not set`);
  return v;
};
const url = env('EDGEBOX_URL');
const shots = env('EDGEBOX_SCREENSHOTS');
const firstBox = env('EDGEBOX_FIRST_BOX');

const browser = await launch();

let n = 0;
let failed = false;
const problems = [];

/** newPage opens a page in a fresh browser context (its own cookies). */
async function newPage() {
  // The console's certificate is its own CA's; the test trusts it as an
  // operator who pinned it would.
  const ctx = await browser.newContext({ ignoreHTTPSErrors: true, locale: 'en-US', timezoneId: 'Asia/Shanghai', viewport: { width: 1280, height: 800 } });
  const page = steady(await ctx.newPage());
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

// Rollouts: the tenant's rules (set by the test) ask for a second
// user's approval to start. The first rollout is approved by otto, an
// operator, paused, resumed and aborted with its moved box sent back;
// the second goes through both waves on the two real boxes.
const adminAuth = { Authorization: `Bearer ${env('EDGEBOX_ADMIN_TOKEN')}` };
const operator = await newPage();
let firstRollout = '';

await step(page, "the rollouts page: none yet, and the tenant's rules", async () => {
  // The release the rollouts move the clock to.
  const r = await page.request.post(`${url}/api/v1/apps/clock/releases`, {
    headers: adminAuth,
    data: { version: '1.1', runtime: 'process', image: '/bin/sh', args: ['-c', 'while :; do echo tick from the clock 1.1; sleep 1; done'], probes: [{ http: env('EDGEBOX_PROBE_URL') }] },
  });
  expect(r.ok(), `release 1.1: ${r.status()} ${await r.text()}`);
  await page.click('nav >> text=Rollouts');
  await page.waitForSelector('[data-testid=rollout-rules] [data-rule=approve-start]');
  expect((await page.textContent('[data-rule=approve-start]')) === 'required', 'approval to start is not shown as required');
  expect((await page.textContent('[data-rule=approve-first-wave]')) === 'not required', 'approval after the first wave');
  const policy = await page.textContent('[data-testid=policies] [data-policy="region west"]');
  expect(policy.includes('Asia/Shanghai') && policy.includes('workdays 01:00–05:00'), `policy ${policy}`);
  expect((await page.textContent('[data-testid=rollout-rules]')).includes('2026-10-01'), 'the holiday is not shown');
  await page.waitForSelector('text=No rollout yet.');
});

await step(page, "a bad rollout shows the console's message", async () => {
  await page.waitForSelector('[data-testid=rollout-form] select[name=to] option[value="1.1"]', { state: 'attached' });
  expect((await page.inputValue('[data-testid=rollout-form] select[name=app]')) === 'clock', 'the app picked');
  expect((await page.inputValue('[data-testid=rollout-form] select[name=from]')) === '1.0', 'from is not the release before the last');
  expect((await page.inputValue('[data-testid=rollout-form] select[name=to]')) === '1.1', 'to is not the last release');
  await page.fill('[data-testid=rollout-form] input[name=scope]', 'east');
  await page.fill('[data-testid=rollout-form] input[name=waves]', '1, 50%');
  await page.click('[data-testid=rollout-form] button[type=submit]');
  await page.waitForSelector('[data-testid=rollout-form-error]');
  const msg = await page.textContent('[data-testid=rollout-form-error]');
  expect(msg.includes('the last wave must be 100%'), `error ${msg}`);
  expect(new URL(page.url()).pathname === '/rollouts', `at ${page.url()}`);
});

await step(page, 'start a rollout from the form: it waits for an approval its maker may not give', async () => {
  await page.fill('[data-testid=rollout-form] input[name=waves]', '1, 100%');
  await page.fill('[data-testid=rollout-form] input[name=gate]', '10m');
  await page.fill('[data-testid=rollout-form] input[name=timeout]', '2m');
  await page.click('[data-testid=rollout-form] button[type=submit]');
  await page.waitForURL(/\/rollouts\/r-[0-9a-f]{12}$/);
  firstRollout = page.url();
  await page.waitForSelector('[data-testid=rollout-title] [data-state="awaiting-approval"]');
  expect((await page.textContent('[data-testid=rollout-reason]')).includes('approval to start'), 'no reason shown');
  const settings = await page.textContent('[data-testid=settings]');
  expect(settings.includes('1, 100%') && settings.includes('10m0s') && settings.includes('2m0s'), `settings ${settings}`);
  expect(await page.$(`[data-group=east] details[data-wave="1"] [data-box="${firstBox}"][data-phase=waiting]`), 'the first box is not in wave 1');
  expect((await page.$$('[data-group=east] details[data-wave="2"] [data-box]')).length === 1, 'wave 2 has not one box');
  await page.click('[data-action=approve]');
  await page.waitForSelector('[data-testid=rollout-error]');
  const msg = await page.textContent('[data-testid=rollout-error]');
  expect(msg.includes('another user must approve it'), `error ${msg}`);
  expect(await page.$('[data-testid=rollout-title] [data-state="awaiting-approval"]'), 'the state changed');
});

const watcher = await newPage();
await step(watcher, 'a viewer sees the rollout and no button', async () => {
  await watcher.goto(firstRollout);
  await login(watcher, env('EDGEBOX_VIEWER'), env('EDGEBOX_VIEWER_PASSWORD'));
  await watcher.waitForSelector('[data-testid=rollout-title] [data-state="awaiting-approval"]');
  expect(!(await watcher.$('[data-testid=rollout-actions]')), 'a viewer sees the rollout actions');
  await watcher.click('nav >> text=Rollouts');
  await watcher.waitForSelector('[data-testid=rollout-rules]');
  expect(!(await watcher.$('[data-testid=rollout-form]')), 'a viewer sees the new rollout form');
});
await watcher.context().close();

await step(operator, 'an operator approves it', async () => {
  await operator.goto(firstRollout);
  await login(operator, env('EDGEBOX_OPERATOR'), env('EDGEBOX_OPERATOR_PASSWORD'));
  await operator.click('[data-action=approve]');
  await operator.waitForSelector('[data-testid=rollout-title] [data-state=running]');
  expect((await operator.textContent('[data-testid=approvals]')).includes('otto · to start'), 'the approval is not listed');
});

await step(page, "the maker's page follows: the first wave's box runs 1.1 healthy and enters its gate", async () => {
  await page.waitForSelector('[data-testid=rollout-title] [data-state=running]');
  expect(!(await page.$('[data-testid=rollout-reason]')), 'a running rollout shows a reason');
  expect(!(await page.$('[data-testid=rollout-error]')), 'the refused approval is still shown');
  expect(await page.$('[data-group=east][data-current=yes]'), 'region east is not highlighted');
  await page.waitForSelector(`details[data-wave="1"] [data-box="${firstBox}"][data-phase=gating]`, { timeout: 60000 });
  expect(await page.$('details[data-wave="2"] [data-box][data-phase=waiting]'), 'the second wave moved');
  expect(await page.$eval('details[data-wave="2"]', (d) => !d.open && d.textContent.includes('not started')), 'the wave not started is not folded');
  const counts = await page.textContent('[data-testid=counts]');
  expect(counts.includes('1 waiting') && counts.includes('1 in their gate'), `counts ${counts}`);
});

await step(page, 'pause it with a reason, and resume it', async () => {
  await page.fill('[data-testid=rollout-actions] input[name=reason]', 'checking shop-1');
  await page.click('[data-action=pause]');
  await page.waitForSelector('[data-testid=rollout-title] [data-state=paused]');
  expect((await page.textContent('[data-testid=rollout-reason]')) === 'paused by admin: checking shop-1', 'the pause reason');
  expect(!(await page.$('[data-action=pause]')) && !(await page.$('[data-action=approve]')), 'a paused rollout offers pause or approve');
  await page.click('[data-action=resume]');
  await page.waitForSelector('[data-testid=rollout-title] [data-state=running]');
  expect(!(await page.$('[data-action=resume]')), 'a running rollout offers resume');
});

await step(page, 'abort it and send the moved box back', async () => {
  await page.check('[data-testid=rollout-actions] input[name=revert]');
  await page.click('[data-action=abort]');
  await page.waitForSelector('[data-testid=rollout-title] [data-state=aborted]');
  await page.waitForSelector(`[data-box="${firstBox}"] [data-testid=reverted]`);
  expect((await page.textContent('[data-testid=rollout-reason]')) === 'aborted by admin', 'the abort reason');
  expect(!(await page.$('[data-testid=rollout-actions]')), 'an aborted rollout offers actions');
  expect(!(await page.$('[data-group=east][data-current=yes]')), 'an aborted rollout highlights a group');
  expect((await page.textContent('[data-testid=counts]')).includes('1 sent back'), 'no box counted as sent back');
  // The box sent back runs 1.0 again, healthy, as the app's page shows.
  await page.click('nav >> text=Apps');
  await page.click('[data-testid=apps] >> text=clock');
  await page.waitForFunction(
    () => {
      const rows = [...document.querySelectorAll('[data-testid=app-status] tbody tr')];
      return rows.length === 2 && rows.every((r) => {
        const c = [...r.cells].map((td) => td.textContent);
        return c[1] === '1.0' && c[2] === '1.0' && c[4] === 'healthy';
      });
    },
    null,
    { timeout: 60000 },
  );
});

await step(page, 'a second rollout, approved by the operator, takes both boxes through their waves', async () => {
  await page.click('nav >> text=Rollouts');
  const id = new URL(firstRollout).pathname.split('/').pop();
  await page.waitForSelector(`[data-rollout="${id}"] [data-state=aborted]`);
  const row = await page.textContent(`[data-rollout="${id}"]`);
  expect(row.includes('1.0 → 1.1') && row.includes('regions east') && row.includes('0 of 2 done') && row.includes('admin'), `row ${row}`);
  await page.waitForSelector('[data-testid=rollout-form] select[name=to] option[value="1.1"]', { state: 'attached' });
  await page.fill('[data-testid=rollout-form] input[name=scope]', 'east');
  await page.fill('[data-testid=rollout-form] input[name=waves]', '1, 100%');
  await page.fill('[data-testid=rollout-form] input[name=gate]', '0s');
  await page.fill('[data-testid=rollout-form] input[name=timeout]', '2m');
  await page.click('[data-testid=rollout-form] button[type=submit]');
  await page.waitForURL((u) => /\/rollouts\/r-[0-9a-f]{12}$/.test(u.pathname) && u.href !== firstRollout);
  await operator.goto(page.url());
  await operator.click('[data-action=approve]');
  await page.waitForSelector('[data-testid=rollout-title] [data-state=done]', { timeout: 90000 });
  expect((await page.$$('[data-group=east] [data-box][data-phase=done]')).length === 2, 'not both boxes done');
  expect((await page.textContent('[data-testid=progress]')).includes('2 of 2 done'), 'the progress');
  expect((await page.textContent('[data-group=east] h3')).includes('through'), 'the group is not through');
  await page.click('nav >> text=Rollouts');
  await page.waitForSelector('[data-testid=rollouts] tbody tr:first-child [data-state=done]');
  expect((await page.$$('[data-testid=rollouts] tbody tr')).length === 2, 'not two rollouts listed');
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
  expect((await page.textContent('nav')).includes('分批发布'), 'the rollouts link is not translated');
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
