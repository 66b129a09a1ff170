// The terminal of a remote session: xterm.js on the session's WebSocket.
// This module and xterm.js load only when a page opens a terminal, so the
// console's first page stays small.

import { Terminal } from '@xterm/xterm';
import { FitAddon } from '@xterm/addon-fit';
import '@xterm/xterm/css/xterm.css';
import * as frames from './frames';
import { routeStyleElements, sweep } from './cspstyle';

/** Words are what the terminal writes in its own voice, in the page's language. */
export interface Words {
  exit: (e: frames.Exit) => string;
  /** closed: the connection ended with no word of how the session ended. */
  closed: string;
}

export interface Options {
  /** path is the session's WebSocket, on the console's origin, with its query. */
  path: string;
  /** readOnly: a watch, which sends nothing. */
  readOnly?: boolean;
  words: Words;
  /** onStatus runs on how the session stands; a watcher's "resized" the terminal takes itself. */
  onStatus: (s: frames.Status) => void;
  /**
   * onSize runs with the terminal's size whenever it changes; fixed: it
   * keeps the watched terminal's size instead of fitting its box.
   */
  onSize?: (cols: number, rows: number, fixed: boolean) => void;
  /** onEnd runs once: with the exit, or null when the connection closed without one. */
  onEnd: (e: frames.Exit | null, opened: boolean) => void;
}

/** Handle is an open terminal. */
export interface Handle {
  /** write shows a line of the page's own in the terminal. */
  line: (text: string) => void;
  focus: () => void;
  signal: (name: frames.Signal) => void;
  /** rows are the lines the terminal shows, as text (tests and copying). */
  rows: () => string[];
  /** dispose closes the connection and removes the terminal. */
  dispose: () => void;
}

const encoder = new TextEncoder();

/** open shows a terminal in host and connects it to the session at o.path. */
export function open(host: HTMLElement, o: Options): Handle {
  routeStyleElements(document);
  const term = new Terminal({
    cursorBlink: !o.readOnly,
    disableStdin: !!o.readOnly,
    fontFamily: "'DejaVu Sans Mono', monospace",
    fontSize: 13,
    scrollback: 5000,
    theme: { background: '#0f1722', foreground: '#e6edf3', cursor: '#e6edf3' },
  });
  const fit = new FitAddon();
  term.loadAddon(fit);
  term.open(host);
  // fixed: a watch draws at the watched terminal's size, once the console
  // says it, and no longer fits its box.
  let fixed = false;
  fitNow();

  const url = new URL(o.path, location.href);
  url.protocol = location.protocol === 'https:' ? 'wss:' : 'ws:';
  if (!o.readOnly) {
    url.searchParams.set('cols', String(term.cols));
    url.searchParams.set('rows', String(term.rows));
  }
  const ws = new WebSocket(url.href);
  ws.binaryType = 'arraybuffer';
  let opened = false;
  let ended = false;
  const send = (f: frames.Message) => {
    if (!o.readOnly && ws.readyState === WebSocket.OPEN) ws.send(f);
  };
  const sendSize = () => send(frames.resize(term.cols, term.rows));
  const line = (text: string) => term.write(`\r\n\x1b[2m${text.replace(/\r?\n/g, '\r\n')}\x1b[0m\r\n`);
  const end = (e: frames.Exit | null) => {
    if (ended) return;
    ended = true;
    line(e ? o.words.exit(e) : o.words.closed);
    term.write('\x1b[?25l'); // no cursor where nothing more is typed
    o.onEnd(e, opened);
  };

  ws.addEventListener('open', () => {
    opened = true;
    sendSize();
  });
  ws.addEventListener('message', (ev: MessageEvent) => {
    if (!(ev.data instanceof ArrayBuffer)) return; // a session's frames are binary
    const f = frames.decode(ev.data);
    switch (f.type) {
      case frames.Frame.output:
      case frames.Frame.stderr:
        term.write(f.data);
        break;
      case frames.Frame.status:
        if (f.status.message) term.write(`\x1b[33m${f.status.message.replace(/\r?\n/g, '\r\n')}\x1b[0m\r\n`);
        // A session that waited for its approval runs at the size the
        // terminal has now.
        if (f.status.state === 'started') sendSize();
        if (o.readOnly) watchedSize(f.status);
        if (f.status.state !== 'resized') o.onStatus(f.status);
        break;
      case frames.Frame.exit:
        end(f.exit);
        ws.close();
        break;
    }
  });
  ws.addEventListener('close', () => end(null));

  // Each keystroke as input; a terminal that reports the mouse or pastes
  // binary sends bytes as they are.
  const subs = o.readOnly
    ? []
    : [
        term.onData((d) => frames.input(encoder.encode(d)).forEach(send)),
        term.onBinary((d) => frames.input(Uint8Array.from(d, (c) => c.charCodeAt(0) & 0xff)).forEach(send)),
      ];
  subs.push(term.onResize(sendSize));
  subs.push(term.onResize(({ cols, rows }) => o.onSize?.(cols, rows, fixed)));
  o.onSize?.(term.cols, term.rows, fixed);

  // A watch takes the watched terminal's size, whose output is drawn for
  // it: lines wrap where the operator's do.
  function watchedSize(s: frames.Status) {
    const ok = (n?: number): n is number => typeof n === 'number' && Number.isInteger(n) && n >= 1 && n <= frames.maxSize;
    if (!ok(s.cols) || !ok(s.rows)) return;
    fixed = true;
    term.resize(s.cols, s.rows);
    o.onSize?.(term.cols, term.rows, fixed);
  }

  // The terminal fills its box: fitted again when the window changes, and
  // the box told its new size (onResize above). A watch at the watched
  // terminal's size stays at it.
  function fitNow() {
    if (fixed) return;
    try {
      fit.fit();
    } catch {
      // not laid out (hidden): the next resize fits it
    }
  }
  addEventListener('resize', fitNow);
  if (!o.readOnly) term.focus();

  return {
    line,
    focus: () => term.focus(),
    signal: (name) => send(frames.signal(name)),
    rows: () => {
      const b = term.buffer.active;
      const out: string[] = [];
      for (let i = 0; i < b.length; i++) out.push(b.getLine(i)?.translateToString(true) ?? '');
      return out;
    },
    dispose: () => {
      removeEventListener('resize', fitNow);
      subs.forEach((s) => s.dispose());
      ended = true;
      if (ws.readyState === WebSocket.CONNECTING || ws.readyState === WebSocket.OPEN) ws.close();
      term.dispose();
      sweep();
    },
  };
}
