import { useEffect, useRef, useState } from 'preact/hooks';
import * as api from '../api';
import { useApp } from '../app';
import type { T } from '../i18n';
import { endedHow } from '../pages/sessions';
import type { End, Handle } from '../screen/screen';

// The screen loads when first shown (a dynamic import): noVNC stays out of
// the bundle every page loads.

// On a box kept to four eyes the console refuses a screen until a second
// maintainer approves it: the page offers to ask ('approval'), then waits
// for the request's approval ('asking') and opens the screen with it.
type ScreenState =
  | { kind: 'loading' | 'connecting' | 'running' | 'watching' | 'approval' }
  | { kind: 'asking'; request: string }
  | { kind: 'ended' | 'failed'; text: string };

/** askPeriod is how often a request that waits is asked whether it is approved, in milliseconds. */
const askPeriod = 2000;

/** endText says how a screen ended, in the page's language. */
function endText(t: T, e: End): string {
  switch (e.why) {
    case 'closed':
      return t('screen.closed');
    case 'refused':
      return t('screen.refused');
    case 'unanswered':
      return t('screen.unanswered');
    case 'security':
      return t('screen.security', { why: e.reason });
    case 'password':
      return t('screen.password');
  }
}

/**
 * VMScreen shows a VM workload's screen until the page leaves it or
 * onClose: the connection closes then, which ends the screen's session.
 * viewOnly sends the VM nothing.
 */
export function VMScreen({ box, workload, title, viewOnly, onClose }: { box: string; workload: string; title: string; viewOnly?: boolean; onClose: () => void }) {
  const { session, t } = useApp();
  const host = useRef<HTMLDivElement>(null);
  const handle = useRef<Handle | null>(null);
  const [state, setState] = useState<ScreenState>({ kind: 'loading' });
  // request is the approved request the screen opens with, on a box kept to four eyes.
  const [request, setRequest] = useState('');
  const [asked, setAsked] = useState(false);
  const [askError, setAskError] = useState('');
  // pending is a request asked for and not yet approved or ended: closing
  // the screen ends it, so it does not wait for a second maintainer in
  // vain.
  const pending = useRef('');
  useEffect(
    () => () => {
      if (pending.current) api.endSession(session, pending.current).catch(() => {});
    },
    [],
  );
  const path = api.screenPath(session, box, workload, !!viewOnly, request);
  useEffect(() => {
    let gone = false;
    setState({ kind: 'loading' });
    import('../screen/screen')
      .then((m) => {
        if (gone || !host.current) return;
        setState({ kind: 'connecting' });
        host.current.scrollIntoView({ block: 'nearest' });
        handle.current = m.open(host.current, {
          path,
          viewOnly,
          onShown: () => {
            if (gone) return;
            setState({ kind: viewOnly ? 'watching' : 'running' });
            handle.current?.focus();
          },
          onEnd: (e) => {
            if (gone) return;
            if (e.why === 'closed') {
              setState({ kind: 'ended', text: endText(t, e) });
              return;
            }
            setState({ kind: 'failed', text: endText(t, e) });
            if (e.why !== 'refused') return;
            // The browser does not say why a WebSocket was refused: the same
            // request, without the upgrade, has the console say it.
            api.call(session, 'GET', path).then(
              () => {},
              (err: Error) => {
                if (gone || !(err instanceof api.ApiError) || err.status === 400) return;
                setState(api.needsApproval(err) ? { kind: 'approval' } : { kind: 'failed', text: err.message });
              },
            );
          },
        });
      })
      .catch((err: Error) => !gone && setState({ kind: 'failed', text: err.message }));
    return () => {
      gone = true;
      handle.current?.dispose();
      handle.current = null;
    };
  }, [path]);

  // A request that waits is asked after every askPeriod whether it is
  // approved, until it is (the screen opens with it), it ended, or the
  // screen is closed.
  const asking = state.kind === 'asking' ? state.request : '';
  useEffect(() => {
    if (!asking) return;
    let gone = false;
    let timer = 0;
    const check = () =>
      api.sessionRecord(session, asking).then(
        (r) => {
          if (gone) return;
          setAskError('');
          if (r.ended || r.approved_by) pending.current = '';
          if (r.ended) setState({ kind: 'failed', text: t('screen.askEnded', { id: r.id, why: endedHow(t, r) }) });
          else if (r.approved_by) setRequest(r.id);
          else timer = window.setTimeout(check, askPeriod);
        },
        (e: Error) => {
          if (gone) return;
          setAskError(e.message);
          timer = window.setTimeout(check, askPeriod);
        },
      );
    timer = window.setTimeout(check, askPeriod);
    return () => {
      gone = true;
      clearTimeout(timer);
    };
  }, [asking, session.tenant]);

  const ask = () => {
    setAsked(true);
    setAskError('');
    api
      .askSession(session, box, { kind: 'screen', workload, view_only: !!viewOnly })
      .then((r) => {
        pending.current = r.id;
        setState({ kind: 'asking', request: r.id });
      })
      .catch((e: Error) => setAskError(e.message))
      .finally(() => setAsked(false));
  };

  const line: Record<ScreenState['kind'], string> = {
    loading: t('screen.loading'),
    connecting: t('term.connecting'),
    running: t('screen.running'),
    watching: t('screen.watching'),
    approval: t('screen.approvalNeeded'),
    asking: t('term.waiting'),
    ended: 'text' in state ? state.text : '',
    failed: 'text' in state ? t('common.error', { msg: state.text }) : '',
  };
  const shows = state.kind === 'loading' || state.kind === 'connecting' || state.kind === 'running' || state.kind === 'watching';
  return (
    <div class="session-term vm-screen" data-testid="screen" data-view-only={viewOnly ? 'true' : 'false'}>
      <div class="termbar">
        <strong>{title}</strong>
        <span class={'termstate ' + state.kind} data-testid="screen-status" data-state={state.kind}>
          {line[state.kind]}
        </span>
        <span class="termbuttons">
          {!viewOnly && (
            <button class="quiet" data-testid="screen-cad" disabled={state.kind !== 'running'} onClick={() => handle.current?.ctrlAltDel()}>
              {t('screen.ctrlAltDel')}
            </button>
          )}
          <button class="quiet" onClick={onClose} data-testid="screen-close">{t('term.close')}</button>
        </span>
      </div>
      {state.kind === 'approval' && (
        <p class="notice" data-testid="screen-approval">
          {t('screen.fourEyes')}{' '}
          <button data-testid="screen-ask" disabled={asked} onClick={ask}>{t('screen.ask')}</button>
        </p>
      )}
      {state.kind === 'asking' && (
        <p class="notice" data-testid="screen-asking" data-request={state.request}>{t('screen.asking', { id: state.request })}</p>
      )}
      {askError && <p class="error" role="alert" data-testid="screen-ask-error">{t('common.error', { msg: askError })}</p>}
      {/* noVNC takes its canvas away when the screen ends: the box goes too. */}
      <div class={shows ? 'screenhost' : 'screenhost over'} ref={host} />
    </div>
  );
}
