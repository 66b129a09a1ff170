import type * as api from '../api';
import type { MessageKey, T } from '../i18n';

const healthKeys: Record<api.BoxHealth, MessageKey> = {
  online: 'health.online',
  'disconnected-running': 'health.disconnected-running',
  down: 'health.down',
  unknown: 'health.unknown',
};

/** healthWord says a box's health in words ("line down, running"); a health this page does not know is shown as the console says it. */
export function healthWord(t: T, h: string): string {
  return h in healthKeys ? t(healthKeys[h as api.BoxHealth]) : h;
}
