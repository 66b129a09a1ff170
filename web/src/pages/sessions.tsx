import type { ComponentChild } from 'preact';
import { useState } from 'preact/hooks';
import * as api from '../api';
import { useApp, type Ctx } from '../app';
import { formatTime, type MessageKey, type T } from '../i18n';
import { usePoll } from '../ui/poll';
import { RecordingPlayer, SessionTerminal } from '../ui/terminal';
import { SessionRules } from './sessionrules';

// Remote sessions: those open now, with what a user may do to them, and
// those that ended, with how; a session's own page plays its recording.
// Opening and ending a session writes the audit log, whose topic the
// pages follow; they also fetch every few seconds.

/** duration says how long from one time to another (now when absent), in s, min and h. */
export function duration(from: string, to?: string): string {
  const s = Math.max(0, Math.round(((to ? new Date(to).getTime() : Date.now()) - new Date(from).getTime()) / 1000));
  if (s < 60) return `${s} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${s % 60} s`;
  return `${Math.floor(m / 60)} h ${m % 60} min`;
}

/** endedHow says how a session that ended did. */
export function endedHow(t: T, r: api.SessionRecord): string {
  const by = r.ended_by ?? '';
  let how: string;
  if (by === 'exit') how = r.signal ? t('sessions.end.signal', { signal: r.signal }) : t('sessions.end.exit', { code: r.exit_code ?? 0 });
  else if (by.startsWith('user:')) how = t('sessions.end.user', { user: by.slice('user:'.length) });
  else {
    const known: Record<string, MessageKey> = {
      idle: 'sessions.end.idle',
      'time limit': 'sessions.end.timeLimit',
      box: 'sessions.end.box',
      'operator left': 'sessions.end.left',
      'bad input': 'sessions.end.badInput',
      refused: 'sessions.end.refused',
      'console stopped': 'sessions.end.consoleStopped',
      'not approved': 'sessions.end.notApproved',
    };
    how = known[by] ? t(known[by]) : by || '—';
  }
  return r.error ? `${how}: ${r.error}` : how;
}

/** kindOf names a session's kind, with its command or target. */
function kindOf(t: T, r: api.SessionRecord) {
  if (r.kind === 'shell') return <>{t('sessions.kind.shell')}</>;
  if (r.kind === 'exec')
    return (
      <>
        {t('sessions.kind.exec')} <code class="mono">{(r.command ?? []).join(' ')}</code>
      </>
    );
  if (r.kind === 'forward')
    return (
      <>
        {t('sessions.kind.forward')} <code class="mono">{r.target ?? ''}</code>
      </>
    );
  if (r.kind === 'screen') return <>{t(r.view_only ? 'sessions.kind.screenViewOnly' : 'sessions.kind.screen')}</>;
  return <>{r.kind}</>;
}

const boxName = (r: api.SessionRecord) => r.box_name || r.box;

function BoxLink({ r }: { r: api.SessionRecord }) {
  const { navigate } = useApp();
  const to = `/boxes/${encodeURIComponent(r.box)}`;
  return (
    <a href={to} onClick={(e) => { e.preventDefault(); navigate(to); }}>
      {boxName(r)}
    </a>
  );
}

function SessionLink({ r, label }: { r: api.SessionRecord; label?: string }) {
  const { navigate } = useApp();
  const to = `/sessions/${encodeURIComponent(r.id)}`;
  return (
    <a href={to} onClick={(e) => { e.preventDefault(); navigate(to); }} data-testid="session-link">
      {label ?? r.id}
    </a>
  );
}

/** mayEnd: admins end any session, users their own, and the one they approved. */
const mayEnd = (c: Ctx, r: api.SessionRecord, approved: Set<string>) =>
  api.can(c.me.role, 'administer') || (api.can(c.me.role, 'maintain') && (r.user === c.me.user || r.approved_by === c.me.user || approved.has(r.id)));
/** mayApprove: a second maintainer approves a four-eyes session that waits. */
const mayApprove = (c: Ctx, r: api.SessionRecord, approved: Set<string>) =>
  !!r.four_eyes && !r.approved_by && !approved.has(r.id) && r.user !== c.me.user && api.can(c.me.role, 'maintain');
/** mayWatch: admins watch any terminal or command; a maintainer another's four-eyes one, which they may have approved. */
const mayWatch = (c: Ctx, r: api.SessionRecord) =>
  (r.kind === 'shell' || r.kind === 'exec') &&
  r.user !== c.me.user &&
  (api.can(c.me.role, 'administer') || (!!r.four_eyes && api.can(c.me.role, 'maintain')));

/** useSessionActions runs a session's buttons, with their outcome and error. */
function useSessionActions(reload: () => void) {
  const c = useApp();
  const [done, setDone] = useState('');
  const [error, setError] = useState('');
  const [approved, setApproved] = useState<Set<string>>(new Set());
  const [watching, setWatching] = useState('');
  const run = (p: Promise<unknown>, msg: string, after?: () => void) => {
    setError('');
    setDone('');
    p.then(() => {
      setDone(msg);
      after?.();
      reload();
    }).catch((e: Error) => setError(e.message));
  };
  const buttons = (r: api.SessionRecord) => (
    <>
      {mayApprove(c, r, approved) && (
        <button data-testid="approve" onClick={() => run(api.approveSession(c.session, r.id), c.t('sessions.approved', { id: r.id }), () => setApproved(new Set([...approved, r.id])))}>
          {c.t('sessions.approve')}
        </button>
      )}
      {mayWatch(c, r) && (
        <button class="quiet" data-testid="watch" onClick={() => setWatching(r.id)}>
          {c.t('sessions.watch')}
        </button>
      )}
      {mayEnd(c, r, approved) && (
        <button class="danger" data-testid="end" onClick={() => run(api.endSession(c.session, r.id), c.t('sessions.ended', { id: r.id }))}>
          {c.t('sessions.end')}
        </button>
      )}
    </>
  );
  const approval = (r: api.SessionRecord) =>
    !r.four_eyes
      ? ''
      : r.approved_by
        ? c.t('sessions.approvedBy', { who: r.approved_by })
        : approved.has(r.id)
          ? c.t('sessions.approvedHere')
          : c.t('sessions.fourEyes');
  const panel = (
    <>
      {done && <p class="notice" data-testid="done">{done}</p>}
      {error && <p class="error" role="alert">{c.t('common.error', { msg: error })}</p>}
      {watching && (
        <SessionTerminal
          key={watching}
          path={api.watchPath(c.session, watching)}
          title={c.t('term.watchTitle', { id: watching })}
          readOnly
          onClose={() => setWatching('')}
        />
      )}
    </>
  );
  return { buttons, approval, panel };
}

export function Sessions() {
  const { session, t, lang, navigate } = useApp();
  const box = new URLSearchParams(location.search).get('box') ?? '';
  const live = usePoll(() => api.sessions(session, { live: true, box }), [session.tenant, box], ['audit'], 5000);
  const recent = usePoll(() => api.sessions(session, { box, limit: 100 }), [session.tenant, box], ['audit'], 15000);
  const reload = () => {
    live.reload();
    recent.reload();
  };
  const acts = useSessionActions(reload);
  const past = (recent.data ?? []).filter((r) => r.ended);
  const error = live.error || recent.error;
  return (
    <section>
      <h1>{t('sessions.title')}</h1>
      {box && (
        <p class="muted">
          {t('sessions.onBox', { box })}{' '}
          <a href="/sessions" onClick={(e) => { e.preventDefault(); navigate('/sessions'); }}>{t('sessions.allBoxes')}</a>
        </p>
      )}
      {error && <p class="error">{t('common.error', { msg: error })}</p>}
      {acts.panel}
      <h2>{t('sessions.live')}</h2>
      <table data-testid="live-sessions">
        <thead>
          <tr>
            <th>{t('sessions.col.user')}</th>
            <th>{t('sessions.col.box')}</th>
            <th>{t('sessions.col.workload')}</th>
            <th>{t('sessions.col.kind')}</th>
            <th>{t('sessions.col.since')}</th>
            <th>{t('sessions.col.approval')}</th>
            <th />
          </tr>
        </thead>
        <tbody>
          {live.data && live.data.length === 0 && (
            <tr>
              <td colSpan={7}>{t('sessions.noLive')}</td>
            </tr>
          )}
          {(live.data ?? []).map((r) => (
            <tr key={r.id} data-session={r.id} data-user={r.user}>
              <td>{r.user}</td>
              <td><BoxLink r={r} /></td>
              <td>{r.workload || <span class="muted">{t('sessions.theBox')}</span>}</td>
              <td>{kindOf(t, r)}</td>
              <td title={formatTime(lang, r.started)}>
                <SessionLink r={r} label={formatTime(lang, r.started)} /> <span class="muted">({duration(r.started)})</span>
              </td>
              <td>{acts.approval(r)}</td>
              <td>{acts.buttons(r)}</td>
            </tr>
          ))}
        </tbody>
      </table>
      <h2>{t('sessions.past')}</h2>
      <table data-testid="past-sessions">
        <thead>
          <tr>
            <th>{t('sessions.col.user')}</th>
            <th>{t('sessions.col.box')}</th>
            <th>{t('sessions.col.workload')}</th>
            <th>{t('sessions.col.kind')}</th>
            <th>{t('sessions.col.started')}</th>
            <th>{t('sessions.col.duration')}</th>
            <th>{t('sessions.col.ended')}</th>
          </tr>
        </thead>
        <tbody>
          {recent.data && past.length === 0 && (
            <tr>
              <td colSpan={7}>{t('sessions.noPast')}</td>
            </tr>
          )}
          {past.map((r) => (
            <tr key={r.id} data-session={r.id} data-user={r.user} data-ended-by={r.ended_by}>
              <td>{r.user}</td>
              <td><BoxLink r={r} /></td>
              <td>{r.workload || <span class="muted">{t('sessions.theBox')}</span>}</td>
              <td>{kindOf(t, r)}</td>
              <td><SessionLink r={r} label={formatTime(lang, r.started)} /></td>
              <td>{duration(r.started, r.ended)}</td>
              <td class={r.ended_by === 'exit' && !r.error ? '' : 'warn'}>{endedHow(t, r)}</td>
            </tr>
          ))}
        </tbody>
      </table>
      <SessionRules />
    </section>
  );
}

/** SessionPage is one session: what it was, and its recording for auditors. */
export function SessionPage({ id }: { id: string }) {
  const { session, t, lang, me } = useApp();
  const polled = usePoll(() => api.sessionRecord(session, id), [id, session.tenant], ['audit'], 5000);
  const acts = useSessionActions(polled.reload);
  const r = polled.data;
  if (polled.error && !r) return <p class="error">{t('common.error', { msg: polled.error })}</p>;
  if (!r) return <p class="loading">{t('common.loading')}</p>;
  const facts: [string, ComponentChild][] = [
    [t('sessions.col.user'), r.user],
    [t('sessions.col.box'), <BoxLink r={r} />],
    [t('sessions.col.workload'), r.workload || t('sessions.theBox')],
    [t('sessions.col.kind'), kindOf(t, r)],
    [t('sessions.tty'), r.tty ? t('rollouts.yes') : t('rollouts.no')],
    [t('sessions.from'), r.remote ?? '—'],
    [t('sessions.col.started'), formatTime(lang, r.started)],
    [t('sessions.endedAt'), r.ended ? `${formatTime(lang, r.ended)} (${duration(r.started, r.ended)})` : t('sessions.stillLive')],
    [t('sessions.col.ended'), r.ended ? endedHow(t, r) : '—'],
    [t('sessions.bytes'), `${r.bytes_in} / ${r.bytes_out}`],
  ];
  if (r.four_eyes) facts.push([t('sessions.col.approval'), r.approved_by ? `${t('sessions.approvedBy', { who: r.approved_by })} · ${formatTime(lang, r.approved_at)}` : acts.approval(r)]);
  if (r.recording)
    facts.push([
      t('sessions.recording'),
      t('sessions.recordingSize', { chunks: r.recording.chunks, bytes: r.recording.bytes }) + (r.recording.truncated ? ` · ${t('sessions.truncated')}` : ''),
    ]);
  return (
    <section class="session" data-testid="session" data-session={r.id}>
      <h1>{t('sessions.one', { id: r.id })}</h1>
      <dl class="facts" data-testid="session-facts">
        {facts.map(([k, v]) => (
          <>
            <dt>{k}</dt>
            <dd>{v}</dd>
          </>
        ))}
      </dl>
      {!r.ended && <p class="rollout-actions">{acts.buttons(r)}</p>}
      {acts.panel}
      {r.ended && r.kind !== 'forward' && r.kind !== 'screen' && (
        <>
          <h2>{t('sessions.recording')}</h2>
          {api.can(me.role, 'audit') ? <Recording id={r.id} /> : <p class="muted">{t('sessions.auditOnly')}</p>}
        </>
      )}
    </section>
  );
}

/** Recording is a past session's recording: its check, its playback and its download. */
function Recording({ id }: { id: string }) {
  const { session, t } = useApp();
  const [playing, setPlaying] = useState(false);
  const verify = usePoll(() => api.verifyRecording(session, id), [id, session.tenant], [], 60000);
  const v = verify.data;
  return (
    <div class="recording">
      <p data-testid="verify" data-ok={v ? String(v.ok) : ''} class={v ? (v.ok ? 'ok' : 'error') : verify.error ? 'error' : 'muted'}>
        {v
          ? v.ok
            ? t('sessions.intact', { chunks: v.chunks })
            : t('sessions.broken', { problem: v.problem ?? '' })
          : verify.error
            ? t('common.error', { msg: verify.error })
            : t('sessions.verifying')}
      </p>
      {v && (v.unchained_bytes ?? 0) > 0 && <p class="warn">{t('sessions.unchained', { n: v.unchained_bytes ?? 0 })}</p>}
      <p class="rollout-actions">
        {!playing && (
          <button data-testid="play" onClick={() => setPlaying(true)}>
            {t('sessions.play')}
          </button>
        )}
        <a href={api.recordingPath(session, id)} download={`${id}.cast`} data-testid="download">
          {t('sessions.download')}
        </a>
      </p>
      {playing && <RecordingPlayer id={id} />}
    </div>
  );
}
