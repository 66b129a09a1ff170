import { useEffect, useRef, useState } from 'preact/hooks';
import * as api from '../api';
import { useApp } from '../app';
import type { T } from '../i18n';
import type { Exit } from '../terminal/frames';
import type { Handle } from '../terminal/terminal';

// The terminal and the player load when first shown (dynamic imports):
// xterm.js and asciinema-player stay out of the bundle every page loads.

type TermState =
  | { kind: 'loading' | 'connecting' | 'running' | 'watching' }
  | { kind: 'waiting'; text: string }
  | { kind: 'ended' | 'failed'; text: string };

/** exitText says how a session ended, as the terminal's last line. */
export function exitText(t: T, e: Exit): string {
  if (e.error) return t('term.endedWhy', { why: e.error });
  if (e.signal) return t('term.signal', { signal: e.signal });
  return t('term.exit', { code: e.code });
}

/**
 * SessionTerminal shows a remote session at path (api.execPath, or
 * api.watchPath with readOnly) until the page leaves it or onClose: the
 * connection closes then, which ends a session this page opened.
 */
export function SessionTerminal({ path, title, readOnly, onClose }: { path: string; title: string; readOnly?: boolean; onClose: () => void }) {
  const { session, t } = useApp();
  const host = useRef<HTMLDivElement>(null);
  const [state, setState] = useState<TermState>({ kind: 'loading' });
  // size is the terminal's; fixed when it is the watched terminal's, not its box's.
  const [size, setSize] = useState<{ cols: number; rows: number; fixed: boolean } | null>(null);
  useEffect(() => {
    let gone = false;
    let h: Handle | null = null;
    setState({ kind: 'loading' });
    setSize(null);
    import('../terminal/terminal')
      .then((m) => {
        if (gone || !host.current) return;
        setState({ kind: 'connecting' });
        host.current.scrollIntoView({ block: 'nearest' });
        h = m.open(host.current, {
          path,
          readOnly,
          words: { exit: (e) => exitText(t, e), closed: t('term.closed') },
          onStatus: (st) => {
            if (st.state === 'waiting_approval') setState({ kind: 'waiting', text: st.message ?? '' });
            else setState({ kind: st.state === 'watching' ? 'watching' : 'running' });
          },
          onSize: (cols, rows, fixed) => !gone && setSize({ cols, rows, fixed }),
          onEnd: (e, opened) => {
            if (gone) return;
            if (e) {
              setState({ kind: 'ended', text: exitText(t, e) });
              return;
            }
            if (opened) {
              setState({ kind: 'ended', text: t('term.closed') });
              return;
            }
            // The browser does not say why a WebSocket was refused: the same
            // request, without the upgrade, has the console say it.
            setState({ kind: 'failed', text: t('term.refused') });
            api.call(session, 'GET', path).then(
              () => {},
              (err: Error) => {
                if (gone || !(err instanceof api.ApiError) || err.status === 400) return;
                h?.line(err.message);
                setState({ kind: 'failed', text: err.message });
              },
            );
          },
        });
      })
      .catch((err: Error) => !gone && setState({ kind: 'failed', text: err.message }));
    return () => {
      gone = true;
      h?.dispose();
    };
  }, [path, readOnly]);

  const line: Record<TermState['kind'], string> = {
    loading: t('term.loading'),
    connecting: t('term.connecting'),
    running: t('term.running'),
    watching: t('term.watching'),
    waiting: t('term.waiting'),
    ended: 'text' in state ? state.text : '',
    failed: 'text' in state ? t('common.error', { msg: state.text }) : '',
  };
  return (
    <div class="session-term" data-testid="terminal" data-cols={size?.cols} data-rows={size?.rows}>
      <div class="termbar">
        <strong>{title}</strong>
        <span class={'termstate ' + state.kind} data-testid="term-status" data-state={state.kind}>
          {line[state.kind]}
        </span>
        <button class="quiet" onClick={onClose} data-testid="term-close">{t('term.close')}</button>
      </div>
      {state.kind === 'waiting' && state.text && <p class="notice" data-testid="term-waiting">{state.text}</p>}
      <div class={size?.fixed ? 'termhost fixed' : 'termhost'} ref={host} />
    </div>
  );
}

/**
 * wasmRefused says why the page may not run WebAssembly, which the
 * player's terminal emulator is, or '' when it may: a Content-Security-
 * Policy without 'wasm-unsafe-eval' forbids it. It is asked before the
 * player loads, whose loading would fail on it.
 */
async function wasmRefused(): Promise<string> {
  try {
    await WebAssembly.instantiate(new Uint8Array([0, 0x61, 0x73, 0x6d, 1, 0, 0, 0]));
    return '';
  } catch (e) {
    return e instanceof Error ? e.message : String(e);
  }
}

/** RecordingPlayer plays a session's recording, from the console. */
export function RecordingPlayer({ id }: { id: string }) {
  const { session, t } = useApp();
  const host = useRef<HTMLDivElement>(null);
  const [error, setError] = useState('');
  const [loading, setLoading] = useState(true);
  useEffect(() => {
    let gone = false;
    let dispose = () => {};
    setError('');
    setLoading(true);
    wasmRefused()
      .then((why) => {
        if (why) throw new Error(why);
        return import('../terminal/player');
      })
      .then((m) => {
        if (gone || !host.current) return;
        dispose = m.play(host.current, api.recordingPath(session, id), (msg) => !gone && setError(msg)).dispose;
        setLoading(false);
      })
      .catch((err: Error) => !gone && setError(err.message));
    return () => {
      gone = true;
      dispose();
    };
  }, [id, session.tenant]);
  return (
    <div class="player" data-testid="player">
      {loading && !error && <p class="muted">{t('player.loading')}</p>}
      {error && <p class="error" role="alert">{t('player.failed', { msg: error })}</p>}
      <div ref={host} />
    </div>
  );
}
