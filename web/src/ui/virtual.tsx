import type { ComponentChildren } from 'preact';
import { useEffect, useRef, useState } from 'preact/hooks';

/**
 * VirtualList renders only the rows in view (and a few around them), so a
 * list of 10,000 boxes costs what a screenful does.
 */
export function VirtualList<T>(props: {
  items: T[];
  rowHeight: number;
  height: number;
  row: (item: T, index: number) => ComponentChildren;
  testid?: string;
}) {
  const { items, rowHeight, height, row } = props;
  const ref = useRef<HTMLDivElement>(null);
  const [top, setTop] = useState(0);
  useEffect(() => {
    const el = ref.current;
    if (!el) return;
    const onScroll = () => setTop(el.scrollTop);
    el.addEventListener('scroll', onScroll, { passive: true });
    return () => el.removeEventListener('scroll', onScroll);
  }, []);
  const first = Math.max(0, Math.floor(top / rowHeight) - 10);
  const last = Math.min(items.length, Math.ceil((top + height) / rowHeight) + 10);
  const shown = [];
  for (let i = first; i < last; i++) {
    shown.push(
      <div class="vrow" style={{ top: `${i * rowHeight}px`, height: `${rowHeight}px` }} key={i}>
        {row(items[i], i)}
      </div>,
    );
  }
  return (
    <div class="vlist" ref={ref} style={{ height: `${height}px` }} data-testid={props.testid}>
      <div style={{ height: `${items.length * rowHeight}px`, position: 'relative' }}>{shown}</div>
    </div>
  );
}
