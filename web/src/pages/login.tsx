import type { ComponentChildren } from 'preact';
import { useState } from 'preact/hooks';
import * as api from '../api';
import type { T } from '../i18n';

export function Login(props: { t: T; langPicker: ComponentChildren; expired: boolean; onLogin: (m: api.Me) => void }) {
  const { t } = props;
  const [user, setUser] = useState('');
  const [password, setPassword] = useState('');
  const [error, setError] = useState('');
  const [busy, setBusy] = useState(false);
  const submit = (e: Event) => {
    e.preventDefault();
    setBusy(true);
    setError('');
    api
      .login(user.trim(), password)
      .then(props.onLogin)
      .catch((err: Error) => setError(err.message))
      .finally(() => setBusy(false));
  };
  return (
    <div class="login">
      <form onSubmit={submit} data-testid="login-form">
        <h1>{t('login.title')}</h1>
        {props.expired && <p class="notice" data-testid="expired">{t('login.expired')}</p>}
        <label>
          {t('login.user')}
          <input name="user" autocomplete="username" value={user} onInput={(e) => setUser((e.target as HTMLInputElement).value)} required />
        </label>
        <label>
          {t('login.password')}
          <input
            name="password"
            type="password"
            autocomplete="current-password"
            value={password}
            onInput={(e) => setPassword((e.target as HTMLInputElement).value)}
            required
          />
        </label>
        {error && <p class="error" role="alert">{error}</p>}
        <button type="submit" disabled={busy}>
          {t('login.submit')}
        </button>
        <div class="login-lang">{props.langPicker}</div>
      </form>
    </div>
  );
}
