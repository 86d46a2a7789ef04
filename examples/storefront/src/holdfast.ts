// The typed holdfast client both processes use, and the retry rule for
// requests that carry an Idempotency-Key.

import createClient from "openapi-fetch";
import type { components, paths } from "../generated/holdfast.d.ts";

export type Schemas = components["schemas"];
export type Asset = Schemas["Asset"];
export type Price = Schemas["Price"];
export type Refund = Schemas["Refund"];
export type Reservation = Schemas["Reservation"];

export type Holdfast = ReturnType<typeof createClient<paths>>;

export function holdfastClient(baseUrl: string, token: string): Holdfast {
  return createClient<paths>({
    baseUrl: baseUrl.replace(/\/+$/, ""),
    headers: { Authorization: `Bearer ${token}` },
  });
}

export function requireEnv(name: string): string {
  const value = process.env[name] ?? "";
  if (value === "") {
    console.error(`set ${name}`);
    process.exit(2);
  }
  return value;
}

export const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

const ATTEMPTS = 4;

// Sends a request whose Idempotency-Key stays the same on every attempt, so
// repeating it is safe: again after a network error, a 503 (the write may or
// may not have happened: the stored answer comes back if it did), or a 409
// IDEMPOTENCY_KEY_IN_USE (the first attempt is still running). Waits
// Retry-After when given (at most 2 s), else 200 ms, 400 ms, 800 ms.
export async function sendIdempotent<T extends { response: Response; error?: { error_code: string } }>(
  send: () => Promise<T>,
): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    let result: T;
    try {
      result = await send();
    } catch (err) {
      if (attempt >= ATTEMPTS) throw err;
      await sleep(200 * 2 ** (attempt - 1));
      continue;
    }
    // IDEMPOTENCY_KEY_IN_USE is in no operation's 409 schema, so the
    // narrowed error_code type cannot name it; compare it as a string.
    const code: string | undefined = result.error?.error_code;
    const retryable = result.response.status === 503 || code === "IDEMPOTENCY_KEY_IN_USE";
    if (!retryable || attempt >= ATTEMPTS) return result;
    const retryAfter = Number(result.response.headers.get("Retry-After"));
    await sleep(retryAfter > 0 ? Math.min(retryAfter, 2) * 1000 : 200 * 2 ** (attempt - 1));
  }
}

export function describeFailure(what: string, result: { response: Response; error?: { error_code: string; message: string } }): string {
  const problem = result.error;
  return problem === undefined
    ? `${what}: HTTP ${result.response.status}`
    : `${what}: HTTP ${result.response.status} ${problem.error_code}: ${problem.message}`;
}
