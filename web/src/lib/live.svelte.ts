// Live changes: one EventSource per page on /api/v1/events (the browser
// sends the session cookie with it), fanned out to whatever page listens.
// `resync` means "list again": the caller's groups changed or the cursor
// is too old.
import type { Change } from './api';

type Listener = (event: { change?: Change; resync?: boolean }) => void;

const listeners = new Set<Listener>();
let source: EventSource | null = null;

export const stream = $state({ connected: false });

export function startLive(onResync: () => void) {
  stopLive();
  const es = new EventSource('/api/v1/events');
  source = es;
  // A stream starts from "now": whatever changed between a page's listing
  // and the stream's opening would be missed, so every opening tells the
  // pages to list again.
  es.onopen = () => {
    stream.connected = true;
    for (const l of listeners) l({ resync: true });
  };
  es.onerror = () => (stream.connected = es.readyState === EventSource.OPEN);
  es.onmessage = (e) => {
    let change: Change;
    try {
      change = JSON.parse(e.data) as Change;
    } catch {
      return;
    }
    for (const l of listeners) l({ change });
  };
  es.addEventListener('resync', () => {
    onResync();
    for (const l of listeners) l({ resync: true });
  });
}

export function stopLive() {
  source?.close();
  source = null;
  stream.connected = false;
}

/** Listens to changes until the returned function is called. */
export function onChange(listener: Listener): () => void {
  listeners.add(listener);
  return () => listeners.delete(listener);
}
