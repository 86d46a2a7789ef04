// The little HTTP plumbing the BFF and the payment provider share.

import type { IncomingMessage, ServerResponse } from "node:http";

export class HttpError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

export function sendJson(res: ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, {
    "Content-Type": "application/json",
    "Content-Length": Buffer.byteLength(text),
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
  });
  res.end(text);
}

const MAX_BODY_BYTES = 16 * 1024;

/** A JSON object body; an empty body reads as {}. */
export async function readJsonObject(req: IncomingMessage): Promise<Record<string, unknown>> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    const buffer = Buffer.isBuffer(chunk) ? chunk : Buffer.from(String(chunk));
    size += buffer.length;
    if (size > MAX_BODY_BYTES) throw new HttpError(413, "The body is too large.");
    chunks.push(buffer);
  }
  const text = Buffer.concat(chunks).toString("utf8");
  if (text.trim() === "") return {};
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    throw new HttpError(400, "The body is not JSON.");
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new HttpError(400, "The body is not a JSON object.");
  }
  return { ...value };
}

/** Answers an HttpError with its status; anything else is logged and answered 502 without details. */
export function sendFailure(res: ServerResponse, err: unknown, label: string): void {
  if (err instanceof HttpError) {
    sendJson(res, err.status, { message: err.message });
    return;
  }
  const message = err instanceof Error ? err.message : String(err);
  console.error(`${label}: ${message}`);
  if (!res.headersSent) sendJson(res, 502, { message: "The plate office is not answering as it should. Try again in a moment." });
  else res.end();
}

export function listenUrl(host: string, port: number): string {
  return `http://${host.includes(":") ? `[${host}]` : host}:${port}`;
}
