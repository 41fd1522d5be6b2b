// A small client-side router over the History API. The server answers the
// app's page at every path outside /api, so any URL can be reloaded or
// shared.

export interface Location {
  path: string;
  query: URLSearchParams;
}

export const location = $state<Location>({
  path: window.location.pathname,
  query: new URLSearchParams(window.location.search),
});

function sync() {
  location.path = window.location.pathname;
  location.query = new URLSearchParams(window.location.search);
}

/** Goes to an app URL (path and query), adding to history unless `replace`. */
export function go(href: string, replace = false) {
  const here = window.location.pathname + window.location.search;
  if (href === here) return;
  if (replace) history.replaceState(null, '', href);
  else history.pushState(null, '', href);
  sync();
}

window.addEventListener('popstate', sync);

/** Lets plain links of the app navigate without reloading the page. */
export function interceptLinks(root: HTMLElement) {
  root.addEventListener('click', (e) => {
    if (e.defaultPrevented || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
    const a = (e.target as Element).closest('a');
    if (!a || a.target || a.hasAttribute('download')) return;
    const url = new URL(a.href, window.location.href);
    if (url.origin !== window.location.origin || url.pathname.startsWith('/api/')) return;
    e.preventDefault();
    go(url.pathname + url.search);
  });
}

/** Matches a pattern such as `/items/:id`; the parameters, or null. */
export function match(pattern: string, path: string): Record<string, string> | null {
  if (pattern === '/') return path === '/' ? {} : null;
  const p = pattern.split('/');
  const s = path.replace(/\/+$/, '').split('/');
  if (p.length !== s.length) return null;
  const params: Record<string, string> = {};
  for (let i = 0; i < p.length; i++) {
    if (p[i].startsWith(':')) {
      if (!s[i]) return null;
      params[p[i].slice(1)] = decodeURIComponent(s[i]);
    } else if (p[i] !== s[i]) return null;
  }
  return params;
}
