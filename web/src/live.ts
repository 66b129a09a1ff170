// Live updates: the console's event stream names the topics that change
// (boxes, state, apps, keys, audit; "all" after a reconnect); pages fetch
// again when theirs comes.

export type Topic = 'boxes' | 'state' | 'apps' | 'keys' | 'audit' | 'all';

const bus = new EventTarget();

/** onTopic calls fn whenever one of topics (or "all") changes; it returns the unsubscribe. */
export function onTopic(topics: Topic[], fn: () => void): () => void {
  const h = (e: Event) => {
    const got = (e as CustomEvent<Topic[]>).detail;
    if (got.includes('all') || got.some((t) => topics.includes(t))) fn();
  };
  bus.addEventListener('topics', h);
  return () => bus.removeEventListener('topics', h);
}

function emit(topics: Topic[]) {
  bus.dispatchEvent(new CustomEvent('topics', { detail: topics }));
}

/**
 * connect follows the console's event stream for tenant until the returned
 * function is called. The browser reconnects by itself after a drop; then
 * every page fetches everything, since changes may have come meanwhile.
 * onGone runs when the stream ends for good (the session is over).
 */
export function connect(tenant: string, onGone: () => void): () => void {
  const es = new EventSource('/api/v1/events' + (tenant ? '?tenant=' + encodeURIComponent(tenant) : ''));
  let opened = false;
  es.addEventListener('open', () => {
    if (opened) emit(['all']);
    opened = true;
  });
  es.addEventListener('change', (e) => {
    try {
      emit((JSON.parse((e as MessageEvent).data) as { topics: Topic[] }).topics);
    } catch {
      emit(['all']);
    }
  });
  es.addEventListener('ended', () => {
    es.close();
    onGone();
  });
  es.addEventListener('error', () => {
    if (es.readyState === EventSource.CLOSED) onGone();
  });
  return () => es.close();
}
