// Live changes: one event stream on /api/v1/events (the browser sends the
// session cookie with it) for every tab of the app, fanned out to whatever
// page listens. A browser keeps at most six HTTP/1.1 connections to a
// host, and a stream holds one for as long as it is open: with a stream a
// tab, the seventh tab waited for ever. So the tabs elect one (a Web Lock
// held while it lives), which opens the stream and passes each event on to
// the others (a BroadcastChannel); when it closes, another takes over.
// Where either is missing (Web Locks need a secure context: HTTPS or
// localhost), each tab opens its own stream, as before.
// `resync` means "list again": the caller's groups changed or the cursor
// is too old.
import type { Change } from './api';

type Listener = (event: { change?: Change; resync?: boolean }) => void;

/** What the tab holding the stream tells the others. */
type Message =
  | { kind: 'change'; change: Change }
  | { kind: 'opened' } // the stream (re)opened: list again
  | { kind: 'resync' } // the server said resync
  | { kind: 'state'; connected: boolean }
  | { kind: 'hello' }; // a tab joined: say how the stream is

const NAME = 'tarn-live';
const listeners = new Set<Listener>();
let source: EventSource | null = null;
let channel: BroadcastChannel | null = null;
let waiting: AbortController | null = null;
let release: (() => void) | null = null;
let retry: ReturnType<typeof setTimeout> | null = null;

export const stream = $state({ connected: false });

function deliver(event: { change?: Change; resync?: boolean }) {
  for (const l of listeners) l(event);
}

export function startLive(onResync: () => void) {
  stopLive();
  const shared = typeof BroadcastChannel !== 'undefined' && typeof navigator.locks?.request === 'function';
  if (!shared) {
    open(onResync, null);
    return;
  }
  const ch = new BroadcastChannel(NAME);
  channel = ch;
  ch.onmessage = (e: MessageEvent<Message>) => {
    const m = e.data;
    if (m.kind === 'change') deliver({ change: m.change });
    else if (m.kind === 'opened') deliver({ resync: true });
    else if (m.kind === 'resync') {
      onResync();
      deliver({ resync: true });
    } else if (m.kind === 'state') stream.connected = m.connected;
    else if (m.kind === 'hello' && source) ch.postMessage({ kind: 'state', connected: stream.connected } satisfies Message);
  };
  ch.postMessage({ kind: 'hello' } satisfies Message);
  const abort = new AbortController();
  waiting = abort;
  navigator.locks
    .request(NAME, { signal: abort.signal }, () => {
      // Granted to a start that was stopped since: let the lock go.
      if (channel !== ch) return Promise.resolve();
      // This tab holds the stream until stopLive (or the tab closes).
      waiting = null;
      return new Promise<void>((resolve) => {
        release = resolve;
        open(onResync, ch);
      });
    })
    .catch(() => {
      // Stopped while waiting for the lock.
    });
}

/** Opens the stream in this tab; `ch` passes its events to the others. */
function open(onResync: () => void, ch: BroadcastChannel | null) {
  const send = (m: Message) => ch?.postMessage(m);
  const es = new EventSource('/api/v1/events');
  source = es;
  const connected = (c: boolean) => {
    stream.connected = c;
    send({ kind: 'state', connected: c });
  };
  // A stream starts from "now": whatever changed between a page's listing
  // and the stream's opening would be missed, so every opening tells the
  // pages to list again (in every tab).
  es.onopen = () => {
    connected(true);
    deliver({ resync: true });
    send({ kind: 'opened' });
  };
  es.onerror = () => {
    connected(es.readyState === EventSource.OPEN);
    // Closed for good (the server refused it: signed out, too many
    // streams): start again a little later, letting another tab take the
    // stream meanwhile, instead of leaving every tab without one.
    if (es.readyState === EventSource.CLOSED && source === es) {
      retry = setTimeout(() => startLive(onResync), 5000);
    }
  };
  es.onmessage = (e) => {
    let change: Change;
    try {
      change = JSON.parse(e.data) as Change;
    } catch {
      return;
    }
    deliver({ change });
    send({ kind: 'change', change });
  };
  es.addEventListener('resync', () => {
    onResync();
    deliver({ resync: true });
    send({ kind: 'resync' });
  });
}

export function stopLive() {
  if (retry) clearTimeout(retry);
  retry = null;
  waiting?.abort();
  waiting = null;
  source?.close();
  source = null;
  // Another tab takes the stream over, if one is open.
  release?.();
  release = null;
  channel?.close();
  channel = null;
  stream.connected = false;
}

/** Listens to changes until the returned function is called. */
export function onChange(listener: Listener): () => void {
  listeners.add(listener);
  return () => listeners.delete(listener);
}
