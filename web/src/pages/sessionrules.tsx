import { useState } from 'preact/hooks';
import * as api from '../api';
import { useApp } from '../app';
import { formatTime, type T } from '../i18n';
import { usePoll } from '../ui/poll';

// The tenant's session rules, on the Sessions page: which boxes keep their
// sessions to four eyes, and the LAN hosts port forwards may reach. Every
// user reads them; an admin edits them as text, in the words of 'edgebox
// session rules set': a four-eyes rule a line (KEY=VALUE labels,
// region:REGION, site:SITE, all of which must match; a value with spaces
// in "double quotes"), a forward allow list a line ("site SITE: TARGET,
// TARGET" or "box BOX_ID: TARGET").

/** Parsed is the rules read from the editor's text, or the first line that could not be read. */
export type Parsed = { ok: true; rules: api.SessionRules } | { ok: false; error: string };

/** lines are the lines of text that say something, numbered from 1; blank lines and # comments are skipped. */
function lines(text: string): [number, string][] {
  return text
    .split('\n')
    .map((l, i): [number, string] => [i + 1, l.trim()])
    .filter(([, l]) => l !== '' && !l.startsWith('#'));
}

/** tokens splits a line at spaces, except inside "double quotes" (a JSON string); null when a quote does not end. */
function tokens(l: string): string[] | null {
  const out: string[] = [];
  let cur = '';
  for (let i = 0; i < l.length; i++) {
    if (/\s/.test(l[i])) {
      if (cur) out.push(cur);
      cur = '';
    } else if (l[i] === '"') {
      let j = i + 1;
      while (j < l.length && l[j] !== '"') j += l[j] === '\\' ? 2 : 1;
      if (j >= l.length) return null;
      cur += l.slice(i, j + 1);
      i = j;
    } else {
      cur += l[i];
    }
  }
  if (cur) out.push(cur);
  return out;
}

/** labelValue reads a label's value as written: bare, or a JSON string in double quotes; null when it is neither. */
function labelValue(v: string): string | null {
  if (!v.includes('"')) return v;
  if (!/^".*"$/.test(v)) return null;
  try {
    return JSON.parse(v) as string;
  } catch {
    return null;
  }
}

/** quoteValue writes a label's value so that tokens and labelValue read it back. */
const quoteValue = (v: string) => (/[\s"]/.test(v) ? JSON.stringify(v) : v);

/** parseFourEyes reads four-eyes rules, one a line: KEY=VALUE labels, region:REGION and site:SITE, separated by spaces. */
export function parseFourEyes(t: T, text: string): { ok: true; matches: api.BoxMatch[] } | { ok: false; error: string } {
  const matches: api.BoxMatch[] = [];
  for (const [line, l] of lines(text)) {
    const m: api.BoxMatch = {};
    const ts = tokens(l);
    if (!ts) return { ok: false, error: t('sessionRules.err.quote', { line }) };
    for (const token of ts) {
      const place = /^(region|site):(.*)$/.exec(token);
      const eq = token.indexOf('=');
      const value = place || eq <= 0 ? null : labelValue(token.slice(eq + 1));
      if (place && place[2] && !place[2].includes('"')) {
        const k = place[1] as 'region' | 'site';
        if (m[k] !== undefined) return { ok: false, error: t('sessionRules.err.twice', { line, what: `${k}:` }) };
        m[k] = place[2];
      } else if (value !== null && !token.slice(0, eq).includes('"')) {
        const key = token.slice(0, eq);
        m.labels ??= {};
        if (key in m.labels) return { ok: false, error: t('sessionRules.err.twice', { line, what: `${key}=` }) };
        m.labels[key] = value;
      } else {
        return { ok: false, error: t('sessionRules.err.fourEyes', { line, token }) };
      }
    }
    matches.push(m);
  }
  return { ok: true, matches };
}

/** validTarget reports whether s looks like ADDRESS[/BITS]:PORTS or HOSTNAME:PORTS; the console checks the address or name. */
function validTarget(s: string): boolean {
  const m = /^(.+):(\*|[0-9]+|[0-9]+-[0-9]+)$/.exec(s);
  if (!m) return false;
  if (m[2] === '*') return true;
  const [lo, hi = lo] = m[2].split('-').map(Number);
  return lo >= 1 && hi <= 65535 && lo <= hi;
}

/** parseForwards reads forward allow lists, one a line: "site SITE: TARGET, TARGET" or "box BOX_ID: TARGET". */
export function parseForwards(
  t: T,
  text: string,
): { ok: true; sites: Record<string, string[]>; boxes: Record<string, string[]> } | { ok: false; error: string } {
  const sites: Record<string, string[]> = {};
  const boxes: Record<string, string[]> = {};
  for (const [line, l] of lines(text)) {
    const m = /^(site|box)\s+([^\s:]+)\s*:\s*(.*)$/.exec(l);
    if (!m) return { ok: false, error: t('sessionRules.err.forwardLine', { line }) };
    const targets = m[3].split(',').map((s) => s.trim()).filter(Boolean);
    if (targets.length === 0) return { ok: false, error: t('sessionRules.err.noTargets', { line }) };
    const bad = targets.find((s) => !validTarget(s));
    if (bad !== undefined) return { ok: false, error: t('sessionRules.err.target', { line, target: bad }) };
    const lists = m[1] === 'site' ? sites : boxes;
    lists[m[2]] = [...(lists[m[2]] ?? []), ...targets];
  }
  return { ok: true, sites, boxes };
}

/** parseRules reads the editor's two texts as the rules they say. */
export function parseRules(t: T, fourEyes: string, forwards: string): Parsed {
  const f = parseFourEyes(t, fourEyes);
  if (!f.ok) return f;
  const w = parseForwards(t, forwards);
  if (!w.ok) return w;
  const rules: api.SessionRules = {};
  if (f.matches.length) rules.four_eyes = f.matches;
  if (Object.keys(w.sites).length) rules.forward_sites = w.sites;
  if (Object.keys(w.boxes).length) rules.forward_boxes = w.boxes;
  return { ok: true, rules };
}

const sorted = (r?: Record<string, string>) => Object.entries(r ?? {}).sort(([a], [b]) => a.localeCompare(b));

/** formatFourEyes writes four-eyes rules as the editor reads them. */
export function formatFourEyes(ms?: api.BoxMatch[]): string {
  return (ms ?? [])
    .map((m) => [...sorted(m.labels).map(([k, v]) => `${k}=${quoteValue(v)}`), ...(m.region ? [`region:${m.region}`] : []), ...(m.site ? [`site:${m.site}`] : [])].join(' '))
    .join('\n');
}

/** allowLists are the forward allow lists of r, sites first, each sorted by name. */
function allowLists(r: api.SessionRules): ['site' | 'box', string, string[]][] {
  const of = (kind: 'site' | 'box', lists?: Record<string, string[]>) =>
    Object.entries(lists ?? {})
      .sort(([a], [b]) => a.localeCompare(b))
      .map(([name, targets]): ['site' | 'box', string, string[]] => [kind, name, targets]);
  return [...of('site', r.forward_sites), ...of('box', r.forward_boxes)];
}

/** formatForwards writes forward allow lists as the editor reads them. */
export function formatForwards(r: api.SessionRules): string {
  return allowLists(r)
    .map(([kind, name, targets]) => `${kind} ${name}: ${targets.join(', ')}`)
    .join('\n');
}

/** SessionRules shows the tenant's session rules to every user, and lets an admin edit them. */
export function SessionRules() {
  const { session, t, lang, me } = useApp();
  const polled = usePoll(() => api.sessionRules(session), [session.tenant], ['audit']);
  const [editing, setEditing] = useState<{ fourEyes: string; forwards: string } | null>(null);
  const [error, setError] = useState('');
  const [saved, setSaved] = useState(false);
  const [saving, setSaving] = useState(false);
  const r = polled.data;
  if (!r) return polled.error ? <p class="error">{t('common.error', { msg: polled.error })}</p> : null;
  const admin = api.can(me.role, 'administer');
  const where = (m: api.BoxMatch) =>
    [...sorted(m.labels).map(([k, v]) => `${k}=${v}`), ...(m.region ? [t('sessionRules.region', { name: m.region })] : []), ...(m.site ? [t('sessionRules.site', { name: m.site })] : [])].join(', ');
  const lists = allowLists(r);
  const save = (e: Event) => {
    e.preventDefault();
    if (!editing) return;
    setSaved(false);
    const p = parseRules(t, editing.fourEyes, editing.forwards);
    if (!p.ok) {
      setError(p.error);
      return;
    }
    setError('');
    setSaving(true);
    api
      .setSessionRules(session, p.rules)
      .then(() => {
        setEditing(null);
        setSaved(true);
        polled.reload();
      })
      .catch((err: Error) => setError(err.message))
      .finally(() => setSaving(false));
  };
  return (
    <div data-testid="session-rules">
      <h2>{t('sessionRules.title')}</h2>
      {r.four_eyes?.length ? (
        <>
          <p>{t('sessionRules.fourEyes')}</p>
          <ul data-testid="four-eyes">
            {r.four_eyes.map((m) => <li>{where(m)}</li>)}
          </ul>
        </>
      ) : (
        <p data-testid="four-eyes">{t('sessionRules.noFourEyes')}</p>
      )}
      {lists.length ? (
        <table data-testid="forward-lists">
          <thead>
            <tr>
              <th>{t('sessionRules.forwardsFrom')}</th>
              <th>{t('sessionRules.mayReach')}</th>
            </tr>
          </thead>
          <tbody>
            {lists.map(([kind, name, targets]) => (
              <tr data-forward={`${kind} ${name}`}>
                <td>{t(kind === 'site' ? 'sessionRules.site' : 'sessionRules.box', { name })}</td>
                <td class="mono">{targets.join(', ')}</td>
              </tr>
            ))}
          </tbody>
        </table>
      ) : (
        <p data-testid="forward-lists">{t('sessionRules.noForwards')}</p>
      )}
      {r.updated_by && <p class="muted" data-testid="rules-by">{t('sessionRules.by', { who: r.updated_by, time: formatTime(lang, r.updated_at) })}</p>}
      {saved && <p class="notice" data-testid="rules-saved">{t('sessionRules.saved')}</p>}
      {admin && !editing && (
        <p>
          <button data-testid="rules-edit" onClick={() => { setSaved(false); setError(''); setEditing({ fourEyes: formatFourEyes(r.four_eyes), forwards: formatForwards(r) }); }}>
            {t('sessionRules.edit')}
          </button>
        </p>
      )}
      {admin && editing && (
        <form class="grid rules-editor" onSubmit={save} data-testid="rules-editor">
          <label>
            {t('sessionRules.fourEyesField')}
            <textarea name="four_eyes" rows={5} spellcheck={false} value={editing.fourEyes} placeholder={'money=yes bank=icbc\nsite:branch-12'}
              onInput={(e) => setEditing({ ...editing, fourEyes: (e.target as HTMLTextAreaElement).value })} />
            <span class="muted">{t('sessionRules.fourEyesHelp')}</span>
          </label>
          <label>
            {t('sessionRules.forwardsField')}
            <textarea name="forwards" rows={5} spellcheck={false} value={editing.forwards} placeholder={'site shop-12: 192.168.1.0/24:80, 192.168.1.20:443\nbox BOX_ID: printer.lan:631'}
              onInput={(e) => setEditing({ ...editing, forwards: (e.target as HTMLTextAreaElement).value })} />
            <span class="muted">{t('sessionRules.forwardsHelp')}</span>
          </label>
          {error && <p class="error" role="alert" data-testid="rules-error">{t('common.error', { msg: error })}</p>}
          <p class="rollout-actions">
            <button type="submit" data-testid="rules-save" disabled={saving}>{t('sessionRules.save')}</button>
            <button type="button" class="quiet" data-testid="rules-cancel" onClick={() => { setEditing(null); setError(''); }}>{t('sessionRules.cancel')}</button>
          </p>
        </form>
      )}
    </div>
  );
}
