import { useEffect, useState } from 'preact/hooks';
import { onTopic, type Topic } from '../live';

/** Polled is a value fetched again every period, with the last error. */
export interface Polled<T> {
  data: T | undefined;
  error: string;
  reload: () => void;
}

/**
 * usePoll fetches now, again whenever one of topics changes on the console
 * (live.ts), and every period as a net under the event stream (never
 * faster than 2 s), while the page is shown; a failed fetch keeps the last
 * data and shows the error until one succeeds. One fetch runs at a time: a
 * change during a fetch asks for one more after it, never a second loop.
 */
export function usePoll<T>(fetch: () => Promise<T>, deps: unknown[], topics: Topic[] = [], period = 30000): Polled<T> {
  const [data, setData] = useState<T | undefined>(undefined);
  const [error, setError] = useState('');
  const [tick, setTick] = useState(0);
  useEffect(() => {
    let live = true;
    let timer = 0;
    let running = false;
    let again = false;
    const run = () => {
      clearTimeout(timer);
      if (running) {
        again = true;
        return;
      }
      running = true;
      fetch()
        .then((d) => {
          if (!live) return;
          setData(d);
          setError('');
        })
        .catch((e: Error) => live && setError(e.message))
        .finally(() => {
          running = false;
          if (!live) return;
          if (again) {
            again = false;
            run();
          } else {
            timer = window.setTimeout(run, Math.max(period, 2000));
          }
        });
    };
    run();
    const off = onTopic(topics, run);
    return () => {
      live = false;
      off();
      clearTimeout(timer);
    };
  }, [...deps, tick]);
  return { data, error, reload: () => setTick((n) => n + 1) };
}
