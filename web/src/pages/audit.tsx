import { useState } from 'preact/hooks';
import * as api from '../api';
import { useApp } from '../app';
import { formatTime } from '../i18n';
import { usePoll } from '../ui/poll';

/** toRFC3339 turns a datetime-local value (the browser's zone) into RFC 3339. */
const toRFC3339 = (v: string) => (v ? new Date(v).toISOString() : '');

export function Audit() {
  const { session, t, lang } = useApp();
  const [form, setForm] = useState({ actor: '', action: '', target: '', since: '', until: '' });
  const [filter, setFilter] = useState<api.AuditFilter>({});
  const polled = usePoll(() => api.audit(session, filter), [session.tenant, JSON.stringify(filter)], ['audit']);
  const [error, setError] = useState('');
  const input = (k: keyof typeof form, label: string, type = 'text') => (
    <label>
      {label}
      <input type={type} name={k} value={form[k]} onInput={(e) => setForm({ ...form, [k]: (e.target as HTMLInputElement).value })} />
    </label>
  );
  const apply = (e: Event) => {
    e.preventDefault();
    setFilter({ actor: form.actor, action: form.action, target: form.target, since: toRFC3339(form.since), until: toRFC3339(form.until) });
  };
  const exportCSV = () =>
    api
      .auditCSV(session, filter)
      .then((blob) => {
        const a = document.createElement('a');
        a.href = URL.createObjectURL(blob);
        a.download = 'edgebox-audit.csv';
        a.click();
        setTimeout(() => URL.revokeObjectURL(a.href), 10000);
      })
      .catch((err: Error) => setError(err.message));
  const entries = [...(polled.data ?? [])].reverse();
  return (
    <section>
      <h1>{t('audit.title')}</h1>
      <form class="filters wrap" onSubmit={apply} data-testid="audit-filter">
        {input('actor', t('audit.who'))}
        {input('action', t('audit.what'))}
        {input('target', t('audit.target'))}
        {input('since', t('audit.since'), 'datetime-local')}
        {input('until', t('audit.until'), 'datetime-local')}
        <button type="submit">{t('audit.apply')}</button>
        <button type="button" class="quiet" onClick={exportCSV} data-testid="export">{t('audit.export')}</button>
      </form>
      {(error || polled.error) && <p class="error">{t('common.error', { msg: error || polled.error })}</p>}
      <table data-testid="audit">
        <thead>
          <tr>
            <th>{t('audit.time')}</th>
            <th>{t('audit.who')}</th>
            <th>{t('audit.what')}</th>
            <th>{t('audit.target')}</th>
            <th>{t('audit.result')}</th>
            <th>{t('audit.detail')}</th>
            <th>{t('audit.from')}</th>
          </tr>
        </thead>
        <tbody>
          {entries.map((e) => (
            <tr data-action={e.action}>
              <td>{formatTime(lang, e.time)}</td>
              <td>{e.actor}</td>
              <td>{e.action}</td>
              <td>{e.target ?? ''}</td>
              <td class={e.result === 'ok' ? '' : 'error'}>{e.result}</td>
              <td>{e.detail ?? ''}</td>
              <td>{e.remote ?? ''}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </section>
  );
}
