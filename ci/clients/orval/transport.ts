// The fetch that orval's generated functions call (orval.config.ts names it):
// it puts the service's base URL before each path, sends the API key, and
// keeps each raw body so that a replay can be compared byte for byte.

export const transport = { baseUrl: "", token: "" };

const rawBodies = new WeakMap<Headers, string>();

/** The body exactly as received, for the answer with these headers. */
export const rawBody = (headers: Headers): string | undefined => rawBodies.get(headers);

export const holdfastFetch = async <T>(path: string, init: RequestInit): Promise<T> => {
  const headers = new Headers(init.headers);
  if (transport.token !== "") headers.set("Authorization", `Bearer ${transport.token}`);
  const response = await fetch(`${transport.baseUrl}${path}`, { ...init, headers });
  const text = await response.text();
  rawBodies.set(response.headers, text);
  const data: unknown = text === "" ? {} : JSON.parse(text);
  // orval declares each operation's answer as the generic T, the union of
  // { data, status, headers } per documented status; this is where the wire
  // becomes that type, as in the fetch code orval generates without a mutator.
  return { data, status: response.status, headers: response.headers } as T;
};
