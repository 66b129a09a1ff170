import { useState } from 'preact/hooks';
import * as api from '../api';
import { useApp } from '../app';
import { formatTime } from '../i18n';
import { usePoll } from '../ui/poll';

export function Keys() {
  const { session, t, me } = useApp();
  const [labelQ, setLabelQ] = useState('');
  const [stateQ, setStateQ] = useState('');
  const [boxQ, setBoxQ] = useState('');
  const labels = labelQ.split(',').map((s) => s.trim()).filter((s) => s.includes('='));
  const polled = usePoll(() => api.allKeys(session, labels), [session.tenant, labels.join(',')], ['keys']);
  const [open, setOpen] = useState('');
  const [error, setError] = useState('');
  const operate = api.can(me.role, 'operate');
  const run = (p: Promise<unknown>) => p.then(() => { setError(''); polled.reload(); }).catch((e: Error) => setError(e.message));
  const list = (polled.data ?? []).filter((k) => (!stateQ || k.state === stateQ) && (!boxQ || k.box_id.includes(boxQ)));
  return (
    <section>
      <h1>{t('keys.title')}</h1>
      <div class="filters">
        <input placeholder={t('fleet.labelFilter')} value={labelQ} onInput={(e) => setLabelQ((e.target as HTMLInputElement).value)} data-testid="key-label-filter" />
        <select value={stateQ} onChange={(e) => setStateQ((e.target as HTMLSelectElement).value)}>
          <option value="">{t('keys.anyState')}</option>
          <option value="present">present</option>
          <option value="absent">absent</option>
          <option value="stuck">stuck</option>
        </select>
        <input placeholder={t('keys.box')} value={boxQ} onInput={(e) => setBoxQ((e.target as HTMLInputElement).value)} />
      </div>
      {(error || polled.error) && <p class="error" role="alert">{t('common.error', { msg: error || polled.error })}</p>}
      <table data-testid="keys">
        <thead>
          <tr>
            <th>{t('box.col.key')}</th>
            <th>{t('keys.box')}</th>
            <th>{t('box.col.port')}</th>
            <th>{t('fleet.col.state')}</th>
            <th>{t('box.col.holder')}</th>
            <th>{t('fleet.col.labels')}</th>
            <th />
          </tr>
        </thead>
        <tbody>
          {list.map((k) => (
            <KeyRow key={k.id} k={k} operate={operate} run={run} open={open === k.id} toggle={() => setOpen(open === k.id ? '' : k.id)} />
          ))}
        </tbody>
      </table>
    </section>
  );
}

function KeyRow(props: { k: api.Key; operate: boolean; run: (p: Promise<unknown>) => void; open: boolean; toggle: () => void }) {
  const { session, t } = useApp();
  const { k, operate, run } = props;
  const [label, setLabel] = useState('');
  const [workload, setWorkload] = useState('');
  const [onBox, setOnBox] = useState('');
  const labelText = api.formatLabels(k.labels);
  return (
    <>
      <tr data-key={k.id}>
        <td>
          <a href="#" onClick={(e) => { e.preventDefault(); props.toggle(); }}>{k.id}</a>
          <div class="muted">{k.product ?? ''} {k.serial ?? ''}</div>
        </td>
        <td>{k.box_id}</td>
        <td>{k.port}</td>
        <td>{k.state}</td>
        <td>
          {k.holder ?? ''}
          {k.holder_box && <div class="muted" data-testid="key-used-from">{t('keys.usedFrom')} {k.holder_box}</div>}
        </td>
        <td>{labelText}</td>
        <td>
          {operate && (
            <div class="actions">
              <form class="inline" onSubmit={(e) => {
                e.preventDefault();
                const l = api.parseLabel(label);
                if (l) run(api.labelKey(session, k.id, { [l[0]]: l[1] }));
                setLabel('');
              }}>
                <input placeholder="key=value" value={label} onInput={(e) => setLabel((e.target as HTMLInputElement).value)} data-testid="key-label" />
                <button type="submit">{t('keys.label')}</button>
              </form>
              {k.holder ? (
                <button class="danger" onClick={() => run(api.releaseKey(session, k.id))}>{t('keys.release')}</button>
              ) : (
                <form class="inline" onSubmit={(e) => { e.preventDefault(); run(api.leaseKey(session, k.id, workload, onBox.trim())); }}>
                  <input placeholder={t('keys.workload')} value={workload} onInput={(e) => setWorkload((e.target as HTMLInputElement).value)} data-testid="key-workload" />
                  <input placeholder={t('keys.onBox')} title={t('keys.onBoxHelp')} value={onBox} onInput={(e) => setOnBox((e.target as HTMLInputElement).value)} data-testid="key-box" />
                  <button type="submit">{t('keys.lease')}</button>
                </form>
              )}
            </div>
          )}
        </td>
      </tr>
      {props.open && (
        <tr>
          <td colSpan={7}>
            <History id={k.id} />
          </td>
        </tr>
      )}
    </>
  );
}

function History({ id }: { id: string }) {
  const { session, t, lang } = useApp();
  const polled = usePoll(() => api.keyHistory(session, id), [id, session.tenant], ['keys']);
  return (
    <div class="history" data-testid="key-history">
      <h3>{t('keys.history')}</h3>
      <ol class="timeline">
        {(polled.data ?? []).map((e) => (
          <li>
            <time>{formatTime(lang, e.time)}</time> <strong>{e.event}</strong> {e.workload ?? ''} {e.actor ? `· ${e.actor}` : ''} {e.detail ?? ''}
          </li>
        ))}
      </ol>
    </div>
  );
}
