// Who is signed in. The session itself is an HttpOnly cookie the page's
// script cannot read: this only holds what /me says.
import { api, describe, type Me } from './api';

/**
 * `problem`: why a question about the session got no answer (the server
 * could not be reached, or failed); who is signed in is then left as it
 * was. The app shows it until the next page, or until /me answers.
 */
export const session = $state<{ me: Me | null; checked: boolean; problem: string | null }>({
  me: null,
  checked: false,
  problem: null,
});

/** Asks the server who the cookie belongs to (null when nobody). */
export async function refresh(): Promise<Me | null> {
  const { data, error, response } = await api.GET('/api/v1/me');
  if (data || response.status === 401) {
    session.me = data ?? null;
    session.checked = true;
    session.problem = null;
  } else {
    session.problem = describe(error);
  }
  return session.me;
}

export async function signIn(username: string, password: string): Promise<string | null> {
  const { error } = await api.POST('/api/v1/sessions/cookie', {
    params: { header: { 'X-Tarn-CSRF': '1' } },
    body: { username, password },
  });
  if (error) return error.detail;
  await refresh();
  return null;
}

/** Ends the session; answers why it could not (the session goes on). */
export async function signOut(): Promise<string | null> {
  const { error, response } = await api.DELETE('/api/v1/sessions/current');
  // A session the server no longer knows is as good as ended.
  if (error && response.status !== 401) return describe(error);
  session.me = null;
  return null;
}
