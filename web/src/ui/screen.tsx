import { useEffect, useRef, useState } from 'preact/hooks';
import * as api from '../api';
import { useApp } from '../app';
import type { T } from '../i18n';
import type { End, Handle } from '../screen/screen';

// The screen loads when first shown (a dynamic import): noVNC stays out of
// the bundle every page loads.

type ScreenState = { kind: 'loading' | 'connecting' | 'running' | 'watching' } | { kind: 'ended' | 'failed'; text: string };

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
  const path = api.screenPath(session, box, workload, !!viewOnly);
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
                setState({ kind: 'failed', text: err.message });
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

  const line: Record<ScreenState['kind'], string> = {
    loading: t('screen.loading'),
    connecting: t('term.connecting'),
    running: t('screen.running'),
    watching: t('screen.watching'),
    ended: 'text' in state ? state.text : '',
    failed: 'text' in state ? t('common.error', { msg: state.text }) : '',
  };
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
      {/* noVNC takes its canvas away when the screen ends: the box goes too. */}
      <div class={state.kind === 'ended' || state.kind === 'failed' ? 'screenhost over' : 'screenhost'} ref={host} />
    </div>
  );
}
