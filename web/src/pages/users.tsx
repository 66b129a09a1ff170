import { useState } from 'preact/hooks';
import * as api from '../api';
import { useApp } from '../app';
import { formatTime } from '../i18n';
import { usePoll } from '../ui/poll';

const roles = ['viewer', 'auditor', 'operator', 'maintainer', 'admin'] as const;

export function Users() {
  const { session, t, lang, me } = useApp();
  const polled = usePoll(() => api.users(session), [session.tenant], ['audit']);
  const [name, setName] = useState('');
  const [password, setPassword] = useState('');
  const [role, setRole] = useState<string>('viewer');
  const [error, setError] = useState('');
  const [open, setOpen] = useState('');
  const run = (p: Promise<unknown>) =>
    p.then(() => { setError(''); polled.reload(); }).catch((e: Error) => setError(e.message));
  const roleName = (r: string) => t(('role.' + r) as 'role.viewer');
  return (
    <section>
      <h1>{t('users.title')}</h1>
      {(error || polled.error) && <p class="error" role="alert">{t('common.error', { msg: error || polled.error })}</p>}
      <table data-testid="users">
        <thead>
          <tr>
            <th>{t('users.name')}</th>
            <th>{t('users.role')}</th>
            <th>{t('users.roles')}</th>
            <th>{t('box.enrolled')}</th>
            <th />
          </tr>
        </thead>
        <tbody>
          {(polled.data ?? []).map((u) => (
            <tr key={u.name} data-user={u.name}>
              <td>
                <a href="#" onClick={(e) => { e.preventDefault(); setOpen(open === u.name ? '' : u.name); }}>{u.name}</a>
                {open === u.name && <UserTokens user={u.name} />}
              </td>
              <td>
                <select value={u.roles[me.tenant] ?? ''} disabled={u.name === me.user}
                  onChange={(e) => run(api.setRole(session, u.name, (e.target as HTMLSelectElement).value))}>
                  {!u.roles[me.tenant] && <option value="">—</option>}
                  {roles.map((r) => <option value={r}>{roleName(r)}</option>)}
                </select>
              </td>
              <td>{Object.entries(u.roles).map(([tn, r]) => `${tn}=${r}`).join(', ')}</td>
              <td>{formatTime(lang, u.created_at)}</td>
              <td>
                {u.name !== me.user && <button class="danger" onClick={() => run(api.deleteUser(session, u.name))}>{t('users.remove')}</button>}
              </td>
            </tr>
          ))}
        </tbody>
      </table>
      <form class="inline" data-testid="user-form"
        onSubmit={(e) => { e.preventDefault(); run(api.createUser(session, name, password, role).then(() => { setName(''); setPassword(''); })); }}>
        <input placeholder={t('users.name')} value={name} onInput={(e) => setName((e.target as HTMLInputElement).value)} required />
        <input type="password" placeholder={t('users.password')} autocomplete="new-password" value={password}
          onInput={(e) => setPassword((e.target as HTMLInputElement).value)} required />
        <select value={role} onChange={(e) => setRole((e.target as HTMLSelectElement).value)}>
          {roles.map((r) => <option value={r}>{roleName(r)}</option>)}
        </select>
        <button type="submit">{t('users.create')}</button>
      </form>
    </section>
  );
}

function UserTokens({ user }: { user: string }) {
  const { session, t, lang } = useApp();
  const polled = usePoll(() => api.userTokens(session, user), [user, session.tenant], ['audit']);
  const [error, setError] = useState('');
  return (
    <div class="history" data-testid="user-tokens">
      <h3>{t('tokens.of', { user })}</h3>
      {error && <p class="error">{error}</p>}
      <ul>
        {(polled.data ?? []).map((k) => (
          <li>
            {k.name} · {formatTime(lang, k.created_at)} · {k.expires_at ? formatTime(lang, k.expires_at) : t('tokens.never')}{' '}
            <button class="danger" onClick={() => api.revokeUserToken(session, user, k.id).then(polled.reload).catch((e: Error) => setError(e.message))}>
              {t('tokens.revoke')}
            </button>
          </li>
        ))}
      </ul>
    </div>
  );
}
