import { useEffect, useState } from 'preact/hooks';
import { onTopic, type Topic } from '../live';

/** Polled is a value fetched again every period, with the last error. */
export interface Polled<T> {
  data: T | undefined;
  error: string;
  at: Date | undefined;
  reload: () => void;
}

/**
 * usePoll fetches now, again whenever one of topics changes on the console
 * (live.ts), and every period as a net under the event stream (never
 * faster than 5 s), while the page is shown; a failed fetch keeps the last
 * data and shows the error until one succeeds.
 */
export function usePoll<T>(fetch: () => Promise<T>, deps: unknown[], topics: Topic[] = [], period = 30000): Polled<T> {
  const [data, setData] = useState<T | undefined>(undefined);
  const [error, setError] = useState('');
  const [at, setAt] = useState<Date | undefined>(undefined);
  const [tick, setTick] = useState(0);
  useEffect(() => {
    let live = true;
    let timer = 0;
    const run = () => {
      fetch()
        .then((d) => {
          if (!live) return;
          setData(d);
          setError('');
          setAt(new Date());
        })
        .catch((e: Error) => live && setError(e.message))
        .finally(() => {
          if (live) timer = window.setTimeout(run, Math.max(period, 5000));
        });
    };
    run();
    const off = onTopic(topics, () => {
      clearTimeout(timer);
      run();
    });
    return () => {
      live = false;
      off();
      clearTimeout(timer);
    };
  }, [...deps, tick]);
  return { data, error, at, reload: () => setTick((n) => n + 1) };
}
