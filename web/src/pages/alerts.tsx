import { useState } from 'preact/hooks';
import * as api from '../api';
import { useApp } from '../app';
import { formatTime, type MessageKey, type T } from '../i18n';
import { usePoll } from '../ui/poll';
import { duration } from './sessions';

// Alerts: the tenant's incidents under its alert rules, open and lately
// resolved; its silences, which keep matching incidents from the webhooks
// for a while; and its rules and webhooks. Every user reads them;
// operators silence, admins set the rules and test the webhooks. The
// console evaluates the rules every half minute or so, and no live topic
// names incidents: the page fetches every 5 s, and at once after a change
// of its own (silences and rules write the audit log, whose topic it
// follows too).

/** silenceFor are the durations a silence is offered for, as Go durations. */
const silenceFor = ['1h', '2h', '8h', '24h'] as const;
const forKey = (d: (typeof silenceFor)[number]) => `alerts.for.${d}` as MessageKey;

const known = (k: string): k is api.AlertKind => (api.alertKinds as string[]).includes(k);

/** kindWord names an incident's or silence's kind in words; one this page does not know as the console says it. */
export const kindWord = (t: T, k: string) => (known(k) ? t(`alerts.kind.${k}` as MessageKey) : k);

/** ruleWords says a rule in words: what raises an incident, and when it fires. */
export function ruleWords(t: T, r: api.AlertRule): string {
  const what = known(r.kind) ? t(`alerts.rule.${r.kind}` as MessageKey, { days: r.days || 14 }) : r.kind;
  return `${what}: ${r.for_minutes ? t('alerts.rule.after', { n: r.for_minutes }) : t('alerts.rule.now')}`;
}

/** Parsed is the rules read from the editor's text, or what is wrong with it. */
export type Parsed = { ok: true; rules: api.AlertRules } | { ok: false; error: string };

type Obj = Record<string, unknown>;
const isObj = (x: unknown): x is Obj => typeof x === 'object' && x !== null && !Array.isArray(x);

/**
 * parseAlertRules reads the editor's JSON as rules and webhooks, checking
 * their shape: fields it does not know are refused (a misspelt "days"
 * would otherwise be dropped unseen); the console checks the values.
 * Fields that reads carry (updated_at, updated_by, has_secret) are
 * dropped, so what 'edgebox alerts rules show' prints may be pasted.
 */
export function parseAlertRules(t: T, text: string): Parsed {
  const fail = (error: string): Parsed => ({ ok: false, error });
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch (e) {
    return fail(t('alerts.err.json', { msg: (e as Error).message }));
  }
  if (!isObj(v)) return fail(t('alerts.err.object'));
  const unknown = (o: Obj, where: string, fields: string[]) => {
    const f = Object.keys(o).find((k) => !fields.includes(k));
    return f === undefined ? '' : t('alerts.err.unknown', { where, field: f });
  };
  const bad = unknown(v, t('alerts.where.top'), ['rules', 'webhooks', 'updated_at', 'updated_by']);
  if (bad) return fail(bad);
  const list = (field: 'rules' | 'webhooks'): Obj[] | null => {
    const l = v[field];
    if (l === undefined || l === null) return [];
    return Array.isArray(l) && l.every(isObj) ? l : null;
  };
  const rawRules = list('rules');
  if (!rawRules) return fail(t('alerts.err.list', { field: 'rules' }));
  const rawHooks = list('webhooks');
  if (!rawHooks) return fail(t('alerts.err.list', { field: 'webhooks' }));
  const rules: api.AlertRule[] = [];
  for (const [i, r] of rawRules.entries()) {
    const where = t('alerts.where.rule', { n: i + 1 });
    const bad = unknown(r, where, ['kind', 'for_minutes', 'days']);
    if (bad) return fail(bad);
    if (typeof r.kind !== 'string' || !known(r.kind)) return fail(t('alerts.err.kind', { where, kinds: api.alertKinds.join(', ') }));
    const rule: api.AlertRule = { kind: r.kind };
    for (const f of ['for_minutes', 'days'] as const) {
      if (r[f] === undefined || r[f] === null) continue;
      if (!Number.isInteger(r[f])) return fail(t('alerts.err.number', { where, field: f }));
      rule[f] = r[f] as number;
    }
    rules.push(rule);
  }
  const webhooks: api.Webhook[] = [];
  for (const [i, w] of rawHooks.entries()) {
    const where = t('alerts.where.webhook', { n: i + 1 });
    const bad = unknown(w, where, ['url', 'secret', 'has_secret']);
    if (bad) return fail(bad);
    if (typeof w.url !== 'string') return fail(t('alerts.err.text', { where, field: 'url' }));
    if (w.secret !== undefined && w.secret !== null && typeof w.secret !== 'string') return fail(t('alerts.err.text', { where, field: 'secret' }));
    webhooks.push(w.secret ? { url: w.url, secret: w.secret as string } : { url: w.url });
  }
  return { ok: true, rules: { rules, webhooks } };
}

/** formatAlertRules writes rules as the editor reads them: no secrets, which are kept unless written. */
export function formatAlertRules(r: api.AlertRules): string {
  return JSON.stringify({ rules: r.rules ?? [], webhooks: (r.webhooks ?? []).map((w) => ({ url: w.url })) }, null, 2);
}

/** Subject is what an incident is about, linked to its box's page when it is on a box. */
function Subject({ inc }: { inc: api.Incident }) {
  const { navigate } = useApp();
  if (!inc.box) return <>{inc.subject}</>;
  const to = `/boxes/${encodeURIComponent(inc.box)}`;
  return (
    <a href={to} data-testid="incident-box" onClick={(e) => { e.preventDefault(); navigate(to); }}>
      {inc.subject}
    </a>
  );
}

/** StateCell is an incident's state, and whether a silence keeps it from the webhooks. */
function StateCell({ inc }: { inc: api.Incident }) {
  const { t } = useApp();
  return (
    <td>
      <span class={'astate ' + inc.state}>{t(`alerts.state.${inc.state}` as MessageKey)}</span>
      {inc.silenced && (
        <span class="tag silenced" data-testid="silenced" title={t('alerts.silencedBy', { id: inc.silenced_by ?? '' })}>
          {t('alerts.silenced')}
        </span>
      )}
    </td>
  );
}

/** SilenceIncident silences one incident's box and kind for a chosen while. */
function SilenceIncident({ inc, onSilence }: { inc: api.Incident; onSilence: (r: api.SilenceRequest) => void }) {
  const { t } = useApp();
  const [dur, setDur] = useState<string>('2h');
  return (
    <span class="silence-one">
      <select data-testid="silence-for" aria-label={t('alerts.silenceFor')} value={dur} onChange={(e) => setDur((e.target as HTMLSelectElement).value)}>
        {silenceFor.map((d) => <option value={d}>{t(forKey(d))}</option>)}
      </select>
      <button class="quiet" data-testid="silence" onClick={() => onSilence({ kind: inc.kind, box: inc.box, for: dur })}>
        {t('alerts.silence')}
      </button>
    </span>
  );
}

/** AddSilence is the form for any silence: a kind or any, a box, a site, for a while, with a comment. */
function AddSilence({ onAdded }: { onAdded: (s: api.Silence) => void }) {
  const { session, t } = useApp();
  const empty = { kind: '', box: '', site: '', for: '2h', comment: '' };
  const [f, setF] = useState(empty);
  const [error, setError] = useState('');
  const [busy, setBusy] = useState(false);
  const field = (k: keyof typeof empty) => (e: Event) => setF({ ...f, [k]: (e.target as HTMLInputElement).value });
  const submit = (e: Event) => {
    e.preventDefault();
    const req: api.SilenceRequest = { for: f.for };
    if (f.kind && known(f.kind)) req.kind = f.kind;
    if (f.box.trim()) req.box = f.box.trim();
    if (f.site.trim()) req.site = f.site.trim();
    if (f.comment.trim()) req.comment = f.comment.trim();
    if (!req.kind && !req.box && !req.site) {
      setError(t('alerts.err.nothing'));
      return;
    }
    setError('');
    setBusy(true);
    api
      .silence(session, req)
      .then((s) => {
        setF(empty);
        onAdded(s);
      })
      .catch((err: Error) => setError(err.message))
      .finally(() => setBusy(false));
  };
  return (
    <form class="grid" onSubmit={submit} data-testid="silence-form">
      <h3>{t('alerts.addSilence')}</h3>
      <label>
        {t('alerts.field.kind')}
        <select name="kind" value={f.kind} onChange={field('kind')}>
          <option value="">{t('alerts.anyKind')}</option>
          {api.alertKinds.map((k) => <option value={k}>{kindWord(t, k)}</option>)}
        </select>
      </label>
      <label>
        {t('alerts.field.box')}
        <input name="box" value={f.box} onInput={field('box')} />
      </label>
      <label>
        {t('alerts.field.site')}
        <input name="site" value={f.site} onInput={field('site')} />
      </label>
      <label>
        {t('alerts.field.for')}
        <select name="for" value={f.for} onChange={field('for')}>
          {silenceFor.map((d) => <option value={d}>{t(forKey(d))}</option>)}
        </select>
      </label>
      <label>
        {t('alerts.field.comment')}
        <input name="comment" value={f.comment} onInput={field('comment')} />
      </label>
      {error && <p class="error" role="alert" data-testid="silence-error">{t('common.error', { msg: error })}</p>}
      <p>
        <button type="submit" data-testid="silence-add" disabled={busy}>{t('alerts.add')}</button>
      </p>
    </form>
  );
}

export function Alerts() {
  const { session, t, lang, me } = useApp();
  const list = usePoll(() => api.alerts(session, 20), [session.tenant], ['audit'], 5000);
  const sils = usePoll(() => api.silences(session), [session.tenant], ['audit'], 5000);
  const [done, setDone] = useState('');
  const [error, setError] = useState('');
  const operate = api.can(me.role, 'operate');
  const reload = () => {
    list.reload();
    sils.reload();
  };
  const run = <R,>(p: Promise<R>, msg: (r: R) => string) => {
    setError('');
    setDone('');
    p.then((r) => {
      setDone(msg(r));
      reload();
    }).catch((e: Error) => setError(e.message));
  };
  const added = (s: api.Silence) => t('alerts.added', { id: s.id, until: formatTime(lang, s.until) });
  const open = list.data?.open ?? [];
  const resolved = list.data?.resolved ?? [];
  // A silence names its box by ID or name: shown by name when an incident tells it.
  const names = new Map<string, string>();
  for (const inc of [...open, ...resolved]) if (inc.box && inc.box_name) names.set(inc.box, inc.box_name);
  const matches = (s: api.Silence) =>
    [
      s.kind ? kindWord(t, s.kind) : t('alerts.anyKind'),
      ...(s.box ? [t('alerts.onBox', { name: names.get(s.box) ?? s.box })] : []),
      ...(s.site ? [t('alerts.onSite', { name: s.site })] : []),
    ].join(', ');
  const loadError = list.error || sils.error;
  return (
    <section data-testid="alerts">
      <h1>{t('alerts.title')}</h1>
      {loadError && <p class="error">{t('common.error', { msg: loadError })}</p>}
      {done && <p class="notice" data-testid="done">{done}</p>}
      {error && <p class="error" role="alert" data-testid="alerts-error">{t('common.error', { msg: error })}</p>}
      <h2>{t('alerts.open')}</h2>
      <table data-testid="open-incidents">
        <thead>
          <tr>
            <th>{t('alerts.col.state')}</th>
            <th>{t('alerts.col.kind')}</th>
            <th>{t('alerts.col.subject')}</th>
            <th>{t('alerts.col.since')}</th>
            <th>{t('alerts.col.summary')}</th>
            {operate && <th />}
          </tr>
        </thead>
        <tbody>
          {list.data && open.length === 0 && (
            <tr>
              <td colSpan={operate ? 6 : 5}>{t('alerts.noOpen')}</td>
            </tr>
          )}
          {open.map((inc) => (
            <tr key={inc.id} data-incident={inc.id} data-kind={inc.kind} data-state={inc.state} data-box={inc.box_name ?? ''} data-silenced={String(!!inc.silenced)}>
              <StateCell inc={inc} />
              <td>{kindWord(t, inc.kind)}</td>
              <td><Subject inc={inc} /></td>
              <td>
                {formatTime(lang, inc.since)} <span class="muted">({duration(inc.since)})</span>
              </td>
              <td>{inc.summary}</td>
              {operate && (
                <td>
                  {inc.box && (
                    <SilenceIncident
                      inc={inc}
                      onSilence={(r) => run(api.silence(session, r), added)}
                    />
                  )}
                </td>
              )}
            </tr>
          ))}
        </tbody>
      </table>
      <h2>{t('alerts.silences')}</h2>
      <p class="muted">{t('alerts.silencesHelp')}</p>
      <table data-testid="silences">
        <thead>
          <tr>
            <th>{t('alerts.col.matches')}</th>
            <th>{t('alerts.col.until')}</th>
            <th>{t('alerts.col.by')}</th>
            <th>{t('alerts.col.comment')}</th>
            {operate && <th />}
          </tr>
        </thead>
        <tbody>
          {sils.data && sils.data.length === 0 && (
            <tr>
              <td colSpan={operate ? 5 : 4}>{t('alerts.noSilences')}</td>
            </tr>
          )}
          {(sils.data ?? []).map((s) => (
            <tr key={s.id} data-silence={s.id} data-kind={s.kind ?? ''} data-box={s.box ?? ''} data-site={s.site ?? ''}>
              <td>{matches(s)}</td>
              <td>{formatTime(lang, s.until)}</td>
              <td>{s.created_by ?? ''}</td>
              <td>{s.comment ?? ''}</td>
              {operate && (
                <td>
                  <button class="danger" data-testid="unsilence" onClick={() => run(api.unsilence(session, s.id), () => t('alerts.unsilenced', { id: s.id }))}>
                    {t('alerts.unsilence')}
                  </button>
                </td>
              )}
            </tr>
          ))}
        </tbody>
      </table>
      {operate && (
        <AddSilence
          onAdded={(s) => {
            setError('');
            setDone(added(s));
            reload();
          }}
        />
      )}
      <h2>{t('alerts.resolved')}</h2>
      <table data-testid="resolved-incidents">
        <thead>
          <tr>
            <th>{t('alerts.col.kind')}</th>
            <th>{t('alerts.col.subject')}</th>
            <th>{t('alerts.col.since')}</th>
            <th>{t('alerts.col.resolved')}</th>
            <th>{t('alerts.col.summary')}</th>
          </tr>
        </thead>
        <tbody>
          {list.data && resolved.length === 0 && (
            <tr>
              <td colSpan={5}>{t('alerts.noResolved')}</td>
            </tr>
          )}
          {resolved.map((inc) => (
            <tr key={inc.id} data-incident={inc.id} data-kind={inc.kind} data-box={inc.box_name ?? ''}>
              <td>{kindWord(t, inc.kind)}</td>
              <td><Subject inc={inc} /></td>
              <td>{formatTime(lang, inc.since)}</td>
              <td>
                {formatTime(lang, inc.resolved_at)} <span class="muted">({duration(inc.since, inc.resolved_at)})</span>
              </td>
              <td>{inc.summary}</td>
            </tr>
          ))}
        </tbody>
      </table>
      <AlertRulesPanel />
    </section>
  );
}

/** AlertRulesPanel shows the tenant's alert rules and webhooks to every user; an admin edits them as JSON and tests the webhooks. */
function AlertRulesPanel() {
  const { session, t, lang, me } = useApp();
  const polled = usePoll(() => api.alertRules(session), [session.tenant], ['audit']);
  const [editing, setEditing] = useState<string | null>(null);
  const [error, setError] = useState('');
  const [saved, setSaved] = useState(false);
  const [saving, setSaving] = useState(false);
  const [tests, setTests] = useState<{ url: string; error?: string }[] | null>(null);
  const [testing, setTesting] = useState(false);
  const [testError, setTestError] = useState('');
  const r = polled.data;
  if (!r) return polled.error ? <p class="error">{t('common.error', { msg: polled.error })}</p> : null;
  const admin = api.can(me.role, 'administer');
  const rules = r.rules ?? [];
  const hooks = r.webhooks ?? [];
  const save = (e: Event) => {
    e.preventDefault();
    if (editing === null) return;
    setSaved(false);
    const p = parseAlertRules(t, editing);
    if (!p.ok) {
      setError(p.error);
      return;
    }
    setError('');
    setSaving(true);
    api
      .setAlertRules(session, p.rules)
      .then(() => {
        setEditing(null);
        setSaved(true);
        polled.reload();
      })
      .catch((err: Error) => setError(err.message))
      .finally(() => setSaving(false));
  };
  const test = () => {
    setTests(null);
    setTestError('');
    setTesting(true);
    api
      .testWebhooks(session)
      .then(setTests)
      .catch((err: Error) => setTestError(err.message))
      .finally(() => setTesting(false));
  };
  return (
    <div data-testid="alert-rules">
      <h2>{t('alerts.rules')}</h2>
      {rules.length ? (
        <ul data-testid="rules-list">
          {rules.map((rule) => <li data-kind={rule.kind}>{ruleWords(t, rule)}</li>)}
        </ul>
      ) : (
        <p data-testid="rules-list">{t('alerts.noRules')}</p>
      )}
      <h3>{t('alerts.webhooks')}</h3>
      {hooks.length ? (
        <table data-testid="webhooks">
          <thead>
            <tr>
              <th>{t('alerts.col.url')}</th>
              <th>{t('alerts.col.secret')}</th>
            </tr>
          </thead>
          <tbody>
            {hooks.map((w) => (
              <tr data-webhook={w.url} data-secret={String(!!w.has_secret)}>
                <td class="mono">{w.url}</td>
                <td>{w.has_secret ? t('alerts.hasSecret') : <span class="muted">{t('alerts.noSecret')}</span>}</td>
              </tr>
            ))}
          </tbody>
        </table>
      ) : (
        <p data-testid="webhooks">{t('alerts.noWebhooks')}</p>
      )}
      {r.updated_by && <p class="muted" data-testid="alert-rules-by">{t('alerts.rulesBy', { who: r.updated_by, time: formatTime(lang, r.updated_at) })}</p>}
      {saved && <p class="notice" data-testid="alert-rules-saved">{t('alerts.saved')}</p>}
      {admin && editing === null && (
        <p class="rollout-actions">
          <button data-testid="alert-rules-edit" onClick={() => { setSaved(false); setError(''); setEditing(formatAlertRules(r)); }}>
            {t('alerts.edit')}
          </button>
          <button class="quiet" data-testid="test-webhooks" disabled={testing || hooks.length === 0} onClick={test}>
            {t('alerts.test')}
          </button>
        </p>
      )}
      {testError && <p class="error" role="alert" data-testid="test-error">{t('common.error', { msg: testError })}</p>}
      {tests && (
        <>
          <p>{t('alerts.tests')}</p>
          <ul data-testid="webhook-tests">
            {tests.map((w) => (
              <li data-url={w.url} data-ok={String(!w.error)} class={w.error ? 'error' : 'ok'}>
                <span class="mono">{w.url}</span>: {w.error ? t('alerts.refused', { error: w.error }) : t('alerts.took')}
              </li>
            ))}
          </ul>
        </>
      )}
      {admin && editing !== null && (
        <form class="grid rules-editor alert-rules-editor" onSubmit={save} data-testid="alert-rules-editor">
          <label>
            {t('alerts.editorField')}
            <textarea name="alert_rules" rows={12} spellcheck={false} value={editing} onInput={(e) => setEditing((e.target as HTMLTextAreaElement).value)} />
            <span class="muted">{t('alerts.editorHelp')}</span>
          </label>
          {error && <p class="error" role="alert" data-testid="alert-rules-error">{t('common.error', { msg: error })}</p>}
          <p class="rollout-actions">
            <button type="submit" data-testid="alert-rules-save" disabled={saving}>{t('alerts.save')}</button>
            <button type="button" class="quiet" data-testid="alert-rules-cancel" onClick={() => { setEditing(null); setError(''); }}>{t('alerts.cancel')}</button>
          </p>
        </form>
      )}
    </div>
  );
}
