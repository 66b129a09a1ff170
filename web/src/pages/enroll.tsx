import { useState } from 'preact/hooks';
import * as api from '../api';
import { useApp } from '../app';
import { formatTime } from '../i18n';
import { EnrollTokens } from './tokens';

export function Enroll() {
  const { session, t, lang } = useApp();
  const [region, setRegion] = useState('');
  const [site, setSite] = useState('');
  const [labels, setLabels] = useState('');
  const [ttl, setTTL] = useState('24h');
  const [uses, setUses] = useState(1);
  const [approval, setApproval] = useState(false);
  const [made, setMade] = useState<api.CreatedToken | null>(null);
  const [error, setError] = useState('');
  const submit = (e: Event) => {
    e.preventDefault();
    setError('');
    api
      .createToken(session, { region, site, labels: api.parseLabels(labels), ttl, uses, require_approval: approval })
      .then(setMade)
      .catch((err: Error) => setError(err.message));
  };
  const field = (label: string, value: string, set: (v: string) => void, name: string) => (
    <label>
      {label}
      <input name={name} value={value} onInput={(e) => set((e.target as HTMLInputElement).value)} />
    </label>
  );
  return (
    <section class="enroll">
      <h1>{t('enroll.title')}</h1>
      <form onSubmit={submit} data-testid="enroll-form">
        {field(t('enroll.region'), region, setRegion, 'region')}
        {field(t('enroll.site'), site, setSite, 'site')}
        {field(t('enroll.labels'), labels, setLabels, 'labels')}
        {field(t('enroll.ttl'), ttl, setTTL, 'ttl')}
        <label>
          {t('enroll.uses')}
          <input name="uses" type="number" min={1} value={uses} onInput={(e) => setUses(Number((e.target as HTMLInputElement).value))} />
        </label>
        <label class="check">
          <input type="checkbox" name="approval" checked={approval} onChange={(e) => setApproval((e.target as HTMLInputElement).checked)} />
          {t('enroll.approval')}
        </label>
        <button type="submit">{t('enroll.create')}</button>
      </form>
      {error && <p class="error" role="alert">{error}</p>}
      {made && (
        <div class="made" data-testid="install-lines">
          <p class="notice">{t('enroll.once', { time: formatTime(lang, made.expires_at) })}</p>
          <CopyLine label={t('enroll.linux')} text={made.install_linux} testid="install-linux" />
          <CopyLine label={t('enroll.windows')} text={made.install_windows} testid="install-windows" />
        </div>
      )}
      <EnrollTokens />
    </section>
  );
}

function CopyLine({ label, text, testid }: { label: string; text: string; testid: string }) {
  const { t } = useApp();
  const [copied, setCopied] = useState(false);
  return (
    <div class="copyline">
      <h3>{label}</h3>
      <pre data-testid={testid}>{text}</pre>
      <button
        onClick={() => navigator.clipboard?.writeText(text).then(() => setCopied(true), () => setCopied(false))}
      >
        {copied ? t('common.copied') : t('common.copy')}
      </button>
    </div>
  );
}
