// Playback of a session's recording (asciicast v2) with asciinema-player,
// its stylesheet bundled with it. Loaded only when a page plays one.

import * as AsciinemaPlayer from 'asciinema-player';
import 'asciinema-player/dist/bundle/asciinema-player.css';

export interface Playback {
  dispose: () => void;
}

/**
 * play shows the recording at url (on the console's origin, sent with the
 * session's cookie) in host and starts it; pauses longer than two seconds
 * are shortened to two. onError hears what the player could not do.
 */
export function play(host: HTMLElement, url: string, onError: (msg: string) => void): Playback {
  const quiet = () => {};
  const p = AsciinemaPlayer.create({ url, fetchOpts: { credentials: 'same-origin' } }, host, {
    autoPlay: true,
    idleTimeLimit: 2,
    fit: 'width',
    terminalFontFamily: "'DejaVu Sans Mono', monospace",
    logger: {
      log: quiet,
      debug: quiet,
      info: quiet,
      warn: quiet,
      error: (...args: unknown[]) => onError(args.map((a) => (a instanceof Error ? a.message : String(a))).join(' ')),
    },
  });
  return { dispose: () => p.dispose() };
}
