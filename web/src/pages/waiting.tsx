import { useState } from 'preact/hooks';
import * as api from '../api';
import { useApp } from '../app';
import { formatTime } from '../i18n';
import { usePoll } from '../ui/poll';

export function Waiting() {
  const { session, t, lang, me } = useApp();
  const polled = usePoll(() => api.boxes(session).then((all) => all.filter((b) => b.state === 'pending')), [session.tenant], ['boxes']);
  const [done, setDone] = useState('');
  const [error, setError] = useState('');
  const act = (b: api.Box, approve: boolean) => {
    setError('');
    (approve ? api.approve(session, b.id) : api.revoke(session, b.id))
      .then(() => {
        setDone(t(approve ? 'waiting.approved' : 'waiting.rejected', { name: b.name }));
        polled.reload();
      })
      .catch((e: Error) => setError(e.message));
  };
  const list = polled.data ?? [];
  return (
    <section>
      <h1>{t('waiting.title')}</h1>
      {done && <p class="notice" data-testid="done">{done}</p>}
      {(error || polled.error) && <p class="error">{t('common.error', { msg: error || polled.error })}</p>}
      {polled.data && list.length === 0 && <p>{t('waiting.empty')}</p>}
      <table data-testid="waiting">
        <tbody>
          {list.map((b) => (
            <tr key={b.id} data-box={b.name}>
              <td>{b.name}</td>
              <td>{b.hostname ?? ''}</td>
              <td>{b.region} / {b.site}</td>
              <td>{formatTime(lang, b.enrolled_at)}</td>
              <td>
                {api.can(me.role, 'operate') && <button onClick={() => act(b, true)}>{t('waiting.approve')}</button>}
                {api.can(me.role, 'administer') && <button class="danger" onClick={() => act(b, false)}>{t('waiting.reject')}</button>}
              </td>
            </tr>
          ))}
        </tbody>
      </table>
    </section>
  );
}
