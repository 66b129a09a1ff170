import type { ComponentChild } from 'preact';
import { useState } from 'preact/hooks';
import * as api from '../api';
import { useApp } from '../app';
import { formatTime, type T } from '../i18n';
import { healthWord } from '../ui/health';
import { usePoll } from '../ui/poll';
import { VMScreen } from '../ui/screen';
import { SessionTerminal } from '../ui/terminal';

export function BoxPage({ id }: { id: string }) {
  const { session, t, lang, me, navigate } = useApp();
  const box = usePoll(() => api.box(session, id), [id, session.tenant], ['boxes']);
  const state = usePoll(() => api.boxState(session, id), [id, session.tenant], ['state']);
  const keys = usePoll(() => api.keys(session, id), [id, session.tenant], ['keys']);
  const [logsOf, setLogsOf] = useState('');
  // shell is where the open terminal runs: '' the box itself, else a
  // workload's name; null when none is open.
  const [shell, setShell] = useState<string | null>(null);
  // screen is the VM whose screen is open, and whether only to watch it.
  const [screen, setScreen] = useState<{ workload: string; viewOnly: boolean } | null>(null);
  const b = box.data;
  if (box.error && !b) return <p class="error">{t('common.error', { msg: box.error })}</p>;
  if (!b) return <p class="loading">{t('common.loading')}</p>;
  const st = state.data;
  const workloads = (st?.statuses ?? []).filter((s) => s.kind === 'Workload');
  // A workload's runtime is in what the box was told to run: VMs have a screen.
  const isVM = new Set(
    (st?.objects ?? []).filter((o) => o.kind === 'Workload' && (o.spec as { runtime?: string } | null)?.runtime === 'qemu').map((o) => o.name),
  );
  // A shell or a VM's screen needs the maintainer's role, or the admin's.
  const mayShell = api.can(me.role, 'maintain');
  const sessionsOf = `/sessions?box=${encodeURIComponent(id)}`;
  // Each fact: its name, its value, and a test ID for those tests read.
  const facts: [string, ComponentChild, string?][] = [
    ...(b.health
      ? [[
          t('box.health'),
          <>
            <span class={'health ' + b.health} data-testid="health" data-health={b.health} title={b.health_detail}>{healthWord(t, b.health)}</span>
            {b.health_detail && <span class="muted"> · {b.health_detail}</span>}
          </>,
        ] as [string, ComponentChild]]
      : []),
    [t('box.os'), [b.os, b.os_version].filter(Boolean).join(' ')],
    [t('box.arch'), b.arch ?? ''],
    [t('box.agent'), b.agent_version ?? ''],
    [t('box.hostname'), b.hostname ?? ''],
    [t('box.address'), b.address ?? ''],
    [t('box.seen'), b.online ? t('state.online') : formatTime(lang, b.last_seen)],
    [t('box.rtt'), b.rtt_ms ? `${b.rtt_ms.toFixed(1)} ms` : '—'],
    [t('box.enrolled'), formatTime(lang, b.enrolled_at)],
    [t('box.cert'), formatTime(lang, b.cert_not_after)],
    ...vitalFacts(t, lang, b.vitals),
  ];
  return (
    <section class="box">
      <h1 data-testid="box-name">
        {b.name} <span class={'state ' + (b.online ? 'on' : 'off')}>{b.online ? t('state.online') : t('state.offline')}</span>
      </h1>
      <p class="muted">
        {b.id} · {b.region} / {b.site} ·{' '}
        <a href={sessionsOf} onClick={(e) => { e.preventDefault(); navigate(sessionsOf); }}>{t('box.sessions')}</a>
      </p>
      {mayShell && shell === null && (
        <p class="rollout-actions">
          <button data-testid="open-shell" disabled={!b.online} onClick={() => setShell('')}>{t('box.openShell')}</button>
          {!b.online && <span class="muted">{t('box.offlineNoShell')}</span>}
        </p>
      )}
      {mayShell && <BoxWeb id={id} online={b.online} />}
      {shell !== null && (
        <SessionTerminal
          key={shell}
          path={api.execPath(session, id, shell)}
          title={t('term.title', { target: shell ? `${b.name} / ${shell}` : b.name })}
          onClose={() => setShell(null)}
        />
      )}
      {screen !== null && (
        <VMScreen
          key={`${screen.workload}/${screen.viewOnly}`}
          box={id}
          workload={screen.workload}
          viewOnly={screen.viewOnly}
          title={t(screen.viewOnly ? 'screen.watchTitle' : 'screen.title', { target: `${b.name} / ${screen.workload}` })}
          onClose={() => setScreen(null)}
        />
      )}
      <h2>{t('box.facts')}</h2>
      <dl class="facts">
        {facts.map(([k, v, id]) => (
          <>
            <dt>{k}</dt>
            <dd data-testid={id}>{v || '—'}</dd>
          </>
        ))}
      </dl>
      {st && <p class="muted" data-testid="revision">{t('box.revision', { desired: st.revision, acked: st.acked })}</p>}
      <h2>{t('box.workloads')}</h2>
      <table data-testid="workloads">
        <thead>
          <tr>
            <th>{t('box.col.workload')}</th>
            <th>{t('box.col.release')}</th>
            <th>{t('box.col.phase')}</th>
            <th>{t('box.col.health')}</th>
            <th>{t('box.col.restarts')}</th>
            <th>{t('box.col.message')}</th>
            <th />
          </tr>
        </thead>
        <tbody>
          {workloads.length === 0 && (
            <tr>
              <td colSpan={7}>{t('common.none')}</td>
            </tr>
          )}
          {workloads.map((w) => (
            <tr data-workload={w.name}>
              <td>{w.name}</td>
              <td>{w.release ?? ''}</td>
              <td class={'phase ' + w.phase.toLowerCase()}>{w.phase}</td>
              <td>{w.health ?? ''}</td>
              <td>{w.restarts ?? 0}</td>
              <td>{w.message ?? ''}</td>
              <td>
                <button class="quiet" onClick={() => setLogsOf(w.name)}>{t('box.logs')}</button>
                {mayShell && (
                  <button class="quiet" data-testid="workload-shell" disabled={!b.online || shell !== null} onClick={() => setShell(w.name)}>
                    {t('box.openShell')}
                  </button>
                )}
                {mayShell && isVM.has(w.name) && (
                  <>
                    <button class="quiet" data-testid="workload-screen" disabled={!b.online || screen !== null} onClick={() => setScreen({ workload: w.name, viewOnly: false })}>
                      {t('box.screen')}
                    </button>
                    <button class="quiet" data-testid="workload-watch-screen" disabled={!b.online || screen !== null} onClick={() => setScreen({ workload: w.name, viewOnly: true })}>
                      {t('box.watchScreen')}
                    </button>
                  </>
                )}
              </td>
            </tr>
          ))}
        </tbody>
      </table>
      {logsOf && <Logs box={id} workload={logsOf} />}
      <h2>{t('box.keys')}</h2>
      <table data-testid="keys">
        <thead>
          <tr>
            <th>{t('box.col.key')}</th>
            <th>{t('box.col.port')}</th>
            <th>{t('fleet.col.state')}</th>
            <th>{t('box.col.holder')}</th>
            <th>{t('fleet.col.labels')}</th>
          </tr>
        </thead>
        <tbody>
          {(keys.data ?? []).map((k) => (
            <tr>
              <td>{k.id}</td>
              <td>{k.port}</td>
              <td>{k.state}</td>
              <td>{k.holder ?? ''}</td>
              <td>{api.formatLabels(k.labels)}</td>
            </tr>
          ))}
        </tbody>
      </table>
      <h2>{t('box.events')}</h2>
      <ul class="events" data-testid="events">
        {(st?.events ?? []).slice(-50).reverse().map((e) => (
          <li class={e.warning ? 'warn' : ''}>
            <time>{formatTime(lang, e.time)}</time> {e.kind}/{e.name} {e.reason} {e.message ?? ''}
          </li>
        ))}
      </ul>
    </section>
  );
}

/** size says a number of bytes in KiB, MiB, GiB or TiB. */
export function size(n: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i++;
  }
  return `${i > 0 && n < 10 ? n.toFixed(1) : Math.round(n)} ${units[i]}`;
}

/** uptime says a number of seconds in days and hours, or hours and minutes. */
function uptime(t: T, s: number): string {
  const m = Math.floor(s / 60);
  const h = Math.floor(m / 60);
  return h >= 24 ? t('box.uptimeDays', { d: Math.floor(h / 24), h: h % 24 }) : t('box.uptimeHours', { h, m: m % 60 });
}

/** vitalFacts are the box's latest figures of itself, as facts; a figure its OS does not tell (0) is left out. */
function vitalFacts(t: T, lang: Parameters<typeof formatTime>[0], v?: api.BoxVitals): [string, ComponentChild, string][] {
  if (!v) return [[t('box.vitals'), <span class="muted">{t('box.noVitals')}</span>, 'vitals-none']];
  const used = (u: number, total: number) =>
    total > 0 ? t('box.used', { used: size(u), total: size(total), percent: Math.round((u / total) * 100) }) : '';
  return [
    [t('box.cpu'), `${v.cpu_percent.toFixed(1)} %`, 'vital-cpu'],
    [t('box.memory'), used(v.memory_used_bytes, v.memory_total_bytes), 'vital-memory'],
    [t('box.disk'), used(v.disk_used_bytes, v.disk_total_bytes), 'vital-disk'],
    [t('box.temperature'), v.temperature_celsius ? `${v.temperature_celsius.toFixed(1)} °C` : '', 'vital-temperature'],
    [t('box.uptime'), v.uptime_seconds ? uptime(t, v.uptime_seconds) : '', 'vital-uptime'],
    [t('box.vitalsAt'), formatTime(lang, v.reported_at), 'vitals-at'],
  ];
}

/**
 * BoxWeb opens a web page the box serves itself (127.0.0.1:PORT on the
 * box: a router's or a robot's admin page) in a new tab: the console
 * serves it under its own origin, sandboxed, to maintainers and admins.
 */
function BoxWeb({ id, online }: { id: string; online: boolean }) {
  const { session, t } = useApp();
  const [port, setPort] = useState('80');
  const [error, setError] = useState('');
  const open = (e: Event) => {
    e.preventDefault();
    const p = port.trim();
    const n = Number(p);
    if (!/^[0-9]+$/.test(p) || n < 1 || n > 65535) {
      setError(t('box.webPortBad', { port: p }));
      return;
    }
    setError('');
    // noopener: the box's page gets no handle on the console's.
    window.open(api.boxWebPath(session, id, n), '_blank', 'noopener');
  };
  return (
    <form class="inline box-web" noValidate onSubmit={open} data-testid="box-web">
      <label>
        {t('box.webPort')}{' '}
        <input name="port" type="number" min={1} max={65535} value={port} data-testid="web-port"
          onInput={(e) => setPort((e.target as HTMLInputElement).value)} />
      </label>
      <button type="submit" data-testid="open-web" disabled={!online}>{t('box.openWeb')}</button>
      <span class="muted">{online ? t('box.webHint') : t('box.offlineNoWeb')}</span>
      {error && <span class="error" role="alert" data-testid="web-error">{error}</span>}
    </form>
  );
}

function Logs({ box, workload }: { box: string; workload: string }) {
  const { session, t } = useApp();
  const logs = usePoll(() => api.logs(session, box, workload, 200), [box, workload, session.tenant], [], 5000);
  return (
    <div class="logs">
      <h3>{t('box.logsOf', { name: workload })}</h3>
      <p class="muted">{t('box.logsFollow')}</p>
      {logs.error && <p class="error">{t('common.error', { msg: logs.error })}</p>}
      <pre data-testid="logs">{logs.data?.text || t('box.noLogs')}</pre>
    </div>
  );
}
