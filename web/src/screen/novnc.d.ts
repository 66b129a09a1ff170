// The part of noVNC's RFB client (docs/API.md in @novnc/novnc) that the
// console's screen uses. noVNC ships JavaScript without types.
declare module '@novnc/novnc' {
  export interface RFBOptions {
    shared?: boolean;
    credentials?: { username?: string; password?: string; target?: string };
    wsProtocols?: string[];
  }

  export default class RFB extends EventTarget {
    /** target is where RFB puts its screen; channel a WebSocket it takes over, or a URL. */
    constructor(target: HTMLElement, channel: WebSocket | string, options?: RFBOptions);
    viewOnly: boolean;
    scaleViewport: boolean;
    clipViewport: boolean;
    resizeSession: boolean;
    focusOnClick: boolean;
    showDotCursor: boolean;
    background: string;
    disconnect(): void;
    sendCtrlAltDel(): void;
    focus(options?: FocusOptions): void;
    getImageData(): ImageData;
  }
}
