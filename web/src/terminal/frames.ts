// A remote session's frames, as the console's WebSocket carries them: one
// binary message is one frame, a type byte and then its payload.

/** Frame types; the browser sends input, resize, signal and eof. */
export const Frame = {
  input: 0,
  output: 1,
  stderr: 2,
  resize: 3,
  signal: 4,
  eof: 5,
  status: 6,
  exit: 7,
} as const;

/** maxPayload bounds one frame's payload; longer input is split. */
export const maxPayload = 32 << 10;

/** maxSize bounds a terminal's columns and rows. */
export const maxSize = 1000;

/**
 * Status says how a session stands before it runs, or that one watches
 * it: a watcher is told the watched terminal's size ("watching"), and
 * again whenever it changes ("resized").
 */
export interface Status {
  session: string;
  state: 'waiting_approval' | 'started' | 'watching' | 'resized' | string;
  message?: string;
  /** cols and rows: the watched terminal's size; absent for a session without a terminal. */
  cols?: number;
  rows?: number;
}

/** Exit is how a session ended: the last frame. */
export interface Exit {
  code: number;
  signal?: string;
  error?: string;
}

export type Signal = 'INT' | 'TERM' | 'KILL' | 'HUP' | 'QUIT';

const encoder = new TextEncoder();

/** Message is one frame, as the WebSocket sends it. */
export type Message = Uint8Array<ArrayBuffer>;

function frame(type: number, payload: Uint8Array = new Uint8Array()): Message {
  const out = new Uint8Array(payload.length + 1);
  out[0] = type;
  out.set(payload, 1);
  return out;
}

/** input returns the frames carrying bytes for the process's input. */
export function input(data: Uint8Array): Message[] {
  const out: Message[] = [];
  for (let i = 0; i < data.length; i += maxPayload) out.push(frame(Frame.input, data.subarray(i, i + maxPayload)));
  return out;
}

/** resize returns the frame saying the terminal's size, clamped to what the console takes. */
export function resize(cols: number, rows: number): Message {
  const clamp = (n: number) => Math.min(maxSize, Math.max(1, Math.floor(n)));
  return frame(Frame.resize, encoder.encode(JSON.stringify({ cols: clamp(cols), rows: clamp(rows) })));
}

export const signal = (name: Signal) => frame(Frame.signal, encoder.encode(name));
export const eof = () => frame(Frame.eof);

/** Decoded is a frame from the console. */
export type Decoded =
  | { type: typeof Frame.output | typeof Frame.stderr; data: Uint8Array }
  | { type: typeof Frame.status; status: Status }
  | { type: typeof Frame.exit; exit: Exit }
  | { type: 'unknown' };

/** decode reads a frame from the console; one it cannot read is "unknown". */
export function decode(msg: ArrayBuffer): Decoded {
  const b = new Uint8Array(msg);
  if (b.length === 0) return { type: 'unknown' };
  const payload = b.subarray(1);
  const json = <T,>(): T | null => {
    try {
      return JSON.parse(new TextDecoder().decode(payload)) as T;
    } catch {
      return null;
    }
  };
  switch (b[0]) {
    case Frame.output:
    case Frame.stderr:
      return { type: b[0], data: payload };
    case Frame.status: {
      const s = json<Status>();
      return s ? { type: Frame.status, status: s } : { type: 'unknown' };
    }
    case Frame.exit:
      // An exit the page cannot read still ends the session.
      return { type: Frame.exit, exit: json<Exit>() ?? { code: -1, error: 'the console ended the session' } };
  }
  return { type: 'unknown' };
}
