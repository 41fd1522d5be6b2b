/**
 * A typed client of Tarn's HTTP API: openapi-fetch over the types that
 * openapi-typescript generates from Tarn's OpenAPI document (`schema.d.ts`,
 * never edited by hand; `scripts/client-typescript.sh generate` remakes it
 * and `make check-client` fails when it is stale).
 *
 *     const tarn = createTarnClient({ baseUrl: 'http://127.0.0.1:7700', token });
 *     const { data, error } = await tarn.GET('/api/v1/items/{id}', { params: { path: { id } } });
 *
 * Authentication: a bearer `token` (from `POST /api/v1/sessions`), or, in a
 * browser page of the server's own origin, the session cookie set by
 * `POST /api/v1/sessions/cookie`; then every request that changes something
 * carries `X-Tarn-CSRF: 1`, as the server requires.
 */
import createClient, { type Client, type Middleware } from 'openapi-fetch';
import type { components, paths } from './schema';

export type { components, paths };

type Schemas = components['schemas'];
export type Item = Schemas['Item'];
export type ItemPage = Schemas['ItemPage'];
export type Grant = Schemas['Grant'];
export type LinkEntry = Schemas['LinkEntry'];
export type Role = Schemas['Role'];
export type Group = Schemas['Group'];
export type Me = Schemas['Me'];
export type User = Schemas['User'];
export type Index = Schemas['Index'];
export type IndexDeclaration = Schemas['IndexDeclaration'];
export type Change = Schemas['Change'];
export type Hit = Schemas['Hit'];
export type Problem = Schemas['Problem'];

export type TarnClient = Client<paths>;

export interface TarnClientOptions {
  /** The server's origin; '' (the default) for the page's own. */
  baseUrl?: string;
  /** A bearer token; without it the browser's session cookie is used. */
  token?: string;
  /** Another fetch (tests, server-side rendering). */
  fetch?: typeof globalThis.fetch;
}

/** The header the server requires on cookie-authenticated writes. */
export const CSRF_HEADER = 'X-Tarn-CSRF';

const SAFE = new Set(['GET', 'HEAD', 'OPTIONS']);

/**
 * What a call answers when the server cannot be reached (the network
 * failed, or the server is down): a `503` problem like the server's own, so
 * that every caller shows it as it shows any refusal instead of failing
 * with an exception no page catches.
 */
function unreachable(safe: boolean): Response {
  const problem: Problem = {
    type: 'unavailable',
    title: 'Service Unavailable',
    status: 503,
    // A change sent without an answer may have been made.
    detail: safe
      ? 'The server cannot be reached; try again in a moment.'
      : 'The server cannot be reached; the change may or may not have been made: look again in a moment.',
  };
  return new Response(JSON.stringify(problem), {
    status: 503,
    headers: { 'content-type': 'application/problem+json', 'retry-after': '5' },
  });
}

/** A client of one server. */
export function createTarnClient(options: TarnClientOptions = {}): TarnClient {
  const send = options.fetch ?? ((request: Request) => globalThis.fetch(request));
  const client = createClient<paths>({
    baseUrl: options.baseUrl ?? '',
    fetch: async (request: Request) => {
      try {
        return await send(request);
      } catch (e) {
        // fetch fails with a TypeError when no answer came; anything else
        // (an abort, a fault of a fetch passed in) is not an outage.
        if (!(e instanceof TypeError) || request.signal?.aborted) throw e;
        console.warn(`${request.method} ${request.url}: no answer`, e);
        return unreachable(SAFE.has(request.method));
      }
    },
    credentials: 'same-origin',
  });
  const auth: Middleware = {
    onRequest({ request }) {
      if (options.token) {
        request.headers.set('Authorization', `Bearer ${options.token}`);
      } else if (!SAFE.has(request.method)) {
        request.headers.set(CSRF_HEADER, '1');
      }
      return request;
    },
  };
  client.use(auth);
  return client;
}

/** What a failed call answered: its problem's detail, or a fallback. */
export function describe(error: unknown, fallback = 'Something went wrong'): string {
  if (error && typeof error === 'object' && 'detail' in error) {
    const detail = (error as { detail: unknown }).detail;
    if (typeof detail === 'string' && detail) return detail;
  }
  return fallback;
}
