import { useState } from 'preact/hooks';
import * as api from '../api';
import { useApp } from '../app';
import { formatTime, type MessageKey } from '../i18n';
import type { Topic } from '../live';
import { usePoll } from '../ui/poll';

// A rollout changes when it is audited (made, approved, paused, a group
// through), when its pins change and when its boxes report; between
// those the controller still moves boxes along every 2 s, so a page that
// shows a rollout not yet over asks that often too.
const topics: Topic[] = ['audit', 'apps', 'state'];
const livePeriod = 2000;
const idlePeriod = 30000;

const stateKeys: Record<api.RolloutState, MessageKey> = {
  'awaiting-approval': 'rollouts.state.awaiting-approval',
  running: 'rollouts.state.running',
  paused: 'rollouts.state.paused',
  stopped: 'rollouts.state.stopped',
  aborted: 'rollouts.state.aborted',
  done: 'rollouts.state.done',
};
const phaseKeys: Record<api.RolloutPhase, MessageKey> = {
  waiting: 'rollouts.phase.waiting',
  held: 'rollouts.phase.held',
  updating: 'rollouts.phase.updating',
  gating: 'rollouts.phase.gating',
  done: 'rollouts.phase.done',
  failed: 'rollouts.phase.failed',
};
const dayKeys: Record<string, MessageKey> = {
  'every-day': 'rollouts.days.every-day',
  workdays: 'rollouts.days.workdays',
  holidays: 'rollouts.days.holidays',
};

const rolloutHref = (id: string) => `/rollouts/${encodeURIComponent(id)}`;

function State({ s }: { s: api.RolloutState }) {
  const { t } = useApp();
  return <span class={'rstate ' + s} data-state={s}>{stateKeys[s] ? t(stateKeys[s]) : s}</span>;
}

/** Progress is a bar of a rollout's boxes: done, in their gate, updating and failed, of all. */
function Progress({ p }: { p: api.Rollout['progress'] }) {
  const { t } = useApp();
  const width = (n: number) => ({ width: `${p.total ? (100 * n) / p.total : 0}%` });
  const counts = t('rollouts.counts', { ...p });
  return (
    <div class="progress" title={counts} data-testid="progress">
      <div class="bar">
        <span class="done" style={width(p.done)} />
        <span class="gating" style={width(p.gating)} />
        <span class="updating" style={width(p.updating)} />
        <span class="failed" style={width(p.failed)} />
      </div>
      <span>{t('rollouts.progress', { done: p.done, total: p.total })}</span>
      {p.failed > 0 && <span class="error">{t('rollouts.failedCount', { n: p.failed })}</span>}
    </div>
  );
}

export function Rollouts() {
  const { session, t, lang, me, navigate } = useApp();
  // Polled fast while one of them still moves.
  const [moving, setMoving] = useState(false);
  const polled = usePoll(
    () => api.rollouts(session).then((l) => { setMoving(l.some((r) => !api.rolloutOver(r.state))); return l; }),
    [session.tenant, moving],
    topics,
    moving ? livePeriod : idlePeriod,
  );
  const list = polled.data ?? [];
  return (
    <section>
      <h1>{t('rollouts.title')}</h1>
      {polled.error && <p class="error" role="alert">{t('common.error', { msg: polled.error })}</p>}
      <table data-testid="rollouts">
        <thead>
          <tr>
            <th>{t('rollouts.col.id')}</th>
            <th>{t('rollouts.app')}</th>
            <th>{t('rollouts.col.releases')}</th>
            <th>{t('rollouts.scope')}</th>
            <th>{t('fleet.col.state')}</th>
            <th>{t('rollouts.col.progress')}</th>
            <th>{t('apps.created')}</th>
          </tr>
        </thead>
        <tbody>
          {list.map((r) => (
            <tr key={r.id} data-rollout={r.id}>
              <td>
                <a href={rolloutHref(r.id)} onClick={(e) => { e.preventDefault(); navigate(rolloutHref(r.id)); }}>{r.id}</a>
              </td>
              <td>{r.app}</td>
              <td>{r.from} → {r.to}</td>
              <td>{r.scope}</td>
              <td><State s={r.state} /></td>
              <td><Progress p={r.progress} /></td>
              <td>{formatTime(lang, r.created_at)} · {r.created_by}</td>
            </tr>
          ))}
        </tbody>
      </table>
      {polled.data && list.length === 0 && <p class="muted">{t('rollouts.empty')}</p>}
      {api.can(me.role, 'operate') && <RolloutForm />}
      <Rules />
    </section>
  );
}

type ScopeKind = 'regions' | 'site' | 'selector' | 'boxes';
const scopeExamples: Record<ScopeKind, string> = { regions: 'east, north', site: 'shop-1', selector: 'tier=gold, city=sh', boxes: 'b-1, b-2' };

/** RolloutForm starts a rollout and goes to its page; the console's refusal is shown as it says it. */
function RolloutForm() {
  const { session, t, navigate } = useApp();
  const [f, setF] = useState({
    app: '', from: '', to: '', kind: 'regions' as ScopeKind, scope: '', waves: '1, 10%, 50%, 100%',
    gate: '', timeout: '', maxUnavailable: '', failurePercent: '', revertAll: false,
  });
  const [error, setError] = useState('');
  const apps = usePoll(() => api.apps(session), [session.tenant], ['apps']);
  // What the pickers show until one is changed: the first app, and its
  // last release but one to its last.
  const app = f.app || apps.data?.[0]?.name || '';
  const releases = usePoll(() => (app ? api.releases(session, app) : Promise.resolve([])), [app, session.tenant], ['apps']);
  const versions = (releases.data ?? []).map((r) => r.version);
  const from = versions.includes(f.from) ? f.from : versions[Math.max(0, versions.length - 2)] ?? '';
  const to = versions.includes(f.to) ? f.to : versions[versions.length - 1] ?? '';
  const set = (k: keyof typeof f) => (e: Event) => {
    const el = e.target as HTMLInputElement;
    setF((p) => ({ ...p, [k]: el.type === 'checkbox' ? el.checked : el.value }));
  };
  const submit = (e: Event) => {
    e.preventDefault();
    const list = (s: string) => s.split(',').map((x) => x.trim()).filter(Boolean);
    const req: api.RolloutRequest = { app, from, to, waves: list(f.waves) };
    if (f.kind === 'regions') req.regions = list(f.scope);
    else if (f.kind === 'site') req.site = f.scope.trim();
    else if (f.kind === 'selector') req.selector = api.parseLabels(f.scope);
    else req.boxes = list(f.scope);
    if (f.gate.trim()) req.gate = f.gate.trim();
    if (f.timeout.trim()) req.box_timeout = f.timeout.trim();
    if (f.maxUnavailable) req.max_unavailable = Number(f.maxUnavailable);
    if (f.failurePercent) req.failure_percent = Number(f.failurePercent);
    if (f.revertAll) req.revert_all = true;
    api
      .createRollout(session, req)
      .then((r) => navigate(rolloutHref(r.id)))
      .catch((err: Error) => setError(err.message));
  };
  return (
    <form class="grid" onSubmit={submit} data-testid="rollout-form">
      <h3>{t('rollouts.new')}</h3>
      <label>
        {t('rollouts.app')}
        <select name="app" value={app} onChange={(e) => setF((p) => ({ ...p, app: (e.target as HTMLSelectElement).value, from: '', to: '' }))}>
          {(apps.data ?? []).map((a) => <option value={a.name}>{a.name}</option>)}
        </select>
      </label>
      <label>
        {t('rollouts.from')}
        <select name="from" value={from} onChange={set('from')}>
          {versions.map((v) => <option value={v}>{v}</option>)}
        </select>
      </label>
      <label>
        {t('rollouts.to')}
        <select name="to" value={to} onChange={set('to')}>
          {versions.map((v) => <option value={v}>{v}</option>)}
        </select>
      </label>
      <label>
        {t('rollouts.scope')}
        <select name="kind" value={f.kind} onChange={set('kind')}>
          {(Object.keys(scopeExamples) as ScopeKind[]).map((k) => <option value={k}>{t(`rollouts.scope.${k}`)}</option>)}
        </select>
      </label>
      <label>
        {t(`rollouts.scopeOf.${f.kind}`)}
        <input name="scope" value={f.scope} placeholder={scopeExamples[f.kind]} onInput={set('scope')} />
      </label>
      <label>
        {t('rollouts.waves')}
        <input name="waves" value={f.waves} onInput={set('waves')} />
      </label>
      <label>
        {t('rollouts.gate')}
        <input name="gate" value={f.gate} placeholder="5m" onInput={set('gate')} />
      </label>
      <label>
        {t('rollouts.boxTimeout')}
        <input name="timeout" value={f.timeout} placeholder="15m" onInput={set('timeout')} />
      </label>
      <label>
        {t('rollouts.maxUnavailable')}
        <input name="maxUnavailable" type="number" min={1} value={f.maxUnavailable} placeholder="1" onInput={set('maxUnavailable')} />
      </label>
      <label>
        {t('rollouts.failurePercent')}
        <input name="failurePercent" type="number" min={0} max={100} step="any" value={f.failurePercent} placeholder="10" onInput={set('failurePercent')} />
      </label>
      <label class="check">
        <input name="revertAll" type="checkbox" checked={f.revertAll} onChange={set('revertAll')} />
        {t('rollouts.revertAll')}
      </label>
      {error && <p class="error" role="alert" data-testid="rollout-form-error">{t('common.error', { msg: error })}</p>}
      <p>
        <button type="submit" disabled={!app || !from || !to}>{t('rollouts.create')}</button>
      </p>
    </form>
  );
}

/** Rules shows the tenant's rollout rules (an admin sets them through the API or the CLI). */
function Rules() {
  const { session, t, lang } = useApp();
  const polled = usePoll(() => api.rolloutRules(session), [session.tenant], ['audit']);
  const r = polled.data;
  if (!r) return null;
  const yes = (b?: boolean) => t(b ? 'rollouts.required' : 'rollouts.notRequired');
  const dates = (d?: string[]) => (d?.length ? d.join(', ') : '—');
  const windows = (ws?: api.UpdateWindow[]) =>
    (ws ?? []).map((w) => `${dayKeys[w.days] ? t(dayKeys[w.days]) : w.days} ${w.from}–${w.to}`).join('; ');
  const policies: [string, api.UpdatePolicy][] = [
    ...Object.entries(r.regions ?? {}).map(([n, p]): [string, api.UpdatePolicy] => [`${t('apps.region')} ${n}`, p]),
    ...Object.entries(r.sites ?? {}).map(([n, p]): [string, api.UpdatePolicy] => [`${t('apps.site')} ${n}`, p]),
  ].sort(([a], [b]) => a.localeCompare(b));
  return (
    <div data-testid="rollout-rules">
      <h2>{t('rollouts.rules')}</h2>
      <dl class="facts">
        <dt>{t('rollouts.approveStart')}</dt>
        <dd data-rule="approve-start">{yes(r.approve_start)}</dd>
        <dt>{t('rollouts.approveFirstWave')}</dt>
        <dd data-rule="approve-first-wave">{yes(r.approve_first_wave)}</dd>
        <dt>{t('rollouts.holidays')}</dt>
        <dd>{dates(r.calendar?.holidays)}</dd>
        <dt>{t('rollouts.extraWorkdays')}</dt>
        <dd>{dates(r.calendar?.extra_workdays)}</dd>
      </dl>
      {policies.length > 0 && (
        <table data-testid="policies">
          <thead>
            <tr>
              <th>{t('rollouts.where')}</th>
              <th>{t('rollouts.zone')}</th>
              <th>{t('rollouts.allow')}</th>
              <th>{t('rollouts.deny')}</th>
              <th>{t('rollouts.holidays')}</th>
            </tr>
          </thead>
          <tbody>
            {policies.map(([where, p]) => (
              <tr data-policy={where}>
                <td>{where}</td>
                <td>{p.zone}</td>
                <td>{windows(p.allow)}</td>
                <td>{windows(p.deny)}</td>
                <td>{dates(p.calendar?.holidays)}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      {r.updated_by && <p class="muted">{t('rollouts.rulesBy', { who: r.updated_by, time: formatTime(lang, r.updated_at) })}</p>}
    </div>
  );
}

export function RolloutPage({ id }: { id: string }) {
  const { session, t, lang, me } = useApp();
  const [over, setOver] = useState(false);
  const polled = usePoll(
    () => api.rollout(session, id).then((r) => { setOver(api.rolloutOver(r.state)); return r; }),
    [id, session.tenant, over],
    topics,
    over ? idlePeriod : livePeriod,
  );
  // An action's refusal is shown while the rollout is in the state it was refused in.
  const [refused, setRefused] = useState<{ msg: string; state: string } | null>(null);
  const r = polled.data;
  if (polled.error && !r) return <p class="error" role="alert">{t('common.error', { msg: polled.error })}</p>;
  if (!r) return <p class="loading">{t('common.loading')}</p>;
  const act = (p: Promise<unknown>) =>
    p.then(() => { setRefused(null); polled.reload(); }).catch((e: Error) => setRefused({ msg: e.message, state: r.state }));
  const error = refused?.state === r.state ? refused.msg : '';
  const s = r.settings;
  const settings: [string, string][] = [
    [t('rollouts.waves'), s.waves.join(', ')],
    [t('rollouts.gate'), s.gate],
    [t('rollouts.boxTimeout'), s.box_timeout],
    [t('rollouts.maxUnavailable'), String(s.max_unavailable)],
    [t('rollouts.failurePercent'), String(s.failure_percent)],
    [t('rollouts.revertAll'), t(s.revert_all ? 'rollouts.yes' : 'rollouts.no')],
  ];
  return (
    <section class="rollout">
      <h1 data-testid="rollout-title">
        {t('rollouts.one', { id: r.id })} <State s={r.state} />
      </h1>
      <p class="muted">
        {r.app} {r.from} → {r.to} · {r.scope} · {t('rollouts.createdBy', { time: formatTime(lang, r.created_at), who: r.created_by })}
      </p>
      {r.reason && <p class="notice" data-testid="rollout-reason">{r.reason}</p>}
      {(error || polled.error) && <p class="error" role="alert" data-testid="rollout-error">{t('common.error', { msg: error || polled.error })}</p>}
      {api.can(me.role, 'operate') && !api.rolloutOver(r.state) && <Actions r={r} act={act} />}
      <Progress p={r.progress} />
      <p class="muted" data-testid="counts">{t('rollouts.counts', { ...r.progress })}</p>
      {r.prefetch && <p data-testid="prefetch">{t('rollouts.prefetch', { ...r.prefetch })}</p>}
      <h2>{t('rollouts.settings')}</h2>
      <dl class="facts" data-testid="settings">
        {settings.map(([k, v]) => (
          <>
            <dt>{k}</dt>
            <dd>{v}</dd>
          </>
        ))}
      </dl>
      {(r.approvals?.length ?? 0) > 0 && (
        <>
          <h2>{t('rollouts.approvals')}</h2>
          <ul class="events" data-testid="approvals">
            {(r.approvals ?? []).map((a) => (
              <li>
                <time>{formatTime(lang, a.at)}</time> {a.by} · {t(a.stage === 'start' ? 'rollouts.stage.start' : 'rollouts.stage.first-wave')}
              </li>
            ))}
          </ul>
        </>
      )}
      <h2>{t('rollouts.groups')}</h2>
      {(r.groups ?? []).map((g, i) => <Group r={r} g={g} i={i} />)}
      {(r.skipped?.length ?? 0) > 0 && (
        <>
          <h2>{t('rollouts.skipped')}</h2>
          <table data-testid="skipped">
            <tbody>
              {(r.skipped ?? []).map((k) => (
                <tr data-box={k.box}>
                  <td><BoxLink id={k.box} /></td>
                  <td>{k.reason}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </>
      )}
    </section>
  );
}

/** Actions are what an operator may do to a rollout in its state. */
function Actions({ r, act }: { r: api.Rollout; act: (p: Promise<unknown>) => void }) {
  const { session, t } = useApp();
  const [why, setWhy] = useState('');
  const [revert, setRevert] = useState(false);
  const s = r.state;
  return (
    <div class="rollout-actions" data-testid="rollout-actions">
      {s === 'awaiting-approval' && (
        <button data-action="approve" onClick={() => act(api.rolloutAction(session, r.id, 'approve'))}>{t('rollouts.approve')}</button>
      )}
      {(s === 'running' || s === 'awaiting-approval') && (
        <form class="inline" onSubmit={(e) => { e.preventDefault(); act(api.rolloutAction(session, r.id, 'pause', { reason: why.trim() })); setWhy(''); }}>
          <input name="reason" placeholder={t('rollouts.pauseWhy')} value={why} onInput={(e) => setWhy((e.target as HTMLInputElement).value)} />
          <button type="submit" data-action="pause">{t('rollouts.pause')}</button>
        </form>
      )}
      {s === 'paused' && <button data-action="resume" onClick={() => act(api.rolloutAction(session, r.id, 'resume'))}>{t('rollouts.resume')}</button>}
      <span class="abort">
        <label class="check">
          <input type="checkbox" name="revert" checked={revert} onChange={(e) => setRevert((e.target as HTMLInputElement).checked)} />
          {t('rollouts.revert', { from: r.from })}
        </label>
        <button class="danger" data-action="abort" onClick={() => act(api.rolloutAction(session, r.id, 'abort', { revert }))}>{t('rollouts.abort')}</button>
      </span>
    </div>
  );
}

function BoxLink({ id }: { id: string }) {
  const { navigate } = useApp();
  const href = `/boxes/${encodeURIComponent(id)}`;
  return <a href={href} onClick={(e) => { e.preventDefault(); navigate(href); }}>{id}</a>;
}

/** Group is one region, site or set of boxes of a rollout, wave by wave; waves not started are folded. */
function Group({ r, g, i }: { r: api.Rollout; g: api.RolloutGroup; i: number }) {
  const { t, lang } = useApp();
  const current = i === r.group && !api.rolloutOver(r.state);
  const started = (w: number) => i < r.group || (i === r.group && w <= g.wave);
  const where =
    i < r.group ? t('rollouts.through') : i > r.group ? t('rollouts.notStarted') : t('rollouts.inWave', { n: Math.min(g.wave + 1, g.waves), of: g.waves });
  return (
    <div class={'group' + (current ? ' current' : '')} data-group={g.name} data-current={current ? 'yes' : 'no'}>
      <h3>
        {g.name || t('rollouts.selected')} <span class="muted">· {where}</span>
      </h3>
      {Array.from({ length: g.waves }, (_, w) => {
        const boxes = g.boxes.filter((b) => b.wave === w);
        return (
          <details open={started(w)} data-wave={w + 1}>
            <summary>
              {t('rollouts.wave', { n: w + 1, of: g.waves })} · {t('rollouts.boxCount', { n: boxes.length })}
              {!started(w) && ` · ${t('rollouts.notStarted')}`}
            </summary>
            <table>
              <thead>
                <tr>
                  <th>{t('keys.box')}</th>
                  <th>{t('fleet.col.site')}</th>
                  <th>{t('box.col.phase')}</th>
                  <th>{t('rollouts.since')}</th>
                  <th>{t('rollouts.why')}</th>
                </tr>
              </thead>
              <tbody>
                {boxes.map((b) => (
                  <tr data-box={b.id} data-phase={b.phase}>
                    <td><BoxLink id={b.id} /></td>
                    <td>{b.site}</td>
                    <td>
                      <span class={'phase ' + b.phase}>{phaseKeys[b.phase] ? t(phaseKeys[b.phase]) : b.phase}</span>
                      {b.reverted && <span class="tag reverted" data-testid="reverted">{t('rollouts.reverted', { from: r.from })}</span>}
                    </td>
                    <td>{formatTime(lang, b.since)}</td>
                    <td>{b.reason ?? ''}</td>
                  </tr>
                ))}
              </tbody>
            </table>
          </details>
        );
      })}
    </div>
  );
}
