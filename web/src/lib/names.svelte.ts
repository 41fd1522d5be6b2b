// Other users' display names, each asked of the server once a page load,
// when a username is first shown. A display name is its user's own choice,
// so it is shown beside the username, never instead of it.
import { api } from './api';
import { displayName, principalLabel } from './format';
import { session } from './session.svelte';

const names = $state<Record<string, string>>({});
const asked = new Set<string>();

function ask(username: string) {
  asked.add(username);
  api
    .GET('/api/v1/users/{username}', { params: { path: { username } } })
    .then(({ data }) => {
      const name = displayName(data?.properties);
      if (name) names[username] = name;
    })
    // A name is a courtesy: without an answer the username is shown.
    .catch(() => asked.delete(username));
}

/** The display name of `username`, or '' while unknown or when none. */
export function nameOf(username: string): string {
  if (username === session.me?.username) return displayName(session.me.properties);
  if (!asked.has(username)) ask(username);
  return names[username] ?? '';
}

/** "Carol Smith (carol)", or just the username without a display name. */
export function person(username: string): string {
  const name = nameOf(username);
  return name ? `${name} (${username})` : username;
}

/** A principal in words, a user's with the display name they gave, if any. */
export function principalName(p: string): string {
  const name = p.startsWith('user:') ? nameOf(p.slice(5)) : '';
  return name ? `${principalLabel(p)} — ${name}` : principalLabel(p);
}
