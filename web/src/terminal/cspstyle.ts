// xterm.js writes its theme and the size of its cells into <style>
// elements that it creates. The console's Content-Security-Policy
// (style-src 'self', no inline styles) refuses every such element, and the
// terminal would be drawn without its colours and cell sizes. A
// constructed style sheet is no inline style: this module hands the
// terminal, for each <style> it asks the document for, a hidden element
// whose text goes into a constructed sheet adopted by the document, and
// which takes the sheet away again when the terminal removes it.

/** sheets maps each constructed sheet to the element that stands for it. */
const sheets = new Map<CSSStyleSheet, HTMLElement>();
let routed: Document | null = null;

/**
 * routeStyleElements makes doc's createElement("style") answer with an
 * element whose textContent fills a constructed sheet. Every other tag is
 * created as always. It is done once per page.
 */
export function routeStyleElements(doc: Document) {
  if (routed) return;
  routed = doc;
  const create = doc.createElement.bind(doc) as (tag: string, opts?: ElementCreationOptions) => HTMLElement;
  const patched = (tag: string, opts?: ElementCreationOptions) =>
    tag.toLowerCase() === 'style' ? standIn(doc, create('span')) : create(tag, opts);
  doc.createElement = patched as typeof doc.createElement;
}

function standIn(doc: Document, el: HTMLElement): HTMLElement {
  el.hidden = true;
  el.dataset.styleSheet = '';
  const sheet = new CSSStyleSheet();
  let text = '';
  Object.defineProperty(el, 'textContent', {
    configurable: true,
    get: () => text,
    set: (v: string | null) => {
      text = v ?? '';
      sheet.replaceSync(text);
      if (!sheets.has(sheet)) {
        sheets.set(sheet, el);
        doc.adoptedStyleSheets = [...doc.adoptedStyleSheets, sheet];
      }
    },
  });
  const remove = el.remove.bind(el);
  el.remove = () => {
    drop(doc, [sheet]);
    remove();
  };
  return el;
}

function drop(doc: Document, gone: CSSStyleSheet[]) {
  if (gone.length === 0) return;
  for (const s of gone) sheets.delete(s);
  doc.adoptedStyleSheets = doc.adoptedStyleSheets.filter((s) => !gone.includes(s));
}

/** sweep drops the sheets whose elements have left the document without being removed. */
export function sweep() {
  if (!routed) return;
  drop(routed, [...sheets].filter(([, el]) => !el.isConnected).map(([s]) => s));
}
