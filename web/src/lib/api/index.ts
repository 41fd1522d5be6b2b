// The app talks to the server only through the typed client generated from
// the OpenAPI document (clients/typescript). It signs in by cookie, so no
// token is ever held by script.
import { createTarnClient } from '@tarn/client';

export * from '@tarn/client';

export const api = createTarnClient();
