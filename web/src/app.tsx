import { createContext } from 'preact';
import { useContext, useEffect, useMemo, useState } from 'preact/hooks';
import * as api from './api';
import * as live from './live';
import { initialLang, languages, saveLang, translator, type Lang, type T } from './i18n';
import { Login } from './pages/login';
import { Fleet } from './pages/fleet';
import { BoxPage } from './pages/box';
import { Waiting } from './pages/waiting';
import { Enroll } from './pages/enroll';
import { Users } from './pages/users';
import { Keys } from './pages/keys';
import { Apps, AppPage } from './pages/apps';
import { Rollouts, RolloutPage } from './pages/rollouts';
import { Matrix } from './pages/matrix';
import { APITokens } from './pages/tokens';
import { Audit } from './pages/audit';
import { Sessions, SessionPage } from './pages/sessions';
import { Alerts } from './pages/alerts';

/** Ctx is what every page reads: who is logged in, where, and in which language. */
export interface Ctx {
  me: api.Me;
  session: api.Session;
  t: T;
  lang: Lang;
  navigate: (path: string) => void;
}

const AppContext = createContext<Ctx | null>(null);

export function useApp(): Ctx {
  const c = useContext(AppContext);
  if (!c) throw new Error('useApp outside the app');
  return c;
}

/** path is where the browser is, with its query. */
const here = () => location.pathname + location.search;

export function App() {
  const [lang, setLang] = useState<Lang>(initialLang());
  const [path, setPath] = useState(here());
  const [me, setMe] = useState<api.Me | null>(null);
  const [checked, setChecked] = useState(false);
  const [tenant, setTenant] = useState(sessionStorage.getItem('edgebox.tenant') || '');
  const t = useMemo(() => translator(lang), [lang]);

  const navigate = (p: string) => {
    if (p !== here()) history.pushState(null, '', p);
    setPath(p);
  };
  useEffect(() => {
    const onPop = () => setPath(here());
    addEventListener('popstate', onPop);
    return () => removeEventListener('popstate', onPop);
  }, []);
  useEffect(() => saveLang(lang), [lang]);

  // The session ended (expired, logged out elsewhere): back to the login
  // page, keeping the place to come back to.
  const expired = () => {
    setMe(null);
    if (location.pathname !== '/login') {
      navigate('/login?expired=1&next=' + encodeURIComponent(here()));
    }
  };
  const session: api.Session = { csrf: me?.csrf || '', tenant, onExpired: expired };

  useEffect(() => {
    api
      .me({ csrf: '', tenant, onExpired: () => {} })
      .then((m) => setMe(m))
      .catch(() => setMe(null))
      .finally(() => setChecked(true));
  }, [tenant]);

  // Live updates for the tenant in use, while logged in. When the stream
  // ends for good, asking who we are says whether the session is over.
  useEffect(() => {
    if (!me) return;
    return live.connect(tenant, () => {
      api.me({ csrf: '', tenant, onExpired: expired }).catch(() => {});
    });
  }, [me?.user, tenant]);

  useEffect(() => {
    if (checked && !me && location.pathname !== '/login') {
      navigate('/login?next=' + encodeURIComponent(here()));
    }
  }, [checked, me, path]);

  const langPicker = (
    <label class="lang">
      <span class="sr">{t('nav.language')}</span>
      <select value={lang} onChange={(e) => setLang((e.target as HTMLSelectElement).value as Lang)} data-testid="lang">
        {Object.entries(languages).map(([k, v]) => (
          <option value={k}>{v}</option>
        ))}
      </select>
    </label>
  );

  if (!checked) return <p class="loading">{t('common.loading')}</p>;
  const url = new URL(path, location.origin);
  if (!me || url.pathname === '/login') {
    return (
      <Login
        t={t}
        langPicker={langPicker}
        expired={url.searchParams.get('expired') === '1'}
        onLogin={(m) => {
          // The login's answer says who; asking again says in which tenant, as what.
          const next = url.searchParams.get('next');
          const go = (who: api.Me) => {
            setMe(who);
            navigate(next && next.startsWith('/') && !next.startsWith('//') ? next : '/');
          };
          api.me({ csrf: m.csrf || '', tenant, onExpired: () => {} }).then((full) => go({ ...full, csrf: m.csrf }), () => go(m));
        }}
      />
    );
  }
  const ctx: Ctx = { me, session, t, lang, navigate };
  const switchTenant = (v: string) => {
    sessionStorage.setItem('edgebox.tenant', v);
    setTenant(v);
  };
  return (
    <AppContext.Provider value={ctx}>
      <header class="top">
        <a
          class="brand"
          href="/"
          onClick={(e) => {
            e.preventDefault();
            navigate('/');
          }}
        >
          {t('app.title')}
        </a>
        <nav>
          <NavLink to="/" label={t('nav.fleet')} />
          <NavLink to="/apps" label={t('nav.apps')} />
          <NavLink to="/rollouts" label={t('nav.rollouts')} />
          <NavLink to="/matrix" label={t('nav.matrix')} />
          <NavLink to="/keys" label={t('nav.keys')} />
          <NavLink to="/sessions" label={t('nav.sessions')} />
          <NavLink to="/alerts" label={t('nav.alerts')} />
          {api.can(me.role, 'operate') && <NavLink to="/waiting" label={t('nav.waiting')} />}
          {api.can(me.role, 'administer') && <NavLink to="/enroll" label={t('nav.enroll')} />}
          {api.can(me.role, 'audit') && <NavLink to="/audit" label={t('nav.audit')} />}
          {api.can(me.role, 'administer') && <NavLink to="/users" label={t('nav.users')} />}
        </nav>
        <div class="who">
          {Object.keys(me.roles).length > 1 && (
            <label>
              <span class="sr">{t('nav.tenant')}</span>
              <select value={me.tenant} onChange={(e) => switchTenant((e.target as HTMLSelectElement).value)} data-testid="tenant">
                {Object.keys(me.roles)
                  .sort()
                  .map((id) => (
                    <option value={id}>{id}</option>
                  ))}
              </select>
            </label>
          )}
          <a href="/tokens" onClick={(e) => { e.preventDefault(); navigate('/tokens'); }}>{t('nav.tokens')}</a>
          <span class="user" data-testid="whoami">
            {me.user} · {t(('role.' + me.role) as 'role.viewer')}
          </span>
          {langPicker}
          <button
            data-testid="logout"
            onClick={() => api.logout(session).finally(() => { setMe(null); navigate('/login'); })}
          >
            {t('nav.logout')}
          </button>
          <button
            class="quiet"
            onClick={() => api.logoutEverywhere(session).finally(() => { setMe(null); navigate('/login'); })}
          >
            {t('nav.logoutEverywhere')}
          </button>
        </div>
      </header>
      <main>
        <Route pathname={url.pathname} />
      </main>
    </AppContext.Provider>
  );
}

function NavLink({ to, label }: { to: string; label: string }) {
  const { navigate } = useApp();
  const active = to === '/' ? location.pathname === '/' || location.pathname.startsWith('/boxes/') : location.pathname.startsWith(to);
  return (
    <a
      href={to}
      class={active ? 'active' : ''}
      onClick={(e) => {
        e.preventDefault();
        navigate(to);
      }}
    >
      {label}
    </a>
  );
}

function Route({ pathname }: { pathname: string }) {
  const { t } = useApp();
  if (pathname === '/') return <Fleet />;
  const m = pathname.match(/^\/boxes\/([^/]+)$/);
  if (m) return <BoxPage id={decodeURIComponent(m[1])} />;
  if (pathname === '/waiting') return <Waiting />;
  if (pathname === '/enroll') return <Enroll />;
  if (pathname === '/users') return <Users />;
  if (pathname === '/keys') return <Keys />;
  if (pathname === '/apps') return <Apps />;
  if (pathname === '/matrix') return <Matrix />;
  if (pathname === '/tokens') return <APITokens />;
  const am = pathname.match(/^\/apps\/([^/]+)$/);
  if (am) return <AppPage name={decodeURIComponent(am[1])} />;
  if (pathname === '/rollouts') return <Rollouts />;
  const rm = pathname.match(/^\/rollouts\/([^/]+)$/);
  if (rm) return <RolloutPage id={decodeURIComponent(rm[1])} />;
  if (pathname === '/audit') return <Audit />;
  if (pathname === '/sessions') return <Sessions />;
  if (pathname === '/alerts') return <Alerts />;
  const sm = pathname.match(/^\/sessions\/([^/]+)$/);
  if (sm) return <SessionPage id={decodeURIComponent(sm[1])} />;
  return <h1>{t('notfound.title')}</h1>;
}
