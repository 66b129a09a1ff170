// The console's API as the web app calls it: same origin, the session
// cookie, the CSRF token on every change, and the tenant the user works in.

export interface Me {
  user: string;
  roles: Record<string, string>;
  tenant: string;
  role: string;
  csrf?: string;
  expires_at?: string;
}

export interface Box {
  id: string;
  name: string;
  tenant_id: string;
  region: string;
  site: string;
  labels?: Record<string, string>;
  state: 'pending' | 'approved' | 'revoked';
  online: boolean;
  rtt_ms?: number;
  address?: string;
  connected_at?: string;
  replica?: string;
  last_seen?: string;
  hostname?: string;
  os?: string;
  arch?: string;
  os_version?: string;
  agent_version?: string;
  cpus?: number;
  memory_bytes?: number;
  enrolled_at: string;
  cert_not_after?: string;
  /** health is what the console makes of the box; health_detail gives the grounds. */
  health?: BoxHealth;
  health_detail?: string;
  /** vitals are the box's latest figures of itself, absent until its first report. */
  vitals?: BoxVitals;
}

/**
 * BoxHealth: online; disconnected-running (no tunnel, but most of its site
 * hears it: its line is down); down (most of its site does not); unknown
 * (too few of its site voted).
 */
export type BoxHealth = 'online' | 'disconnected-running' | 'down' | 'unknown';

/** BoxVitals are a box's own figures at one moment; one its OS does not tell is 0. */
export interface BoxVitals {
  cpu_percent: number;
  memory_used_bytes: number;
  memory_total_bytes: number;
  disk_used_bytes: number;
  disk_total_bytes: number;
  temperature_celsius?: number;
  uptime_seconds: number;
  reported_at: string;
}

export interface ObjectStatus {
  kind: string;
  name: string;
  observed_revision: number;
  phase: string;
  message?: string;
  updated_at: string;
  release?: string;
  health?: string;
  address?: string;
  restarts?: number;
}

export interface BoxEvent {
  time: string;
  kind: string;
  name: string;
  reason: string;
  message?: string;
  warning?: boolean;
}

export interface BoxState {
  box_id: string;
  revision: number;
  acked: number;
  objects: { kind: string; name: string; revision: number; spec: unknown }[];
  statuses: ObjectStatus[];
  events: BoxEvent[];
}

export interface Key {
  id: string;
  box_id: string;
  port: string;
  vendor_id: string;
  product_id: string;
  serial?: string;
  labels?: Record<string, string>;
  state: string;
  holder?: string;
  /** holder_box is the holder's box when the key is used from another box. */
  holder_box?: string;
  product?: string;
}

export interface CreatedToken {
  id: string;
  token: string;
  install_linux: string;
  install_windows: string;
  expires_at: string;
}

export interface User {
  name: string;
  roles: Record<string, string>;
  created_at: string;
}

/** ApiError is a refused or failed call, with the console's message. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

/** Session is what calls carry: the CSRF token and the tenant. */
export interface Session {
  csrf: string;
  tenant: string;
  /** onExpired runs when the console says the session is over. */
  onExpired: () => void;
}

/** callTimeout bounds one API call, in milliseconds. */
const callTimeout = 30000;

export async function call<T>(s: Session | null, method: string, path: string, body?: unknown): Promise<T> {
  const headers: Record<string, string> = { Accept: 'application/json' };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  if (s?.csrf && method !== 'GET') headers['X-CSRF-Token'] = s.csrf;
  if (s?.tenant) headers['X-Edgebox-Tenant'] = s.tenant;
  const resp = await fetch(path, {
    method,
    headers,
    credentials: 'same-origin',
    body: body === undefined ? undefined : JSON.stringify(body),
    // A call the console does not answer ends, and the page tries again.
    signal: AbortSignal.timeout(callTimeout),
  });
  if (resp.status === 401 && s && path !== '/api/v1/login') {
    s.onExpired();
  }
  const text = await resp.text();
  if (!resp.ok) {
    let msg = resp.statusText;
    try {
      msg = (JSON.parse(text) as { error?: string }).error || msg;
    } catch {
      /* not JSON: keep the status text */
    }
    throw new ApiError(resp.status, msg);
  }
  return (text ? JSON.parse(text) : undefined) as T;
}

export const login = (user: string, password: string) =>
  call<Me>(null, 'POST', '/api/v1/login', { user, password });

export const me = (s: Session) => call<Me>(s, 'GET', '/api/v1/me');
export const logout = (s: Session) => call<void>(s, 'POST', '/api/v1/logout');
export const logoutEverywhere = (s: Session) => call<void>(s, 'POST', '/api/v1/logout/everywhere');

export const boxes = (s: Session) => call<{ boxes: Box[] }>(s, 'GET', '/api/v1/boxes').then((r) => r.boxes);
export const box = (s: Session, id: string) => call<Box>(s, 'GET', `/api/v1/boxes/${encodeURIComponent(id)}`);
export const boxState = (s: Session, id: string) =>
  call<BoxState>(s, 'GET', `/api/v1/boxes/${encodeURIComponent(id)}/state`);
export const approve = (s: Session, id: string) =>
  call<Box>(s, 'POST', `/api/v1/boxes/${encodeURIComponent(id)}/approve`);
export const revoke = (s: Session, id: string) =>
  call<Box>(s, 'POST', `/api/v1/boxes/${encodeURIComponent(id)}/revoke`, {});
export const logs = (s: Session, id: string, workload: string, tail: number) =>
  call<{ text: string; truncated?: boolean }>(
    s,
    'GET',
    `/api/v1/boxes/${encodeURIComponent(id)}/workloads/${encodeURIComponent(workload)}/logs?tail=${tail}`,
  );
export const keys = (s: Session, boxID: string) =>
  call<{ keys: Key[] }>(s, 'GET', `/api/v1/keys?box=${encodeURIComponent(boxID)}`).then((r) => r.keys);
export const allKeys = (s: Session, labels: string[]) =>
  call<{ keys: Key[] }>(s, 'GET', '/api/v1/keys?' + labels.map((l) => 'label=' + encodeURIComponent(l)).join('&')).then((r) => r.keys);
export const labelKey = (s: Session, id: string, labels: Record<string, string>) =>
  call<Key>(s, 'POST', `/api/v1/keys/${encodeURIComponent(id)}/labels`, { labels });
/** leaseKey gives a key to a workload on its own box, or on box (ID or name): then the key is used from there. */
export const leaseKey = (s: Session, id: string, workload: string, box = '') =>
  call<Key>(s, 'POST', `/api/v1/keys/${encodeURIComponent(id)}/lease`, box ? { workload, box } : { workload });
export const releaseKey = (s: Session, id: string) => call<Key>(s, 'POST', `/api/v1/keys/${encodeURIComponent(id)}/release`);

export interface KeyEvent {
  time: string;
  event: string;
  workload?: string;
  actor?: string;
  detail?: string;
}
export const keyHistory = (s: Session, id: string) =>
  call<{ key: string; events: KeyEvent[] }>(s, 'GET', `/api/v1/keys/${encodeURIComponent(id)}/history`).then((r) => r.events);

export interface AuditEntry {
  seq: number;
  time: string;
  actor: string;
  action: string;
  target?: string;
  remote?: string;
  result: string;
  detail?: string;
}
export interface AuditFilter {
  actor?: string;
  action?: string;
  target?: string;
  since?: string;
  until?: string;
}
function auditQuery(f: AuditFilter, extra: Record<string, string>): string {
  const q = new URLSearchParams(extra);
  for (const [k, v] of Object.entries(f)) if (v) q.set(k, v);
  return q.toString();
}
export const audit = (s: Session, f: AuditFilter) =>
  call<{ entries: AuditEntry[] }>(s, 'GET', '/api/v1/audit?' + auditQuery(f, { limit: '500' })).then((r) => r.entries);

/** auditCSV fetches the filtered audit log as a CSV file's text. */
export async function auditCSV(s: Session, f: AuditFilter): Promise<Blob> {
  const resp = await fetch('/api/v1/audit?' + auditQuery(f, { limit: '1000', format: 'csv' }), {
    credentials: 'same-origin',
    headers: s.tenant ? { 'X-Edgebox-Tenant': s.tenant } : {},
    signal: AbortSignal.timeout(callTimeout),
  });
  if (resp.status === 401) s.onExpired();
  if (!resp.ok) throw new ApiError(resp.status, resp.statusText);
  return resp.blob();
}

export const createToken = (
  s: Session,
  req: { region: string; site: string; labels?: Record<string, string>; ttl?: string; uses?: number; require_approval?: boolean },
) => call<CreatedToken>(s, 'POST', '/api/v1/tokens', req);

export const users = (s: Session) => call<User[]>(s, 'GET', '/api/v1/users');
export const createUser = (s: Session, name: string, password: string, role: string) =>
  call<User>(s, 'POST', '/api/v1/users', { name, password, role });
export const setRole = (s: Session, name: string, role: string) =>
  call<User>(s, 'PUT', `/api/v1/users/${encodeURIComponent(name)}/role`, { role });
export const deleteUser = (s: Session, name: string) =>
  call<void>(s, 'DELETE', `/api/v1/users/${encodeURIComponent(name)}`);

/** The permissions of each role, as the console checks them. */
export type Permission = 'read' | 'operate' | 'maintain' | 'administer' | 'audit';

export function can(role: string, p: Permission): boolean {
  switch (role) {
    case 'admin':
      return true;
    case 'maintainer':
      return p === 'read' || p === 'operate' || p === 'maintain';
    case 'operator':
      return p === 'read' || p === 'operate';
    case 'auditor':
      return p === 'read' || p === 'audit';
    case 'viewer':
      return p === 'read';
  }
  return false;
}

export interface App {
  name: string;
  description?: string;
  created_at: string;
  created_by: string;
}
export interface ReleaseSpec {
  version: string;
  runtime: string;
  image: string;
  env?: string[];
  args?: string[];
  memory_bytes?: number;
  keys?: { labels: Record<string, string> }[];
  probes?: { http?: string; exec?: string[] }[];
}
export interface Release extends ReleaseSpec {
  app: string;
  tag?: string;
  created_at: string;
  created_by: string;
}
export interface Pin {
  app: string;
  scope: string;
  target: string;
  version: string;
  at: string;
  by: string;
}
export interface AppBoxStatus {
  box_id: string;
  box_name: string;
  online: boolean;
  desired_release: string;
  running_release?: string;
  phase?: string;
  health?: string;
  message?: string;
}
export interface DeployPreview {
  boxes: { id: string; name: string; online: boolean; missing_keys?: string[] }[];
  already: number;
  offline: number;
  no_key: number;
  kept: number;
}
export interface DeployResult {
  changed_boxes: string[];
  problems?: string[];
}

const appPath = (app: string) => `/api/v1/apps/${encodeURIComponent(app)}`;
const pinPath = (app: string, scope: string, target: string) =>
  `${appPath(app)}/pins/${encodeURIComponent(scope)}/${encodeURIComponent(target)}`;

export const apps = (s: Session) => call<{ apps: App[] }>(s, 'GET', '/api/v1/apps').then((r) => r.apps);
export const createApp = (s: Session, name: string, description: string) => call<App>(s, 'POST', '/api/v1/apps', { name, description });
export const releases = (s: Session, app: string) =>
  call<{ releases: Release[] }>(s, 'GET', `${appPath(app)}/releases`).then((r) => r.releases);
export const createRelease = (s: Session, app: string, spec: ReleaseSpec) => call<Release>(s, 'POST', `${appPath(app)}/releases`, spec);
export const pins = (s: Session, app: string) => call<{ pins: Pin[] }>(s, 'GET', `${appPath(app)}/pins`).then((r) => r.pins);
export const preview = (s: Session, app: string, version: string, scope: string, target: string) =>
  call<DeployPreview>(s, 'GET', `${pinPath(app, scope, target)}/preview?version=${encodeURIComponent(version)}`);
export const deploy = (s: Session, app: string, version: string, scope: string, target: string) =>
  call<DeployResult>(s, 'PUT', pinPath(app, scope, target), { version });
export const undeploy = (s: Session, app: string, scope: string, target: string) =>
  call<DeployResult>(s, 'DELETE', pinPath(app, scope, target));
export const appStatus = (s: Session, app: string) =>
  call<{ app: string; boxes: AppBoxStatus[] }>(s, 'GET', `${appPath(app)}/status`).then((r) => r.boxes);

export interface APIToken {
  id: string;
  name: string;
  user: string;
  created_at: string;
  expires_at?: string;
  token?: string;
}
export const apiTokens = (s: Session) => call<APIToken[]>(s, 'GET', '/api/v1/apitokens');
export const createAPIToken = (s: Session, name: string, ttl: string) => call<APIToken>(s, 'POST', '/api/v1/apitokens', { name, ttl });
export const revokeAPIToken = (s: Session, id: string) => call<void>(s, 'DELETE', `/api/v1/apitokens/${encodeURIComponent(id)}`);

export interface EnrollToken {
  id: string;
  region: string;
  site: string;
  uses: number;
  used: number;
  expires_at: string;
  created_by: string;
  revoked: boolean;
  require_approval: boolean;
}
export const enrollTokens = (s: Session) => call<{ tokens: EnrollToken[] }>(s, 'GET', '/api/v1/tokens').then((r) => r.tokens);
export const revokeEnrollToken = (s: Session, id: string) => call<void>(s, 'DELETE', `/api/v1/tokens/${encodeURIComponent(id)}`);
export const userTokens = (s: Session, user: string) => call<APIToken[]>(s, 'GET', `/api/v1/users/${encodeURIComponent(user)}/apitokens`);
export const revokeUserToken = (s: Session, user: string, id: string) =>
  call<void>(s, 'DELETE', `/api/v1/users/${encodeURIComponent(user)}/apitokens/${encodeURIComponent(id)}`);

/** parseLabel reads "key=value" (the value may hold '='); null when there is no key. */
export function parseLabel(kv: string): [string, string] | null {
  const i = kv.indexOf('=');
  const k = (i < 0 ? kv : kv.slice(0, i)).trim();
  return k ? [k, i < 0 ? '' : kv.slice(i + 1).trim()] : null;
}

/** parseLabels reads "a=b, c=d". */
export function parseLabels(s: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const kv of s.split(',')) {
    const l = parseLabel(kv);
    if (l) out[l[0]] = l[1];
  }
  return out;
}

/** formatLabels writes labels as "a=b, c=d", sorted. */
export function formatLabels(l?: Record<string, string>): string {
  return l ? Object.entries(l).map(([k, v]) => `${k}=${v}`).sort().join(', ') : '';
}

/** Tree is boxes by region, then site, each level sorted by name. */
export type Tree = [string, [string, Box[]][]][];

/** tree groups boxes by region and site. */
export function tree(boxes: Box[]): Tree {
  const regions = new Map<string, Map<string, Box[]>>();
  for (const b of boxes) {
    let sites = regions.get(b.region);
    if (!sites) regions.set(b.region, (sites = new Map()));
    const list = sites.get(b.site);
    list ? list.push(b) : sites.set(b.site, [b]);
  }
  const byName = <V,>([a]: [string, V], [b]: [string, V]) => a.localeCompare(b);
  return [...regions.entries()].sort(byName).map(([r, sites]) => [r, [...sites.entries()].sort(byName)]);
}

/** RolloutState is where a rollout stands; the last three are over. */
export type RolloutState = 'awaiting-approval' | 'running' | 'paused' | 'stopped' | 'aborted' | 'done';
export type RolloutPhase = 'waiting' | 'held' | 'updating' | 'gating' | 'done' | 'failed';

export interface RolloutRequest {
  app: string;
  from: string;
  to: string;
  regions?: string[];
  site?: string;
  selector?: Record<string, string>;
  boxes?: string[];
  waves?: string[];
  gate?: string;
  box_timeout?: string;
  max_unavailable?: number;
  failure_percent?: number;
  revert_all?: boolean;
}
export interface RolloutBox {
  id: string;
  site: string;
  wave: number;
  phase: RolloutPhase;
  reason?: string;
  since?: string;
  reverted?: boolean;
}
export interface RolloutGroup {
  name: string;
  wave: number;
  waves: number;
  boxes: RolloutBox[];
}
export interface Rollout {
  id: string;
  app: string;
  from: string;
  to: string;
  scope: string;
  state: RolloutState;
  reason?: string;
  created_at: string;
  created_by: string;
  updated_at: string;
  approvals?: { by: string; at: string; stage: 'start' | 'first-wave' }[];
  settings: { waves: string[]; gate: string; box_timeout: string; max_unavailable: number; failure_percent: number; revert_all?: boolean };
  progress: { total: number; waiting: number; held: number; updating: number; gating: number; done: number; failed: number; reverted: number };
  prefetch?: { image: string; asked: number; on_disk: number; failed: number };
  /** group is the index of the group in progress, groups.length when over. */
  group: number;
  groups?: RolloutGroup[];
  skipped?: { box: string; reason: string }[];
}
export interface UpdateWindow {
  days: string;
  from: string;
  to: string;
}
export interface Calendar {
  holidays?: string[];
  extra_workdays?: string[];
}
export interface UpdatePolicy {
  zone: string;
  allow?: UpdateWindow[];
  deny?: UpdateWindow[];
  calendar?: Calendar;
}
export interface RolloutRules {
  approve_start?: boolean;
  approve_first_wave?: boolean;
  regions?: Record<string, UpdatePolicy>;
  sites?: Record<string, UpdatePolicy>;
  calendar?: Calendar;
  updated_at?: string;
  updated_by?: string;
}

/** rolloutOver reports whether a rollout in state s moves no more boxes. */
export const rolloutOver = (s: RolloutState) => s === 'stopped' || s === 'aborted' || s === 'done';

const rolloutPath = (id: string) => `/api/v1/rollouts/${encodeURIComponent(id)}`;

export const rollouts = (s: Session) => call<{ rollouts: Rollout[] }>(s, 'GET', '/api/v1/rollouts').then((r) => r.rollouts);
export const rollout = (s: Session, id: string) => call<Rollout>(s, 'GET', rolloutPath(id));
export const createRollout = (s: Session, req: RolloutRequest) => call<Rollout>(s, 'POST', '/api/v1/rollouts', req);
export const rolloutAction = (s: Session, id: string, action: 'pause' | 'resume' | 'abort' | 'approve', body: { reason?: string; revert?: boolean } = {}) =>
  call<Rollout>(s, 'POST', `${rolloutPath(id)}/${action}`, body);
export const rolloutRules = (s: Session) => call<RolloutRules>(s, 'GET', '/api/v1/rollout-rules');

/** SessionRecord is a remote session (a shell, a command) as the console records it. */
export interface SessionRecord {
  id: string;
  tenant_id: string;
  box: string;
  box_name?: string;
  workload?: string;
  kind: 'shell' | 'exec' | string;
  command?: string[];
  tty: boolean;
  user: string;
  remote?: string;
  started: string;
  /** ended is absent while the session is live. */
  ended?: string;
  /** ended_by: exit, idle, time limit, user:<name>, box, operator left, bad input, refused, console stopped, not approved. */
  ended_by?: string;
  exit_code?: number;
  signal?: string;
  error?: string;
  bytes_in: number;
  bytes_out: number;
  recording?: { chunks: number; bytes: number; head: string; truncated?: boolean };
  target?: string;
  four_eyes?: boolean;
  approved_by?: string;
  approved_at?: string;
  /** view_only: a VM's screen that passed the VM no input. */
  view_only?: boolean;
}

/** RecordingReport is what checking a recording against its hash chain found. */
export interface RecordingReport {
  chunks: number;
  ok: boolean;
  problem?: string;
  bad_chunk: number;
  unchained_bytes?: number;
  head: string;
}

const sessionPath = (id: string) => `/api/v1/sessions/${encodeURIComponent(id)}`;

export const sessions = (s: Session, q: { live?: boolean; box?: string; limit?: number }) => {
  const p = new URLSearchParams();
  if (q.live) p.set('live', '1');
  if (q.box) p.set('box', q.box);
  if (q.limit) p.set('limit', String(q.limit));
  return call<SessionRecord[]>(s, 'GET', '/api/v1/sessions?' + p.toString());
};
export const sessionRecord = (s: Session, id: string) => call<SessionRecord>(s, 'GET', sessionPath(id));
export const endSession = (s: Session, id: string) => call<void>(s, 'POST', `${sessionPath(id)}/end`);
export const approveSession = (s: Session, id: string) => call<void>(s, 'POST', `${sessionPath(id)}/approve`);
export const verifyRecording = (s: Session, id: string) => call<RecordingReport>(s, 'GET', `${sessionPath(id)}/recording/verify`);

/** Asking is what a screen or forward on a box kept to four eyes asks approval for. */
export type Asking = { kind: 'screen'; workload: string; view_only: boolean } | { kind: 'forward'; target: string };

/**
 * askSession asks for the approval a screen or forward needs on a box kept
 * to four eyes. A second maintainer approves the request's record (its
 * approved_by is set then) and the screen or forward opens with its ID
 * (screenPath's request); one nobody approves ends (ended, ended_by).
 */
export const askSession = (s: Session, box: string, a: Asking) =>
  call<SessionRecord>(s, 'POST', `/api/v1/boxes/${encodeURIComponent(box)}/session-requests`, a);

/**
 * needsApproval reports whether the console refused a screen or forward
 * for want of a four-eyes approval, which askSession asks for: its message
 * starts with the console's NeedsApprovalCode.
 */
export const needsApproval = (e: unknown) => e instanceof ApiError && e.status === 403 && e.message.startsWith('approval needed');

/** BoxMatch picks boxes: those with every label it names, in its region and site when it names them. */
export interface BoxMatch {
  labels?: Record<string, string>;
  region?: string;
  site?: string;
}

/**
 * SessionRules are a tenant's rules for remote sessions: which boxes keep
 * them to four eyes, and the LAN hosts port forwards from a site's boxes,
 * or one box's (by ID), may reach (ADDRESS[/BITS]:PORTS or HOSTNAME:PORTS).
 */
export interface SessionRules {
  four_eyes?: BoxMatch[];
  forward_sites?: Record<string, string[]>;
  forward_boxes?: Record<string, string[]>;
  updated_at?: string;
  updated_by?: string;
}
export const sessionRules = (s: Session) => call<SessionRules>(s, 'GET', '/api/v1/session-rules');
/** setSessionRules replaces the tenant's session rules (admins); the console refuses invalid ones, saying why. */
export const setSessionRules = (s: Session, r: SessionRules) => call<SessionRules>(s, 'PUT', '/api/v1/session-rules', r);

/**
 * withTenant adds the tenant to a path the browser opens by itself (a
 * WebSocket, a download, the player's fetch), which sends no header of
 * the page's.
 */
export function withTenant(s: Session, path: string): string {
  if (!s.tenant) return path;
  return path + (path.includes('?') ? '&' : '?') + 'tenant=' + encodeURIComponent(s.tenant);
}

/** execPath is the WebSocket of an interactive shell on box, or in one of its workloads. */
export function execPath(s: Session, box: string, workload: string): string {
  const q = new URLSearchParams({ tty: '1', term: 'xterm-256color' });
  if (workload) q.set('workload', workload);
  return withTenant(s, `/api/v1/boxes/${encodeURIComponent(box)}/exec?${q.toString()}`);
}
/**
 * screenPath is the WebSocket of a VM workload's screen (RFB); viewOnly
 * passes the VM no input; request is the approved request (askSession) it
 * opens with on a box kept to four eyes.
 */
export function screenPath(s: Session, box: string, workload: string, viewOnly: boolean, request = ''): string {
  const q = new URLSearchParams();
  if (viewOnly) q.set('view_only', '1');
  if (request) q.set('request', request);
  const p = `/api/v1/boxes/${encodeURIComponent(box)}/workloads/${encodeURIComponent(workload)}/screen`;
  return withTenant(s, q.toString() ? `${p}?${q.toString()}` : p);
}

/**
 * boxWebPath is a page of the box's own web server (127.0.0.1:port on the
 * box), which the console serves sandboxed. A tenant chosen in the page
 * goes in the path, which the page's own links and subresources keep.
 */
export function boxWebPath(s: Session, box: string, port: number): string {
  const p = `/boxes/${encodeURIComponent(box)}/web/${port}/`;
  return s.tenant ? `/api/v1/tenants/${encodeURIComponent(s.tenant)}${p}` : `/api/v1${p}`;
}
export const watchPath = (s: Session, id: string) => withTenant(s, `${sessionPath(id)}/watch`);
export const recordingPath = (s: Session, id: string) => withTenant(s, `${sessionPath(id)}/recording`);

/** AlertKind is what an alert rule watches. */
export type AlertKind = 'box-offline' | 'box-down' | 'key-broken' | 'workload-unhealthy' | 'rollout-stopped' | 'cert-expiry';
/** alertKinds are the kinds of rule, in the order they are shown. */
export const alertKinds: AlertKind[] = ['box-offline', 'box-down', 'key-broken', 'workload-unhealthy', 'rollout-stopped', 'cert-expiry'];

/** Incident is one condition of one thing under the tenant's alert rules, from when it began to hold to when it ended. */
export interface Incident {
  id: string;
  kind: AlertKind;
  /** subject is what it is about; summary what holds now. */
  subject: string;
  summary: string;
  box?: string;
  box_name?: string;
  site?: string;
  region?: string;
  /** state: pending (not held for its rule's minutes yet), firing or resolved. */
  state: 'pending' | 'firing' | 'resolved';
  since: string;
  fired_at?: string;
  resolved_at?: string;
  /** silenced: a silence (silenced_by) keeps it from the webhooks now. */
  silenced?: boolean;
  silenced_by?: string;
  /** notified: the webhooks were told it fired. */
  notified?: boolean;
}

/** AlertRule raises an incident for each thing of its kind that holds its condition for for_minutes. */
export interface AlertRule {
  kind: AlertKind;
  for_minutes?: number;
  /** days is, for cert-expiry, how close to its end a certificate is worth an alert; 14 when absent. */
  days?: number;
}

/** Webhook is where alerts are posted; its secret is written, never read back (has_secret). */
export interface Webhook {
  url: string;
  secret?: string;
  has_secret?: boolean;
}

export interface AlertRules {
  rules?: AlertRule[];
  webhooks?: Webhook[];
  updated_at?: string;
  updated_by?: string;
}

/** Silence keeps the incidents it matches (its kind, box by ID or name, site: those it names) from the webhooks until until. */
export interface Silence {
  id: string;
  kind?: AlertKind;
  box?: string;
  site?: string;
  until: string;
  comment?: string;
  created_by?: string;
  created_at: string;
}

/** SilenceRequest asks for a silence for a Go duration ("2h"). */
export interface SilenceRequest {
  kind?: AlertKind;
  box?: string;
  site?: string;
  for: string;
  comment?: string;
}

/** alerts are the tenant's open incidents, firing first, and the last resolved ones. */
export const alerts = (s: Session, resolved: number) =>
  call<{ open: Incident[]; resolved?: Incident[] }>(s, 'GET', `/api/v1/alerts?resolved=${resolved}`);
export const alertRules = (s: Session) => call<AlertRules>(s, 'GET', '/api/v1/alert-rules');
/** setAlertRules replaces the tenant's alert rules (admins); a webhook named without a secret keeps its own. */
export const setAlertRules = (s: Session, r: AlertRules) => call<AlertRules>(s, 'PUT', '/api/v1/alert-rules', r);
/** testWebhooks posts a test notice to each webhook now and says what each answered: no error when it took it. */
export const testWebhooks = (s: Session) =>
  call<{ webhooks: { url: string; error?: string }[] }>(s, 'POST', '/api/v1/alert-rules/test').then((r) => r.webhooks);
export const silences = (s: Session) => call<{ silences: Silence[] }>(s, 'GET', '/api/v1/silences').then((r) => r.silences);
export const silence = (s: Session, r: SilenceRequest) => call<Silence>(s, 'POST', '/api/v1/silences', r);
export const unsilence = (s: Session, id: string) => call<void>(s, 'DELETE', `/api/v1/silences/${encodeURIComponent(id)}`);
