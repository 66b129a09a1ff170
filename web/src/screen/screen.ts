// A VM's screen: noVNC's RFB client on the screen's WebSocket, which the
// console joins to the VM's VNC. This module and noVNC load only when a
// page opens a screen, so the console's first page stays small.
//
// noVNC sets its elements' styles through the CSS object model (element.
// style), which the console's Content-Security-Policy allows, and makes no
// <style> element; its cursor is a data: URL, which img-src allows.

import RFB from '@novnc/novnc';

/** End is how a screen ended. */
export type End =
  /** closed: the screen was shown, then its connection closed. */
  | { why: 'closed' }
  /** refused: the WebSocket never opened; the console refused it. */
  | { why: 'refused' }
  /** unanswered: the console took the WebSocket and closed it before the VM spoke. */
  | { why: 'unanswered' }
  /** security: the VM refused the viewer, with its reason. */
  | { why: 'security'; reason: string }
  /** password: the VM asks for a password, which the console never gives. */
  | { why: 'password' };

export interface Options {
  /** path is the screen's WebSocket, on the console's origin, with its query. */
  path: string;
  /** viewOnly: the page sends no key, pointer or clipboard (the console drops them too). */
  viewOnly?: boolean;
  /** onShown runs once the VM has answered and its screen is drawn. */
  onShown: () => void;
  /** onEnd runs once, when the screen ends other than by dispose. */
  onEnd: (e: End) => void;
}

/** Handle is an open screen. */
export interface Handle {
  /** ctrlAltDel presses Ctrl-Alt-Del in the VM; a view-only screen ignores it. */
  ctrlAltDel: () => void;
  focus: () => void;
  /** dispose closes the connection and removes the screen. */
  dispose: () => void;
}

/** open shows, in host, the screen at o.path. */
export function open(host: HTMLElement, o: Options): Handle {
  const url = new URL(o.path, location.href);
  url.protocol = location.protocol === 'https:' ? 'wss:' : 'ws:';
  // The page opens the WebSocket itself and hands it to noVNC: whether it
  // opened tells a refused screen from one the VM never answered.
  const ws = new WebSocket(url.href);
  let opened = false;
  ws.addEventListener('open', () => {
    opened = true;
  });
  const rfb = new RFB(host, ws, { shared: true });
  rfb.viewOnly = !!o.viewOnly;
  rfb.focusOnClick = !o.viewOnly;
  rfb.scaleViewport = true; // the whole screen, fitted to its box
  rfb.resizeSession = false; // the VM keeps its own resolution
  rfb.background = '#0f1722';

  let shown = false;
  let disconnected = false;
  let ended = false;
  let refusal = '';
  const end = (e: End) => {
    if (ended) return;
    ended = true;
    o.onEnd(e);
  };
  rfb.addEventListener('connect', () => {
    shown = true;
    o.onShown();
  });
  rfb.addEventListener('securityfailure', (ev) => {
    const d = (ev as CustomEvent<{ status: number; reason?: string }>).detail;
    refusal = d.reason || `status ${d.status}`;
  });
  rfb.addEventListener('credentialsrequired', () => {
    end({ why: 'password' });
    if (!disconnected) rfb.disconnect();
  });
  rfb.addEventListener('disconnect', () => {
    disconnected = true;
    if (refusal) end({ why: 'security', reason: refusal });
    else if (shown) end({ why: 'closed' });
    else if (opened) end({ why: 'unanswered' });
    else end({ why: 'refused' });
  });

  return {
    ctrlAltDel: () => {
      if (shown && !disconnected && !o.viewOnly) rfb.sendCtrlAltDel();
    },
    focus: () => {
      if (!o.viewOnly) rfb.focus({ preventScroll: true });
    },
    dispose: () => {
      ended = true;
      if (!disconnected) rfb.disconnect();
    },
  };
}
