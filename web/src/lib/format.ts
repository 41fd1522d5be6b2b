import type { Item } from './api';

/** What to call an item: its title, name or text, else its kind and id. */
export function itemTitle(item: Item): string {
  const p = item.properties as Record<string, unknown>;
  for (const key of ['title', 'name', 'text']) {
    const v = p[key];
    if (typeof v === 'string' && v.trim()) return v.length > 120 ? `${v.slice(0, 117)}…` : v;
  }
  return `${item.kind} ${item.id}`;
}

export function bytes(n: number): string {
  if (n < 1024) return `${n} B`;
  const units = ['KB', 'MB', 'GB', 'TB'];
  let v = n / 1024;
  let u = 0;
  while (v >= 1024 && u < units.length - 1) {
    v /= 1024;
    u++;
  }
  return `${v.toFixed(v < 10 ? 1 : 0)} ${units[u]}`;
}

export function when(iso: string): string {
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? iso : d.toLocaleString();
}

/** Who a principal is, in words. */
export function principalLabel(p: string): string {
  if (p === 'everyone') return 'Everyone (also people not signed in)';
  if (p === 'authenticated') return 'Every signed-in user';
  if (p.startsWith('user:')) return `User ${p.slice(5)}`;
  if (p.startsWith('group:')) return `Group ${p.slice(6)}`;
  return p;
}

/**
 * A user's display name from their properties, if they gave one, without
 * invisible format and control characters: a right-to-left override in a
 * name would turn the username shown beside it around.
 */
export function displayName(properties: Record<string, unknown> | undefined): string {
  const name = properties?.displayName;
  return typeof name === 'string' ? name.replace(/[\p{Cf}\p{Cc}]/gu, '').trim() : '';
}
