import { useState } from 'preact/hooks';
import * as api from '../api';
import { useApp } from '../app';
import { formatTime } from '../i18n';
import { usePoll } from '../ui/poll';

/** APITokens are the user's own tokens, for scripts: made, listed, revoked. */
export function APITokens() {
  const { session, t, lang } = useApp();
  const polled = usePoll(() => api.apiTokens(session), [session.tenant], ['audit']);
  const [name, setName] = useState('');
  const [ttl, setTTL] = useState('720h');
  const [made, setMade] = useState('');
  const [error, setError] = useState('');
  const run = (p: Promise<unknown>) => p.then(() => { setError(''); polled.reload(); }).catch((e: Error) => setError(e.message));
  return (
    <section>
      <h1>{t('tokens.title')}</h1>
      {(error || polled.error) && <p class="error" role="alert">{t('common.error', { msg: error || polled.error })}</p>}
      <table data-testid="apitokens">
        <thead>
          <tr>
            <th>{t('users.name')}</th>
            <th>{t('apps.created')}</th>
            <th>{t('tokens.expires')}</th>
            <th />
          </tr>
        </thead>
        <tbody>
          {(polled.data ?? []).map((k) => (
            <tr>
              <td>{k.name}</td>
              <td>{formatTime(lang, k.created_at)}</td>
              <td>{k.expires_at ? formatTime(lang, k.expires_at) : t('tokens.never')}</td>
              <td><button class="danger" onClick={() => run(api.revokeAPIToken(session, k.id))}>{t('tokens.revoke')}</button></td>
            </tr>
          ))}
        </tbody>
      </table>
      <form class="inline" onSubmit={(e) => { e.preventDefault(); run(api.createAPIToken(session, name, ttl).then((k) => { setMade(k.token ?? ''); setName(''); })); }}>
        <input placeholder={t('users.name')} value={name} onInput={(e) => setName((e.target as HTMLInputElement).value)} required />
        <input placeholder="720h" value={ttl} onInput={(e) => setTTL((e.target as HTMLInputElement).value)} />
        <button type="submit">{t('tokens.create')}</button>
      </form>
      {made && (
        <div class="made">
          <p class="notice">{t('tokens.once')}</p>
          <pre data-testid="new-token">{made}</pre>
        </div>
      )}
    </section>
  );
}

/** EnrollTokens lists a tenant's enrollment tokens, with a revoke for each live one. */
export function EnrollTokens() {
  const { session, t, lang } = useApp();
  const polled = usePoll(() => api.enrollTokens(session), [session.tenant], ['audit', 'boxes']);
  const [error, setError] = useState('');
  return (
    <div>
      <h2>{t('enroll.tokens')}</h2>
      {error && <p class="error">{error}</p>}
      <table data-testid="enroll-tokens">
        <tbody>
          {(polled.data ?? []).map((k) => (
            <tr>
              <td>{k.id}</td>
              <td>{k.region} / {k.site}</td>
              <td>{k.used} / {k.uses}</td>
              <td>{formatTime(lang, k.expires_at)}</td>
              <td>{k.created_by}</td>
              <td>
                {k.revoked ? t('state.revoked') : (
                  <button class="danger" onClick={() => api.revokeEnrollToken(session, k.id).then(polled.reload).catch((e: Error) => setError(e.message))}>
                    {t('tokens.revoke')}
                  </button>
                )}
              </td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}
