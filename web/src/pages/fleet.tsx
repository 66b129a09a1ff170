import { useMemo, useState } from 'preact/hooks';
import * as api from '../api';
import { useApp } from '../app';
import { formatTime } from '../i18n';
import { healthWord } from '../ui/health';
import { usePoll } from '../ui/poll';
import { VirtualList } from '../ui/virtual';

interface Counts {
  online: number;
  offline: number;
  waiting: number;
}

function count(boxes: api.Box[]): Counts {
  const c = { online: 0, offline: 0, waiting: 0 };
  for (const b of boxes) {
    if (b.state === 'pending') c.waiting++;
    else if (b.state === 'approved') b.online ? c.online++ : c.offline++;
  }
  return c;
}

/** matches says whether a box matches the search words and label filter. */
function matches(b: api.Box, words: string[], label: [string, string] | null) {
  if (label && (b.labels?.[label[0]] ?? null) !== label[1]) return false;
  if (!words.length) return true;
  const hay = `${b.name} ${b.id} ${b.hostname ?? ''} ${api.formatLabels(b.labels)}`.toLowerCase();
  return words.every((w) => hay.includes(w));
}

export function Fleet() {
  const { session, t, lang, navigate } = useApp();
  const polled = usePoll(() => api.boxes(session), [session.tenant], ['boxes']);
  const [q, setQ] = useState('');
  const [labelQ, setLabelQ] = useState('');
  const [region, setRegion] = useState('');
  const [site, setSite] = useState('');
  const all = polled.data ?? [];

  // regions → sites, with counts at each level.
  const tree = useMemo(() => api.tree(all), [all]);

  const words = q.toLowerCase().split(/\s+/).filter(Boolean);
  const lf = labelQ.includes('=') ? api.parseLabel(labelQ) : null;
  const shown = useMemo(
    () =>
      all
        .filter((b) => (!region || b.region === region) && (!site || b.site === site) && b.state !== 'revoked' && matches(b, words, lf))
        .sort((a, b) => a.name.localeCompare(b.name)),
    [all, region, site, q, labelQ],
  );
  const total = count(all);
  // An approved box's state is its health when the console tells it
  // ("line down, running"), with the grounds as the tooltip.
  const stateOf = (b: api.Box) =>
    b.state === 'pending'
      ? t('state.pending')
      : b.state === 'revoked'
        ? t('state.revoked')
        : b.health
          ? healthWord(t, b.health)
          : b.online
            ? t('state.online')
            : t('state.offline');
  const stateClass = (b: api.Box) => 'state ' + b.state + (b.state === 'approved' && b.health ? ' health ' + b.health : '');

  return (
    <section class="fleet">
      <h1>{t('fleet.title')}</h1>
      {polled.error && <p class="error">{t('common.error', { msg: polled.error })}</p>}
      <p class="counts" data-testid="fleet-counts">{t('fleet.counts', { ...total })}</p>
      <div class="fleet-body">
        <aside class="tree" data-testid="tree">
          <a class={!region ? 'active' : ''} href="/" onClick={(e) => { e.preventDefault(); setRegion(''); setSite(''); }}>
            {t('fleet.all')}
          </a>
          {tree.map(([r, sites]) => {
            const rc = count(sites.flatMap(([, l]) => l));
            return (
              <div class="region" key={r}>
                <a class={region === r && !site ? 'active' : ''} href="/" onClick={(e) => { e.preventDefault(); setRegion(r); setSite(''); }}>
                  {r} <small>{rc.online}/{rc.offline}/{rc.waiting}</small>
                </a>
                {sites.map(([s, list]) => {
                  const sc = count(list);
                  return (
                    <a class={'site ' + (region === r && site === s ? 'active' : '')} href="/" onClick={(e) => { e.preventDefault(); setRegion(r); setSite(s); }}>
                      {s} <small>{sc.online}/{sc.offline}/{sc.waiting}</small>
                    </a>
                  );
                })}
              </div>
            );
          })}
        </aside>
        <div class="list">
          <div class="filters">
            <input type="search" placeholder={t('fleet.search')} value={q} onInput={(e) => setQ((e.target as HTMLInputElement).value)} data-testid="search" />
            <input placeholder={t('fleet.labelFilter')} value={labelQ} onInput={(e) => setLabelQ((e.target as HTMLInputElement).value)} data-testid="label-filter" />
            <span class="muted" data-testid="shown">{t('fleet.shown', { shown: shown.length, total: all.length })}</span>
          </div>
          <div class="vhead">
            <span>{t('fleet.col.name')}</span>
            <span>{t('fleet.col.region')}</span>
            <span>{t('fleet.col.site')}</span>
            <span>{t('fleet.col.state')}</span>
            <span>{t('fleet.col.seen')}</span>
            <span>{t('fleet.col.labels')}</span>
          </div>
          <VirtualList
            items={shown}
            rowHeight={32}
            height={Math.max(300, window.innerHeight - 260)}
            testid="boxes"
            row={(b) => (
              <a class={'boxrow ' + (b.online ? 'on' : 'off')} href={`/boxes/${encodeURIComponent(b.id)}`} data-box={b.name} data-health={b.health ?? ''}
                onClick={(e) => { e.preventDefault(); navigate(`/boxes/${encodeURIComponent(b.id)}`); }}>
                <span>{b.name}</span>
                <span>{b.region}</span>
                <span>{b.site}</span>
                <span class={stateClass(b)} title={b.state === 'approved' ? b.health_detail : undefined}>{stateOf(b)}</span>
                <span>{b.online ? t('state.online') : formatTime(lang, b.last_seen)}</span>
                <span class="labels">{api.formatLabels(b.labels)}</span>
              </a>
            )}
          />
        </div>
      </div>
    </section>
  );
}
