// Every string the web console shows, in English and Simplified Chinese.
// A key missing from zh-CN fails the build (the type below), so a page is
// never half translated.

const en = {
  'app.title': 'edgebox',
  'nav.fleet': 'Fleet',
  'nav.waiting': 'Waiting room',
  'nav.enroll': 'Enroll a box',
  'nav.users': 'Users',
  'nav.logout': 'Log out',
  'nav.logoutEverywhere': 'Log out everywhere',
  'nav.tenant': 'Tenant',
  'nav.language': 'Language',
  'login.title': 'Log in to edgebox',
  'login.user': 'User name',
  'login.password': 'Password',
  'login.submit': 'Log in',
  'login.expired': 'Your session ended. Log in again to go back where you were.',
  'common.loading': 'Loading…',
  'common.error': 'Error: {msg}',
  'common.none': 'None',
  'common.yes': 'yes',
  'common.no': 'no',
  'common.copy': 'Copy',
  'common.copied': 'Copied',
  'common.refresh': 'Updated {time}',
  'fleet.title': 'Fleet',
  'fleet.search': 'Search by name, ID, host or label',
  'fleet.labelFilter': 'Label filter (key=value)',
  'fleet.all': 'All regions',
  'fleet.counts': '{online} online · {offline} offline · {waiting} waiting',
  'fleet.shown': '{shown} of {total} boxes',
  'fleet.col.name': 'Name',
  'fleet.col.region': 'Region',
  'fleet.col.site': 'Site',
  'fleet.col.state': 'State',
  'fleet.col.seen': 'Last seen',
  'fleet.col.labels': 'Labels',
  'state.online': 'online',
  'state.offline': 'offline',
  'state.pending': 'waiting',
  'state.revoked': 'revoked',
  'box.facts': 'Facts',
  'box.os': 'OS',
  'box.arch': 'Architecture',
  'box.agent': 'Agent version',
  'box.address': 'Host name',
  'box.seen': 'Last seen',
  'box.rtt': 'Tunnel RTT',
  'box.enrolled': 'Enrolled',
  'box.revision': 'Desired revision {desired}, stored by the box {acked}',
  'box.workloads': 'Workloads',
  'box.col.workload': 'Workload',
  'box.col.release': 'Release',
  'box.col.phase': 'Phase',
  'box.col.health': 'Health',
  'box.col.message': 'Last message',
  'box.keys': 'Keys',
  'box.col.key': 'Key',
  'box.col.port': 'Port',
  'box.col.holder': 'Held by',
  'box.events': 'Events',
  'box.logs': 'Logs',
  'box.logsOf': 'Logs of {name}',
  'box.logsFollow': 'Following: fetched again every 5 s',
  'box.noLogs': 'No output yet.',
  'waiting.title': 'Waiting room',
  'waiting.empty': 'No box is waiting for approval.',
  'waiting.approve': 'Approve',
  'waiting.reject': 'Reject',
  'waiting.approved': '{name} approved',
  'waiting.rejected': '{name} rejected',
  'enroll.title': 'Enroll a box',
  'enroll.region': 'Region',
  'enroll.site': 'Site',
  'enroll.labels': 'Labels (key=value, comma separated)',
  'enroll.ttl': 'Valid for',
  'enroll.uses': 'Boxes it may enroll',
  'enroll.approval': 'Each box waits for approval',
  'enroll.create': 'Create token',
  'enroll.linux': 'On a Linux box, as root',
  'enroll.windows': 'On a Windows box, in an elevated PowerShell',
  'enroll.once': 'This token is shown once. It expires {time}.',
  'users.title': 'Users',
  'users.name': 'Name',
  'users.role': 'Role',
  'users.password': 'Password',
  'users.create': 'Add user',
  'users.remove': 'Remove',
  'users.roles': 'Roles',
  'role.viewer': 'viewer',
  'role.auditor': 'auditor',
  'role.operator': 'operator',
  'role.maintainer': 'maintainer',
  'role.admin': 'admin',
  'notfound.title': 'No such page',
};

type Messages = typeof en;
export type MessageKey = keyof Messages;

const zh: Messages = {
  'app.title': 'edgebox',
  'nav.fleet': '设备群',
  'nav.waiting': '待批准',
  'nav.enroll': '登记设备',
  'nav.users': '用户',
  'nav.logout': '退出登录',
  'nav.logoutEverywhere': '退出所有登录',
  'nav.tenant': '租户',
  'nav.language': '语言',
  'login.title': '登录 edgebox',
  'login.user': '用户名',
  'login.password': '密码',
  'login.submit': '登录',
  'login.expired': '会话已结束。请重新登录，登录后回到原来的页面。',
  'common.loading': '加载中…',
  'common.error': '错误：{msg}',
  'common.none': '无',
  'common.yes': '是',
  'common.no': '否',
  'common.copy': '复制',
  'common.copied': '已复制',
  'common.refresh': '更新于 {time}',
  'fleet.title': '设备群',
  'fleet.search': '按名称、ID、主机名或标签搜索',
  'fleet.labelFilter': '标签筛选（键=值）',
  'fleet.all': '全部区域',
  'fleet.counts': '{online} 在线 · {offline} 离线 · {waiting} 待批准',
  'fleet.shown': '显示 {shown} / {total} 台设备',
  'fleet.col.name': '名称',
  'fleet.col.region': '区域',
  'fleet.col.site': '网点',
  'fleet.col.state': '状态',
  'fleet.col.seen': '最后在线',
  'fleet.col.labels': '标签',
  'state.online': '在线',
  'state.offline': '离线',
  'state.pending': '待批准',
  'state.revoked': '已吊销',
  'box.facts': '概况',
  'box.os': '操作系统',
  'box.arch': '架构',
  'box.agent': '代理版本',
  'box.address': '主机名',
  'box.seen': '最后在线',
  'box.rtt': '隧道延迟',
  'box.enrolled': '登记时间',
  'box.revision': '期望版本 {desired}，设备已存储 {acked}',
  'box.workloads': '工作负载',
  'box.col.workload': '工作负载',
  'box.col.release': '发布版本',
  'box.col.phase': '阶段',
  'box.col.health': '健康',
  'box.col.message': '最近消息',
  'box.keys': 'U盾',
  'box.col.key': 'U盾',
  'box.col.port': '端口',
  'box.col.holder': '使用者',
  'box.events': '事件',
  'box.logs': '日志',
  'box.logsOf': '{name} 的日志',
  'box.logsFollow': '跟随中：每 5 秒刷新',
  'box.noLogs': '暂无输出。',
  'waiting.title': '待批准',
  'waiting.empty': '没有等待批准的设备。',
  'waiting.approve': '批准',
  'waiting.reject': '拒绝',
  'waiting.approved': '已批准 {name}',
  'waiting.rejected': '已拒绝 {name}',
  'enroll.title': '登记设备',
  'enroll.region': '区域',
  'enroll.site': '网点',
  'enroll.labels': '标签（键=值，逗号分隔）',
  'enroll.ttl': '有效期',
  'enroll.uses': '可登记设备数',
  'enroll.approval': '每台设备需要批准',
  'enroll.create': '创建令牌',
  'enroll.linux': '在 Linux 设备上以 root 运行',
  'enroll.windows': '在 Windows 设备上以管理员 PowerShell 运行',
  'enroll.once': '此令牌只显示一次，{time} 过期。',
  'users.title': '用户',
  'users.name': '名称',
  'users.role': '角色',
  'users.password': '密码',
  'users.create': '添加用户',
  'users.remove': '移除',
  'users.roles': '角色',
  'role.viewer': '查看者',
  'role.auditor': '审计员',
  'role.operator': '操作员',
  'role.maintainer': '维护员',
  'role.admin': '管理员',
  'notfound.title': '页面不存在',
};

export const languages = { en: 'English', 'zh-CN': '简体中文' } as const;
export type Lang = keyof typeof languages;

const catalogues: Record<Lang, Messages> = { en, 'zh-CN': zh };

const stored = 'edgebox.lang';

/** initialLang is the language chosen before, else the browser's. */
export function initialLang(): Lang {
  const s = localStorage.getItem(stored);
  if (s === 'en' || s === 'zh-CN') return s;
  return navigator.language.toLowerCase().startsWith('zh') ? 'zh-CN' : 'en';
}

export function saveLang(l: Lang) {
  localStorage.setItem(stored, l);
  document.documentElement.lang = l;
}

export type T = (key: MessageKey, vars?: Record<string, string | number>) => string;

/** translator returns t for lang: the message, its {vars} filled in. */
export function translator(lang: Lang): T {
  const m = catalogues[lang];
  return (key, vars) => {
    let s = m[key];
    if (vars) for (const [k, v] of Object.entries(vars)) s = s.split(`{${k}}`).join(String(v));
    return s;
  };
}

/** formatTime shows an RFC 3339 time in the browser's time zone. */
export function formatTime(lang: Lang, iso?: string): string {
  if (!iso) return '—';
  const d = new Date(iso);
  if (isNaN(d.getTime()) || d.getFullYear() < 2000) return '—';
  return new Intl.DateTimeFormat(lang, { dateStyle: 'medium', timeStyle: 'medium' }).format(d);
}
