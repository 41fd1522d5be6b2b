// Who is signed in. The session itself is an HttpOnly cookie the page's
// script cannot read: this only holds what /me says.
import { api, type Me } from './api';

export const session = $state<{ me: Me | null; checked: boolean }>({ me: null, checked: false });

/** Asks the server who the cookie belongs to (null when nobody). */
export async function refresh(): Promise<Me | null> {
  const { data } = await api.GET('/api/v1/me');
  session.me = data ?? null;
  session.checked = true;
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

export async function signOut() {
  await api.DELETE('/api/v1/sessions/current');
  session.me = null;
}
