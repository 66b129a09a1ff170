import { useMemo, useRef, useState } from 'preact/hooks';
import * as api from '../api';
import { useApp } from '../app';
import { formatTime } from '../i18n';
import { usePoll } from '../ui/poll';

export function Apps() {
  const { session, t, lang, me, navigate } = useApp();
  const polled = usePoll(() => api.apps(session), [session.tenant], ['apps']);
  const [name, setName] = useState('');
  const [error, setError] = useState('');
  return (
    <section>
      <h1>{t('apps.title')}</h1>
      {(error || polled.error) && <p class="error" role="alert">{t('common.error', { msg: error || polled.error })}</p>}
      <table data-testid="apps">
        <thead>
          <tr>
            <th>{t('apps.name')}</th>
            <th>{t('apps.description')}</th>
            <th>{t('apps.created')}</th>
          </tr>
        </thead>
        <tbody>
          {(polled.data ?? []).map((a) => (
            <tr data-app={a.name}>
              <td>
                <a href={`/apps/${encodeURIComponent(a.name)}`} onClick={(e) => { e.preventDefault(); navigate(`/apps/${encodeURIComponent(a.name)}`); }}>{a.name}</a>
              </td>
              <td>{a.description ?? ''}</td>
              <td>{formatTime(lang, a.created_at)} · {a.created_by}</td>
            </tr>
          ))}
        </tbody>
      </table>
      {api.can(me.role, 'operate') && (
        <form class="inline" data-testid="app-form"
          onSubmit={(e) => { e.preventDefault(); api.createApp(session, name, '').then(() => { setName(''); setError(''); polled.reload(); }).catch((err: Error) => setError(err.message)); }}>
          <input name="app" placeholder={t('apps.name')} value={name} onInput={(e) => setName((e.target as HTMLInputElement).value)} required />
          <button type="submit">{t('apps.create')}</button>
        </form>
      )}
    </section>
  );
}

/** fieldErrors files the console's validation message under the fields it names first on each line. */
function fieldErrors(msg: string, fields: string[]): Record<string, string> {
  const out: Record<string, string> = {};
  for (const line of msg.split('\n')) {
    const word = line.trim().split(/[\s[:]/)[0].toLowerCase();
    const f = fields.find((x) => word === x || word === x + 's') ?? '_';
    out[f] = out[f] ? out[f] + '\n' + line : line;
  }
  return out;
}

export function AppPage({ name }: { name: string }) {
  const { session, t, lang, me } = useApp();
  const releases = usePoll(() => api.releases(session, name), [name, session.tenant], ['apps']);
  const pins = usePoll(() => api.pins(session, name), [name, session.tenant], ['apps']);
  const status = usePoll(() => api.appStatus(session, name), [name, session.tenant], ['apps', 'state', 'boxes']);
  const operate = api.can(me.role, 'operate');
  const [error, setError] = useState('');
  const reload = () => { releases.reload(); pins.reload(); status.reload(); };
  return (
    <section>
      <h1 data-testid="app-name">{name}</h1>
      {error && <p class="error" role="alert">{error}</p>}
      <h2>{t('apps.releases')}</h2>
      <table data-testid="releases">
        <thead>
          <tr>
            <th>{t('apps.version')}</th>
            <th>{t('apps.runtime')}</th>
            <th>{t('apps.image')}</th>
            <th>{t('apps.keys')}</th>
            <th>{t('apps.created')}</th>
          </tr>
        </thead>
        <tbody>
          {(releases.data ?? []).map((r) => (
            <tr data-release={r.version}>
              <td>{r.version}</td>
              <td>{r.runtime}</td>
              <td class="mono">{r.image}</td>
              <td>{(r.keys ?? []).map((k) => api.formatLabels(k.labels)).join('; ')}</td>
              <td>{formatTime(lang, r.created_at)} · {r.created_by}</td>
            </tr>
          ))}
        </tbody>
      </table>
      {operate && <ReleaseForm app={name} onMade={reload} />}
      {operate && (releases.data?.length ?? 0) > 0 && <DeployPanel app={name} releases={releases.data ?? []} onDone={reload} setError={setError} />}
      <h2>{t('apps.pins')}</h2>
      <table data-testid="pins">
        <tbody>
          {(pins.data ?? []).map((p) => (
            <tr data-pin={`${p.scope}/${p.target}`}>
              <td>{p.scope} {p.target}</td>
              <td>{p.version}</td>
              <td>{formatTime(lang, p.at)} · {p.by}</td>
              <td>
                {operate && (
                  <button class="danger" onClick={() => api.undeploy(session, name, p.scope, p.target).then(reload).catch((e: Error) => setError(e.message))}>
                    {t('apps.undeploy')}
                  </button>
                )}
              </td>
            </tr>
          ))}
        </tbody>
      </table>
      <h2>{t('apps.status')}</h2>
      <table data-testid="app-status">
        <thead>
          <tr>
            <th>{t('fleet.col.name')}</th>
            <th>{t('apps.desired')}</th>
            <th>{t('apps.running')}</th>
            <th>{t('box.col.phase')}</th>
            <th>{t('box.col.health')}</th>
            <th>{t('box.col.message')}</th>
          </tr>
        </thead>
        <tbody>
          {(status.data ?? []).map((b) => (
            <tr data-box={b.box_name}>
              <td>{b.box_name} <span class={'state ' + (b.online ? 'on' : 'off')}>{b.online ? t('state.online') : t('state.offline')}</span></td>
              <td>{b.desired_release}</td>
              <td>{b.running_release ?? ''}</td>
              <td class={'phase ' + (b.phase ?? '').toLowerCase()}>{b.phase ?? ''}</td>
              <td>{b.health ?? ''}</td>
              <td>{b.message ?? ''}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </section>
  );
}

const releaseFields = ['version', 'runtime', 'image', 'args', 'env', 'memory', 'key', 'probe'];

function ReleaseForm({ app, onMade }: { app: string; onMade: () => void }) {
  const { session, t } = useApp();
  const [f, setF] = useState({ version: '', runtime: 'containerd', image: '', args: '', env: '', memory: '', key: '', probe: '', probeExec: '' });
  const [errs, setErrs] = useState<Record<string, string>>({});
  const set = (k: keyof typeof f) => (e: Event) => {
    const v = (e.target as HTMLInputElement).value;
    setF((p) => ({ ...p, [k]: v }));
  };
  const submit = (e: Event) => {
    e.preventDefault();
    const spec: api.ReleaseSpec = { version: f.version.trim(), runtime: f.runtime, image: f.image.trim() };
    const lines = (v: string) => v.split('\n').map((s) => s.trim()).filter(Boolean);
    if (lines(f.env).length) spec.env = lines(f.env);
    if (lines(f.args).length) spec.args = lines(f.args);
    if (f.memory) spec.memory_bytes = Math.round(Number(f.memory) * 1024 * 1024);
    if (f.key.includes('=')) spec.keys = [{ labels: api.parseLabels(f.key) }];
    if (f.probe) spec.probes = [{ http: f.probe.trim() }];
    else if (f.probeExec) spec.probes = [{ exec: f.probeExec.trim().split(/\s+/) }];
    api
      .createRelease(session, app, spec)
      .then(() => { setErrs({}); setF((p) => ({ ...p, version: '' })); onMade(); })
      .catch((err: Error) => setErrs(fieldErrors(err.message, releaseFields)));
  };
  const field = (k: keyof typeof f, label: string, input: preact.JSX.Element) => (
    <label class={errs[k] ? 'bad' : ''}>
      {label}
      {input}
      {errs[k] && <span class="error" data-field-error={k}>{errs[k]}</span>}
    </label>
  );
  return (
    <form class="grid" onSubmit={submit} data-testid="release-form">
      <h3>{t('apps.newRelease')}</h3>
      {field('version', t('apps.version'), <input name="version" value={f.version} onInput={set('version')} />)}
      {field('runtime', t('apps.runtime'), (
        <select name="runtime" value={f.runtime} onChange={set('runtime')}>
          <option value="containerd">containerd</option>
          <option value="qemu">qemu</option>
          <option value="process">process</option>
        </select>
      ))}
      {field('image', t('apps.image'), <input name="image" value={f.image} onInput={set('image')} />)}
      {field('args', t('apps.args'), <textarea name="args" value={f.args} onInput={set('args')} rows={2} />)}
      {field('env', t('apps.env'), <textarea name="env" value={f.env} onInput={set('env')} rows={2} />)}
      {field('memory', t('apps.memory'), <input name="memory" type="number" min={0} value={f.memory} onInput={set('memory')} />)}
      {field('key', t('apps.keyNeed'), <input name="key" placeholder="bank=ICBC" value={f.key} onInput={set('key')} />)}
      {field('probe', t('apps.probe'), <input name="probe" placeholder="http://127.0.0.1:8080/healthz" value={f.probe} onInput={set('probe')} />)}
      {field('probeExec', t('apps.probeExec'), <input name="probeExec" placeholder="/bin/true" value={f.probeExec} onInput={set('probeExec')} />)}
      {errs._ && <p class="error" data-field-error="_">{errs._}</p>}
      <button type="submit">{t('apps.createRelease')}</button>
    </form>
  );
}

function DeployPanel(props: { app: string; releases: api.Release[]; onDone: () => void; setError: (s: string) => void }) {
  const { session, t } = useApp();
  const { app, releases } = props;
  const fleet = usePoll(() => api.boxes(session), [session.tenant], ['boxes']);
  const [version, setVersion] = useState(releases[releases.length - 1].version);
  const [scope, setScope] = useState<[string, string] | null>(null);
  const [impact, setImpact] = useState<api.DeployPreview | null>(null);
  const [result, setResult] = useState('');
  const previews = useRef(0);
  const tree = useMemo(() => api.tree((fleet.data ?? []).filter((b) => b.state !== 'revoked')), [fleet.data]);
  const pick = (s: string, target: string) => {
    setScope([s, target]);
    setResult('');
    setImpact(null);
    // Only the preview of the scope picked last is shown: an answer to an
    // earlier pick that comes later is dropped.
    const asked = ++previews.current;
    api
      .preview(session, app, version, s, target)
      .then((im) => asked === previews.current && setImpact(im))
      .catch((e: Error) => props.setError(e.message));
  };
  const confirm = () => {
    if (!scope) return;
    api
      .deploy(session, app, version, scope[0], scope[1])
      .then((r) => {
        setResult(t('apps.deployed', { n: r.changed_boxes.length }) + (r.problems?.length ? ' ' + r.problems.join('; ') : ''));
        setImpact(null);
        props.onDone();
      })
      .catch((e: Error) => props.setError(e.message));
  };
  const chosen = (s: string, target: string) => (scope && scope[0] === s && scope[1] === target ? 'active' : '');
  return (
    <div class="deploy" data-testid="deploy">
      <h2>{t('apps.deploy')}</h2>
      <label>
        {t('apps.release')}{' '}
        <select value={version} onChange={(e) => { setVersion((e.target as HTMLSelectElement).value); setImpact(null); setScope(null); }} data-testid="deploy-version">
          {releases.map((r) => <option value={r.version}>{r.version}</option>)}
        </select>
      </label>
      <p class="muted">{t('apps.pickScope')}</p>
      <div class="tree scope" data-testid="scope-tree">
        {tree.map(([r, sites]) => (
          <div class="region">
            <a href="#" class={chosen('region', r)} onClick={(e) => { e.preventDefault(); pick('region', r); }}>{t('apps.region')} {r}</a>
            {sites.map(([s, list]) => (
              <div>
                <a href="#" class={'site ' + chosen('site', s)} onClick={(e) => { e.preventDefault(); pick('site', s); }}>{t('apps.site')} {s}</a>
                {list.map((b) => (
                  <a href="#" class={'site boxpick ' + chosen('box', b.id)} onClick={(e) => { e.preventDefault(); pick('box', b.id); }}>{b.name}</a>
                ))}
              </div>
            ))}
          </div>
        ))}
      </div>
      {impact && scope && (
        <div class="impact" data-testid="impact">
          <p>
            {t('apps.impact', { n: impact.boxes.length, offline: impact.offline, nokey: impact.no_key, already: impact.already })}
            {impact.kept > 0 && ' ' + t('apps.kept', { n: impact.kept })}
          </p>
          <ul>
            {impact.boxes.filter((b) => b.missing_keys?.length).map((b) => <li>{b.name}: {t('apps.noKey', { keys: (b.missing_keys ?? []).join('; ') })}</li>)}
          </ul>
          <button onClick={confirm} data-testid="confirm-deploy">{t('apps.confirm', { version, scope: `${scope[0]} ${scope[1]}` })}</button>
        </div>
      )}
      {result && <p class="notice" data-testid="deploy-result">{result}</p>}
    </div>
  );
}
