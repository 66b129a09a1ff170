import { useMemo, useState } from 'preact/hooks';
import * as api from '../api';
import { useApp } from '../app';
import { usePoll } from '../ui/poll';

/** Matrix is every app against every box that should run one: the phase and health of each. */
export function Matrix() {
  const { session, t, navigate } = useApp();
  const polled = usePoll(
    async () => {
      const apps = await api.apps(session);
      const statuses = await Promise.all(apps.map((a) => api.appStatus(session, a.name)));
      return { apps: apps.map((a) => a.name), statuses };
    },
    [session.tenant],
    ['apps', 'state', 'boxes'],
  );
  const [q, setQ] = useState('');
  const { apps, rows } = useMemo(() => {
    const apps = polled.data?.apps ?? [];
    const byBox = new Map<string, { name: string; online: boolean; cells: Record<string, api.AppBoxStatus> }>();
    (polled.data?.statuses ?? []).forEach((list, i) => {
      for (const b of list) {
        let row = byBox.get(b.box_id);
        if (!row) byBox.set(b.box_id, (row = { name: b.box_name, online: b.online, cells: {} }));
        row.cells[apps[i]] = b;
      }
    });
    return { apps, rows: [...byBox.entries()].sort(([, a], [, b]) => a.name.localeCompare(b.name)) };
  }, [polled.data]);
  const shown = rows.filter(([, r]) => !q || r.name.toLowerCase().includes(q.toLowerCase())).slice(0, 500);
  return (
    <section>
      <h1>{t('matrix.title')}</h1>
      {polled.error && <p class="error">{t('common.error', { msg: polled.error })}</p>}
      <div class="filters">
        <input type="search" placeholder={t('fleet.search')} value={q} onInput={(e) => setQ((e.target as HTMLInputElement).value)} />
        <span class="muted">{t('fleet.shown', { shown: shown.length, total: rows.length })}</span>
      </div>
      <table data-testid="matrix">
        <thead>
          <tr>
            <th>{t('fleet.col.name')}</th>
            {apps.map((a) => <th>{a}</th>)}
          </tr>
        </thead>
        <tbody>
          {shown.map(([id, r]) => (
            <tr data-box={r.name}>
              <td>
                <a href={`/boxes/${encodeURIComponent(id)}`} onClick={(e) => { e.preventDefault(); navigate(`/boxes/${encodeURIComponent(id)}`); }}>{r.name}</a>{' '}
                <span class={'state ' + (r.online ? 'on' : 'off')}>{r.online ? t('state.online') : t('state.offline')}</span>
              </td>
              {apps.map((a) => {
                const c = r.cells[a];
                return (
                  <td class={c ? 'phase ' + (c.phase ?? '').toLowerCase() : 'muted'} title={c?.message ?? ''}>
                    {c ? `${c.running_release || c.desired_release} ${c.phase ?? ''} ${c.health ?? ''}` : '—'}
                  </td>
                );
              })}
            </tr>
          ))}
        </tbody>
      </table>
    </section>
  );
}
