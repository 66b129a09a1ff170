// Remote sessions in Chromium, against a real console and a real agent
// that internal/test/browser started: an admin opens a shell on the box
// from its page, types in it and leaves it; the Sessions page shows how
// it ended; on a box kept to four eyes a maintainer approves a shell and
// watches it at the admin's terminal's size; the admin edits the session
// rules, which the maintainer only reads; the box page opens the box's
// own web page in a new tab; an auditor plays the recording and sees it
// intact; a viewer is offered no shell. Then alerts: the Go side set a
// rule that each box's certificate ends too soon, so an incident fires for
// each box; a maintainer silences one from its row and with the form,
// which a viewer only sees, and ends them; an admin edits the rules as
// JSON and tests the webhooks; the box page shows the box's health and
// vitals. Each step logs "ok <step>" or fails the run, and saves a
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
const boxID = env('EDGEBOX_BOX');

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

/** termRows is the text of each row the terminal draws. */
const termRows = (page) =>
  page.$$eval('[data-testid=terminal] .xterm-rows > div', (rows) => rows.map((r) => r.textContent.replace(/\u00a0/g, ' ')));

/** waitRow waits until the terminal draws a row that test accepts, and returns the rows. */
async function waitRow(page, what, test, timeout = 20000) {
  const end = Date.now() + timeout;
  for (;;) {
    const rows = await termRows(page);
    if (rows.some(test)) return rows;
    if (Date.now() > end) throw new Error(`no row ${what} in the terminal: ${JSON.stringify(rows.filter((r) => r.trim()))}`);
    await page.waitForTimeout(200);
  }
}

/** sttySize has the shell say its terminal's size, tagged, and returns it: [rows, cols]. */
let sizes = 0;
async function sttySize(page) {
  const tag = `size${++sizes}:`;
  await page.keyboard.type(`echo ${tag} $(stty size)`);
  await page.keyboard.press('Enter');
  const re = new RegExp(`^${tag} (\\d+) (\\d+)$`);
  const rows = await waitRow(page, `saying ${tag}`, (r) => re.test(r.trim()));
  return rows
    .map((r) => r.trim().match(re))
    .filter(Boolean)
    .pop()
    .slice(1)
    .map(Number);
}

const admin = await newPage();

await step(admin, 'an admin opens a shell on the box from its page and runs a command in it', async () => {
  await login(admin, 'admin', env('EDGEBOX_ADMIN_PASSWORD'));
  await admin.goto(`${url}/boxes/${boxID}`);
  await admin.waitForSelector('[data-testid=open-shell]:not([disabled])');
  const early = await admin.evaluate(() => performance.getEntriesByType('resource').filter((e) => /\/assets\/terminal-/.test(e.name)).length);
  expect(early === 0, 'the terminal code loaded before a shell was opened');
  await admin.click('[data-testid=open-shell]');
  await admin.waitForSelector('[data-testid=terminal] .xterm-rows');
  await admin.waitForSelector('[data-testid=term-status][data-state=running]', { timeout: 20000 });
  // The shell's prompt first, then the command, typed key by key.
  await waitRow(admin, 'with a prompt', (r) => /[#$]\s*$/.test(r));
  await admin.click('[data-testid=terminal] .xterm-screen');
  await admin.keyboard.type('echo hello');
  await admin.keyboard.press('Enter');
  await waitRow(admin, '"hello" alone', (r) => r.trim() === 'hello');
});

await step(admin, 'the terminal fills its box and follows the window: the box hears each new size', async () => {
  const [rows, cols] = await sttySize(admin);
  expect(cols > 100 && rows > 10, `the box's terminal is ${rows}x${cols}, not the page's`);
  await admin.setViewportSize({ width: 800, height: 900 });
  await admin.waitForTimeout(300);
  const [rows2, cols2] = await sttySize(admin);
  expect(cols2 < cols - 20 && rows2 === rows, `after a narrower window the box's terminal is ${rows2}x${cols2}, before ${rows}x${cols}`);
  await admin.setViewportSize({ width: 1280, height: 900 });
});

await step(admin, 'the Sessions page shows the open shell, in another tab, with its End button', async () => {
  const tab = watched(steady(await admin.context().newPage()));
  try {
    await tab.goto(`${url}/sessions`);
    const row = await tab.waitForSelector('[data-testid=live-sessions] tr[data-user=admin]');
    const text = await row.textContent();
    expect(text.includes('shell-box') && text.includes('the box itself') && text.includes('shell'), `live row ${text}`);
    expect((await row.$('[data-testid=end]')) && !(await row.$('[data-testid=approve]')), 'an admin sees no End, or an Approve, on their own shell');
    await tab.screenshot({ path: join(shots, `${String(n).padStart(2, '0')}b-live-session.png`), fullPage: true });
  } finally {
    await tab.close();
  }
});

await step(admin, 'leaving the shell ends the session, and the terminal says how', async () => {
  await admin.keyboard.type('exit');
  await admin.keyboard.press('Enter');
  await admin.waitForSelector('[data-testid=term-status][data-state=ended]', { timeout: 20000 });
  const status = await admin.textContent('[data-testid=term-status]');
  expect(status.includes('exit code 0'), `status ${status}`);
  await waitRow(admin, 'saying the session ended', (r) => r.includes('session ended: exit code 0'));
});

let sessionID = '';
await step(admin, 'the Sessions page shows the ended session and how it ended', async () => {
  await admin.click('nav a[href="/sessions"]');
  await admin.waitForSelector('[data-testid=past-sessions] tr[data-session]');
  const row = await admin.$('[data-testid=past-sessions] tr[data-user=admin][data-ended-by=exit]');
  expect(row, 'no past session of admin that exited');
  sessionID = await row.getAttribute('data-session');
  const text = await row.textContent();
  expect(text.includes('shell-box') && text.includes('the box itself') && text.includes('shell') && text.includes('exited with code 0'), `row ${text}`);
  // The live list loads on its own; it may be empty for a moment.
  const noneOpen = await admin.waitForFunction(
    () => document.querySelector('[data-testid=live-sessions] tbody')?.textContent.includes('No session is open'),
    null, { timeout: 10000 }).then(() => true, () => false);
  const live = await admin.textContent('[data-testid=live-sessions] tbody');
  expect(noneOpen, `live sessions: ${live}`);
  // In Chinese too.
  await admin.selectOption('[data-testid=lang]', 'zh-CN');
  await admin.waitForFunction(() => document.querySelector('h1')?.textContent === '远程会话');
  expect((await row.textContent()).includes('退出码 0'), 'the row in Chinese');
  await admin.selectOption('[data-testid=lang]', 'en');
});

await step(admin, 'a shell left open ends when its page is left', async () => {
  await admin.goto(`${url}/boxes/${boxID}`);
  await admin.click('[data-testid=open-shell]');
  await admin.waitForSelector('[data-testid=term-status][data-state=running]', { timeout: 20000 });
  // Left at its prompt: a shell killed while its login scripts run may
  // leave their locks behind on this machine.
  await waitRow(admin, 'with a prompt', (r) => /[#$]\s*$/.test(r));
  await admin.click('nav a[href="/sessions"]');
  await admin.waitForSelector('[data-testid=past-sessions] tr[data-ended-by="operator left"]', { timeout: 20000 });
  const text = await admin.textContent('[data-testid=past-sessions] tr[data-ended-by="operator left"]');
  expect(text.includes('the user left'), `row ${text}`);
});

// A box kept to four eyes: the admin's shell there waits until a second
// user, a maintainer, approves it; the maintainer then watches it and
// ends it.
const moneyBox = env('EDGEBOX_FOUR_EYES_BOX');
const second = await newPage();
await step(admin, 'a shell on a box kept to four eyes waits for a second user', async () => {
  await admin.goto(`${url}/boxes/${moneyBox}`);
  await admin.click('[data-testid=open-shell]');
  await admin.waitForSelector('[data-testid=term-status][data-state=waiting]', { timeout: 20000 });
  const msg = await admin.textContent('[data-testid=term-waiting]');
  expect(msg.includes('approval'), `the waiting shell says ${msg}`);
  await waitRow(admin, 'saying it waits', (r) => r.includes('approval'));
});

await step(second, 'the second user approves the shell and watches it, read only', async () => {
  await login(second, env('EDGEBOX_MAINTAINER'), env('EDGEBOX_MAINTAINER_PASSWORD'));
  await second.click('nav a[href="/sessions"]');
  const row = '[data-testid=live-sessions] tr[data-user=admin]';
  await second.waitForSelector(`${row} [data-testid=approve]`);
  expect((await second.textContent(row)).includes('needs a second user'), 'the row does not say it waits');
  await second.click(`${row} [data-testid=approve]`);
  await admin.waitForSelector('[data-testid=term-status][data-state=running]', { timeout: 20000 });
  await second.click(`${row} [data-testid=watch]`);
  await second.waitForSelector('[data-testid=term-status][data-state=watching]', { timeout: 20000 });
  await waitRow(admin, 'with a prompt', (r) => /[#$]\s*$/.test(r));
  await admin.click('[data-testid=terminal] .xterm-screen');
  await admin.keyboard.type('echo watched-by-two');
  await admin.keyboard.press('Enter');
  await waitRow(second, '"watched-by-two" alone', (r) => r.trim() === 'watched-by-two');
});

/** termSize is what a page's terminal says its size is, and how many rows it draws: [rows, cols, drawn]. */
const termSize = (page) =>
  page.$eval('[data-testid=terminal]', (el) => [Number(el.dataset.rows), Number(el.dataset.cols), el.querySelectorAll('.xterm-rows > div').length]);

await step(second, "the watching terminal has the operator's size, follows it, and not its own window", async () => {
  // The admin's window narrows: the box hears the new size, and so does
  // the watcher, whose own window stays wide.
  await admin.setViewportSize({ width: 800, height: 900 });
  await admin.waitForTimeout(300);
  const [rows, cols] = await sttySize(admin);
  const same = async (when) => {
    const end = Date.now() + 10000;
    let got;
    while (Date.now() < end) {
      got = await termSize(second);
      if (got[0] === rows && got[1] === cols && got[2] === rows) return;
      await second.waitForTimeout(200);
    }
    throw new Error(`${when} the watcher's terminal is ${got[0]}x${got[1]} (${got[2]} rows drawn), the operator's ${rows}x${cols}`);
  };
  await same('after the operator narrowed theirs');
  // A new size does not end the watch (the terminal takes it itself).
  const state = await second.getAttribute('[data-testid=term-status]', 'data-state');
  expect(state === 'watching', `after a resize the watcher's terminal is ${state}`);
  // The watcher's window changing does not fit it to its box again.
  await second.setViewportSize({ width: 1100, height: 700 });
  await second.waitForTimeout(500);
  await same("after the watcher's window changed");
  await second.setViewportSize({ width: 1280, height: 900 });
  await admin.setViewportSize({ width: 1280, height: 900 });
});

await step(admin, 'the second user ends the shell, and its terminal says who did', async () => {
  await second.click('[data-testid=live-sessions] tr[data-user=admin] [data-testid=end]');
  await admin.waitForSelector('[data-testid=term-status][data-state=ended]', { timeout: 20000 });
  const status = await admin.textContent('[data-testid=term-status]');
  expect(status.includes(`ended by ${env('EDGEBOX_MAINTAINER')}`), `status ${status}`);
  await second.waitForSelector('[data-testid=term-status][data-state=ended]', { timeout: 20000 });
});

const rulesBox = '[data-testid=session-rules]';
const fourEyesField = '[data-testid=rules-editor] textarea[name=four_eyes]';
const forwardsField = '[data-testid=rules-editor] textarea[name=forwards]';
await step(admin, 'an admin edits the session rules on the Sessions page; a line that is wrong saves nothing', async () => {
  await admin.goto(`${url}/sessions`);
  await admin.waitForSelector(`${rulesBox} [data-testid=four-eyes]`);
  const before = await admin.textContent(`${rulesBox} [data-testid=four-eyes]`);
  expect(before.includes('money=yes'), `the rules shown: ${before}`);
  const saved = () => admin.evaluate(async () => (await fetch('/api/v1/session-rules')).text());
  const was = await saved();
  await admin.click('[data-testid=rules-edit]');
  expect((await admin.inputValue(fourEyesField)) === 'money=yes', `the editor starts with ${await admin.inputValue(fourEyesField)}`);
  // A line the page cannot read: named by its number, nothing sent.
  await admin.fill(fourEyesField, 'money=yes\nshop-9');
  await admin.click('[data-testid=rules-save]');
  let err = await (await admin.waitForSelector('[data-testid=rules-error]')).textContent();
  expect(err.includes('line 2') && err.includes('"shop-9"'), `the error says ${err}`);
  // A target only the console knows is wrong: its message, nothing saved.
  await admin.fill(fourEyesField, 'money=yes\nsite:shop-9 city="new york"');
  await admin.fill(forwardsField, 'site shop-1: bad_host!:80');
  await admin.click('[data-testid=rules-save]');
  await admin.waitForFunction(() => /bad_host!/.test(document.querySelector('[data-testid=rules-error]')?.textContent ?? ''), null, { timeout: 10000 });
  err = await admin.textContent('[data-testid=rules-error]');
  expect(!err.includes('line'), `the page, not the console, refused: ${err}`);
  expect((await saved()) === was, 'a refused edit changed the rules');
  // Then right: saved, and shown with who saved them.
  await admin.fill(forwardsField, `site shop-1: 192.168.1.0/24:80, printer.lan:631\n\n# the box's own LAN\nbox ${boxID}: 10.1.2.3:8000-8080`);
  await admin.click('[data-testid=rules-save]');
  await admin.waitForSelector('[data-testid=rules-saved]');
  expect(!(await admin.$('[data-testid=rules-editor]')), 'the editor stays open after saving');
  await admin.waitForFunction(() => /by admin/.test(document.querySelector('[data-testid=rules-by]')?.textContent ?? ''), null, { timeout: 10000 });
  // The rules set before were an admin's too: wait for the new ones.
  await admin.waitForFunction((sel) => document.querySelector(sel)?.textContent.includes('site shop-9'), rulesBox, { timeout: 10000 }).catch(() => {});
  const shown = await admin.textContent(rulesBox);
  expect(shown.includes('city=new york, site shop-9') && shown.includes('192.168.1.0/24:80, printer.lan:631') && shown.includes('10.1.2.3:8000-8080'), `the rules shown: ${shown}`);
  // Edited again, they read as they were written (a value with a space quoted).
  await admin.click('[data-testid=rules-edit]');
  const again = [await admin.inputValue(fourEyesField), await admin.inputValue(forwardsField)];
  const want = ['money=yes\ncity="new york" site:shop-9', `site shop-1: 192.168.1.0/24:80, printer.lan:631\nbox ${boxID}: 10.1.2.3:8000-8080`];
  expect(JSON.stringify(again) === JSON.stringify(want), `the editor reads ${JSON.stringify(again)}`);
  await admin.click('[data-testid=rules-cancel]');
});

await step(second, 'a maintainer reads the session rules, with no editor', async () => {
  await second.goto(`${url}/sessions`);
  await second.waitForFunction((sel) => document.querySelector(sel)?.textContent.includes('site shop-9'), rulesBox, { timeout: 10000 });
  expect(!(await second.$('[data-testid=rules-edit]')) && !(await second.$(`${rulesBox} textarea`)), 'a maintainer may edit the rules');
});

await step(admin, "the box page opens a web page the box serves itself, in a new tab", async () => {
  const port = env('EDGEBOX_BOX_WEB_PORT');
  await admin.goto(`${url}/boxes/${boxID}`);
  await admin.waitForSelector('[data-testid=open-web]:not([disabled])');
  expect((await admin.inputValue('[data-testid=web-port]')) === '80', 'the port is not 80 at first');
  // A port that cannot be opens nothing, and says why.
  let tabs = 0;
  const count = () => tabs++;
  admin.context().on('page', count);
  await admin.fill('[data-testid=web-port]', '70000');
  await admin.click('[data-testid=open-web]');
  const err = await (await admin.waitForSelector('[data-testid=web-error]')).textContent();
  expect(err.includes('1 to 65535'), `the error says ${err}`);
  await admin.waitForTimeout(500);
  admin.context().off('page', count);
  expect(tabs === 0, 'a port out of range opened a tab');
  await admin.fill('[data-testid=web-port]', port);
  const [tab] = await Promise.all([admin.context().waitForEvent('page'), admin.click('[data-testid=open-web]')]);
  try {
    await tab.waitForLoadState();
    const path = new URL(tab.url()).pathname;
    expect(path === `/api/v1/boxes/${boxID}/web/${port}/`, `the tab opened ${tab.url()}`);
    const text = await tab.textContent('#greeting', { timeout: 10000 });
    expect(text === env('EDGEBOX_BOX_WEB_TEXT'), `the tab shows ${text}`);
    expect(await tab.evaluate(() => window.opener === null), "the box's page has a handle on the console's");
    await tab.screenshot({ path: join(shots, `${String(n).padStart(2, '0')}b-box-web-page.png`), fullPage: true });
  } finally {
    await tab.close();
  }
  expect(!(await admin.$('[data-testid=web-error]')), 'the error stays after a good port');
});

const viewer = await newPage();
await step(viewer, 'a viewer is offered no shell, and sees sessions without their buttons', async () => {
  await login(viewer, env('EDGEBOX_VIEWER'), env('EDGEBOX_VIEWER_PASSWORD'));
  await viewer.goto(`${url}/boxes/${boxID}`);
  await viewer.waitForSelector('[data-testid=box-name]');
  await viewer.waitForSelector('[data-testid=revision]');
  expect(!(await viewer.$('[data-testid=open-shell]')) && !(await viewer.$('[data-testid=workload-shell]')), 'a viewer sees an Open shell button');
  expect(!(await viewer.$('[data-testid=open-web]')), "a viewer sees an Open web page button");
  await viewer.goto(`${url}/sessions/${sessionID}`);
  await viewer.waitForSelector('[data-testid=session-facts]');
  expect(!(await viewer.$('[data-testid=play]')), 'a viewer sees Play recording');
  // The API refuses a viewer's shell before any WebSocket.
  const status = await viewer.evaluate(async (id) => (await fetch(`/api/v1/boxes/${id}/exec?tty=1`)).status, boxID);
  expect(status === 403, `a viewer's shell answered ${status}`);
});

const auditor = await newPage();
await step(auditor, 'an auditor opens the session and sees its recording intact', async () => {
  await login(auditor, env('EDGEBOX_AUDITOR'), env('EDGEBOX_AUDITOR_PASSWORD'));
  await auditor.click('nav a[href="/sessions"]');
  await auditor.click(`[data-testid=past-sessions] tr[data-session="${sessionID}"] [data-testid=session-link]`);
  await auditor.waitForSelector(`[data-testid=session][data-session="${sessionID}"]`);
  await auditor.waitForSelector('[data-testid=verify][data-ok=true]');
  const v = await auditor.textContent('[data-testid=verify]');
  expect(v.startsWith('Intact'), `verify says ${v}`);
  const href = await auditor.getAttribute('[data-testid=download]', 'href');
  expect(href === `/api/v1/sessions/${sessionID}/recording`, `download ${href}`);
});

await step(auditor, "the auditor plays the recording and sees the shell's output", async () => {
  await auditor.click('[data-testid=play]');
  // The player draws the recording's lines as it plays them; one that
  // cannot play says why.
  await auditor.waitForFunction(
    () =>
      document.querySelector('[data-testid=player] .error') ||
      [...document.querySelectorAll('[data-testid=player] .ap-line')].some((l) => l.textContent.trim() === 'hello'),
    null,
    { timeout: 30000 },
  );
  const failed = await auditor.$('[data-testid=player] .error');
  expect(!failed, `the player says: ${failed && (await failed.textContent())}`);
});

// Alerts. The Go side set the tenant's rules before the script: a box
// certificate that ends within 365 days (each does) fires at once, and
// is posted to a webhook that records what it takes.
const hookURL = env('EDGEBOX_WEBHOOK_URL');
const boxes = { 'shell-box': boxID, 'money-box': moneyBox };
const incident = (name) => `[data-testid=open-incidents] tr[data-kind=cert-expiry][data-box="${name}"]`;
const silenceRows = '[data-testid=silences] tr[data-silence]';
/** silencesNow are the tenant's silences as the API tells them to page. */
const silencesNow = (page) => page.evaluate(async () => (await (await fetch('/api/v1/silences')).json()).silences);
const hours = (s) => Math.round((new Date(s.until) - new Date(s.created_at)) / 3600e3);

await step(admin, 'the Alerts page lists a firing certificate incident for each box, and the rules in words', async () => {
  await admin.goto(`${url}/alerts`);
  for (const [name, id] of Object.entries(boxes)) {
    // The rules were set before the script: the evaluation they started
    // has run, or the next one (every 30 s) will.
    const row = await admin.waitForSelector(`${incident(name)}[data-state=firing]`, { timeout: 45000 });
    const text = await row.textContent();
    expect(text.includes('firing') && text.includes('certificate ending') && text.includes(`box ${name}`) && text.includes('its certificate ends'), `the row of ${name}: ${text}`);
    const href = await row.$eval('[data-testid=incident-box]', (a) => a.getAttribute('href'));
    expect(href === `/boxes/${id}`, `the row of ${name} links to ${href}`);
    expect(await row.$('[data-testid=silence]'), `an admin has no Silence button on the row of ${name}`);
  }
  const rules = await (await admin.waitForSelector('[data-testid=rules-list]')).textContent();
  expect(rules.includes("A box's certificate ends within 365 days: fires at once"), `the rules shown: ${rules}`);
  const hook = await (await admin.waitForSelector(`[data-testid=webhooks] tr[data-webhook="${hookURL}"]`)).textContent();
  expect(hook.includes('none: posts are not signed'), `the webhook shown: ${hook}`);
  await admin.waitForFunction(() => document.querySelector('[data-testid=silences] tbody')?.textContent.includes('No silence is on'), null, { timeout: 10000 });
});

await step(second, "a maintainer silences shell-box's incident from its row: the row says silenced, and the silence is listed", async () => {
  await second.goto(`${url}/alerts`);
  const row = incident('shell-box');
  await second.waitForSelector(`${row}[data-silenced=false] [data-testid=silence]`, { timeout: 45000 });
  await second.selectOption(`${row} [data-testid=silence-for]`, '1h');
  await second.click(`${row} [data-testid=silence]`);
  expect((await (await second.waitForSelector('[data-testid=done]')).textContent()).startsWith('Silence '), 'no word that the silence was added');
  const sil = await second.waitForSelector(`${silenceRows}[data-box="${boxID}"][data-kind=cert-expiry]`);
  const text = await sil.textContent();
  expect(text.includes('certificate ending, box shell-box') && text.includes(env('EDGEBOX_MAINTAINER')), `the silence listed: ${text}`);
  const all = await silencesNow(second);
  expect(all.length === 1 && hours(all[0]) === 1, `the silences: ${JSON.stringify(all)}`);
  // The silence starts an evaluation, which marks the incident.
  await second.waitForSelector(`${row}[data-silenced=true] [data-testid=silenced]`, { timeout: 20000 });
  expect((await second.textContent(row)).includes('silenced'), 'the row does not say silenced');
  expect(await second.$(`${incident('money-box')}[data-silenced=false]`), "money-box's incident is silenced too");
});

await step(second, 'the maintainer adds a silence with the form; one that names nothing is refused on the page', async () => {
  const form = '[data-testid=silence-form]';
  await second.click(`${form} [data-testid=silence-add]`);
  const err = await (await second.waitForSelector('[data-testid=silence-error]')).textContent();
  expect(err.includes('A silence names a kind, a box or a site'), `the error says ${err}`);
  expect((await silencesNow(second)).length === 1, 'a silence that names nothing was added');
  await second.selectOption(`${form} select[name=kind]`, 'box-down');
  await second.fill(`${form} input[name=site]`, 'shop-9');
  await second.selectOption(`${form} select[name=for]`, '8h');
  await second.fill(`${form} input[name=comment]`, 'power works at shop 9');
  await second.click(`${form} [data-testid=silence-add]`);
  const text = await (await second.waitForSelector(`${silenceRows}[data-site=shop-9]`)).textContent();
  expect(text.includes('box down, site shop-9') && text.includes('power works at shop 9'), `the silence listed: ${text}`);
  expect(!(await second.$('[data-testid=silence-error]')), 'the error stays after a good silence');
  expect((await second.inputValue(`${form} input[name=site]`)) === '', 'the form keeps what was added');
  const sil = (await silencesNow(second)).find((s) => s.site === 'shop-9');
  expect(sil && sil.kind === 'box-down' && !sil.box && hours(sil) === 8, `the silence added: ${JSON.stringify(sil)}`);
});

await step(viewer, 'a viewer sees the incidents and the silences, with no button to silence or end one, and no rules editor', async () => {
  await viewer.goto(`${url}/alerts`);
  await viewer.waitForSelector(`${incident('shell-box')}[data-silenced=true]`);
  await viewer.waitForSelector(incident('money-box'));
  await viewer.waitForSelector(`${silenceRows}[data-site=shop-9]`);
  await viewer.waitForSelector('[data-testid=webhooks]');
  for (const sel of ['silence', 'silence-for', 'silence-form', 'unsilence', 'alert-rules-edit', 'test-webhooks']) {
    expect(!(await viewer.$(`[data-testid=${sel}]`)), `a viewer sees ${sel}`);
  }
});

await step(second, 'the maintainer ends both silences: none is listed, and the incident is no longer silenced', async () => {
  for (let left = 2; left > 0; left--) {
    expect((await second.$$(silenceRows)).length === left, `not ${left} silences listed`);
    await second.click(`${silenceRows} [data-testid=unsilence] >> nth=0`);
    await second.waitForFunction((args) => document.querySelectorAll(args[0]).length === args[1], [silenceRows, left - 1], { timeout: 10000 });
  }
  expect((await second.textContent('[data-testid=silences] tbody')).includes('No silence is on'), 'the silences do not say none is on');
  expect((await silencesNow(second)).length === 0, 'a silence is still on');
  await second.waitForSelector(`${incident('shell-box')}[data-silenced=false]`, { timeout: 20000 });
  expect(!(await second.$(`${incident('shell-box')} [data-testid=silenced]`)), 'the row still says silenced');
});

const alertRulesField = '[data-testid=alert-rules-editor] textarea';
await step(admin, 'an admin edits the alert rules as JSON: what is not right saves nothing, and says why; a secret is set', async () => {
  await admin.goto(`${url}/alerts`);
  await admin.click('[data-testid=alert-rules-edit]');
  const start = JSON.parse(await admin.inputValue(alertRulesField));
  const want = { rules: [{ kind: 'cert-expiry', days: 365 }], webhooks: [{ url: hookURL }] };
  expect(JSON.stringify(start) === JSON.stringify(want), `the editor starts with ${JSON.stringify(start)}`);
  const saved = () => admin.evaluate(async () => (await fetch('/api/v1/alert-rules')).text());
  const was = await saved();
  const refused = async (text, says) => {
    await admin.fill(alertRulesField, text);
    await admin.click('[data-testid=alert-rules-save]');
    await admin.waitForFunction((s) => document.querySelector('[data-testid=alert-rules-error]')?.textContent.includes(s), says, { timeout: 10000 });
  };
  // The page's own checks: not JSON, a field it does not know.
  await refused('{"rules": [', 'not JSON');
  await refused(JSON.stringify({ rules: [{ kind: 'cert-expiry', day: 30 }] }), 'rule 1: unknown field "day"');
  // The console's: a value out of range.
  await refused(JSON.stringify({ rules: [{ kind: 'cert-expiry', days: 400 }], webhooks: [{ url: hookURL }] }), 'days must be 1 to 365');
  expect((await saved()) === was, 'a refused edit changed the rules');
  await admin.fill(alertRulesField, JSON.stringify({ rules: [{ kind: 'cert-expiry', days: 365 }], webhooks: [{ url: hookURL, secret: env('EDGEBOX_WEBHOOK_SECRET') }] }, null, 2));
  await admin.click('[data-testid=alert-rules-save]');
  await admin.waitForSelector('[data-testid=alert-rules-saved]');
  expect(!(await admin.$('[data-testid=alert-rules-editor]')), 'the editor stays open after saving');
  const hook = await admin.waitForSelector(`[data-testid=webhooks] tr[data-webhook="${hookURL}"][data-secret=true]`, { timeout: 10000 });
  expect((await hook.textContent()).includes('has a secret'), 'the webhook does not say it has a secret');
  expect(!(await saved()).includes(env('EDGEBOX_WEBHOOK_SECRET')), 'the rules read back the secret');
});

await step(admin, 'the admin tests the webhooks and sees the webhook took the test', async () => {
  await admin.click('[data-testid=test-webhooks]');
  const li = await admin.waitForSelector(`[data-testid=webhook-tests] li[data-url="${hookURL}"]`, { timeout: 20000 });
  const text = await li.textContent();
  expect((await li.getAttribute('data-ok')) === 'true' && text.includes('took it'), `the test says ${text}`);
  expect(!(await admin.$('[data-testid=test-error]')), 'the test says it failed');
});

await step(admin, "the box page shows the box's health and vitals, and the fleet list its health", async () => {
  // The box reports its vitals when it connects and each minute after.
  const end = Date.now() + 75000;
  for (;;) {
    await admin.goto(`${url}/boxes/${boxID}`);
    await admin.waitForSelector('[data-testid=box-name]');
    await admin.waitForSelector('[data-testid=vitals-none], [data-testid=vital-cpu]');
    if (await admin.$('[data-testid=vital-cpu]')) break;
    expect(Date.now() < end, 'the box page shows no vitals after a minute');
    await admin.waitForTimeout(3000);
  }
  const health = await admin.$('[data-testid=health]');
  expect(health && (await health.getAttribute('data-health')) === 'online' && (await health.textContent()) === 'online', 'the box page does not say online');
  const cpu = await admin.textContent('[data-testid=vital-cpu]');
  expect(/^\d+\.\d %$/.test(cpu), `CPU: ${cpu}`);
  for (const v of ['vital-memory', 'vital-disk']) {
    const text = await admin.textContent(`[data-testid=${v}]`);
    expect(/^[\d.]+ [KMGT]?i?B of [\d.]+ [KMGT]iB \(\d+ %\)$/.test(text), `${v}: ${text}`);
  }
  const up = await admin.textContent('[data-testid=vital-uptime]');
  expect(/^\d+ (d|h) \d+ (h|min)$/.test(up), `up for ${up}`);
  expect((await admin.textContent('[data-testid=vitals-at]')) !== '—', 'no time the vitals were reported');
  await admin.screenshot({ path: join(shots, `${String(n).padStart(2, '0')}b-box-health.png`), fullPage: true });
  await admin.goto(`${url}/`);
  const row = await admin.waitForSelector('[data-testid=boxes] [data-box=shell-box][data-health=online]');
  expect((await row.$eval('.state', (s) => s.textContent)) === 'online', 'the fleet list does not say online');
});

await browser.close();
console.log(`${n} steps passed`);
