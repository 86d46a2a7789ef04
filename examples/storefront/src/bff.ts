// The storefront's backend-for-frontend. It holds the storefront API key and
// speaks for every buyer: each browser gets a random buyer id in an HttpOnly
// cookie, and the page calls the JSON endpoints below, never holdfast.
//
//   GET    /api/plates?prefix=AB12          plates, price, status, the buyer's hold, queue place, refund
//   POST   /api/plates/{id}/hold            Idempotency-Key: a fresh one per click, the same on a retry
//   POST   /api/plates/{id}/waitlist        join the plate's waiting list (Idempotency-Key)
//   DELETE /api/plates/{id}/waitlist        leave it
//   POST   /api/plates/{id}/release         give the buyer's hold back (Idempotency-Key)
//   POST   /api/plates/{id}/pay {late}      the payment provider charges it (Idempotency-Key)
//
// POSTs must be application/json and DELETE is not a simple method, so a page
// of another site cannot send them without a preflight, which is not answered.

import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import { randomBytes } from "node:crypto";
import { readFile } from "node:fs/promises";
import { HttpError, listenUrl, readJsonObject, sendFailure, sendJson } from "./http.ts";
import { describeFailure, holdfastClient, requireEnv, sendIdempotent, type Reservation } from "./holdfast.ts";
import type { ActionAnswer, ChargeAnswer, ChargeRequest, PlateView, PlatesAnswer } from "./wire.ts";

const holdfast = holdfastClient(requireEnv("HOLDFAST_URL"), requireEnv("HOLDFAST_STOREFRONT_TOKEN"));
const pspUrl = requireEnv("PSP_URL").replace(/\/+$/, "");
const port = Number(process.env.PORT ?? "8090");
const host = process.env.HOST ?? "127.0.0.1";
const holdSeconds = process.env.STOREFRONT_HOLD_SECONDS ? Number(process.env.STOREFRONT_HOLD_SECONDS) : undefined;

const ASSET_ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;
const PREFIX = /^[A-Za-z0-9._-]{1,64}$/;
const CLIENT_KEY = /^[A-Za-z0-9-]{8,64}$/;
const BUYER_COOKIE = /(?:^|;\s*)sf_buyer=(b-[0-9a-f]{32})(?:;|$)/;

// ---- buyers and keys

function buyerOf(req: IncomingMessage, res: ServerResponse): string {
  const found = BUYER_COOKIE.exec(req.headers.cookie ?? "");
  if (found?.[1] !== undefined) return found[1];
  const buyer = `b-${randomBytes(16).toString("hex")}`;
  res.setHeader("Set-Cookie", `sf_buyer=${buyer}; HttpOnly; SameSite=Lax; Path=/; Max-Age=31536000`);
  return buyer;
}

// The page makes a key per click and sends it again on a retry; prefixed
// with the buyer, no two buyers' keys meet in the storefront's one scope.
function idempotencyKey(req: IncomingMessage, buyer: string): string {
  const key = req.headers["idempotency-key"];
  if (typeof key !== "string" || !CLIENT_KEY.test(key)) {
    throw new HttpError(400, "Send an Idempotency-Key header: 8 to 64 letters, digits or '-'.");
  }
  return `${buyer}.${key}`;
}

// ---- reads

async function plates(buyer: string, prefix: string): Promise<PlatesAnswer> {
  const [assets, reservations] = await Promise.all([
    holdfast.GET("/v1/assets", { params: { query: { id_prefix: prefix === "" ? undefined : prefix, limit: 50 } } }),
    holdfast.GET("/v1/reservations", { params: { query: { buyer_id: buyer, limit: 100 } } }),
  ]);
  if (assets.data === undefined) throw new Error(describeFailure("list plates", assets));
  if (reservations.data === undefined) throw new Error(describeFailure("list the buyer's reservations", reservations));

  // Newest first: the first one seen for a plate is the buyer's latest.
  const latest = new Map<string, Reservation>();
  for (const reservation of reservations.data.items) {
    if (!latest.has(reservation.asset_id)) latest.set(reservation.asset_id, reservation);
  }

  // No call lists a buyer's queue places across plates: ask each held plate
  // that has a queue (a storefront sees its own buyers' entries only).
  const queued = assets.data.items.filter((asset) => asset.status === "HELD" && asset.waitlist_length > 0);
  const positions = new Map<string, number>();
  await Promise.all(
    queued.map(async (asset) => {
      const list = await holdfast.GET("/v1/assets/{asset_id}/waitlist", { params: { path: { asset_id: asset.id } } });
      if (list.data === undefined) throw new Error(describeFailure(`list the waiting list of ${asset.id}`, list));
      const entry = list.data.items.find((item) => item.buyer_id === buyer);
      if (entry !== undefined) positions.set(asset.id, entry.position);
    }),
  );

  const items = assets.data.items.map((asset): PlateView => {
    const reservation = latest.get(asset.id);
    const lastRefund = reservation?.refunds.at(-1);
    return {
      id: asset.id,
      name: asset.name,
      price: asset.price,
      status: asset.status,
      hold_expires_at: asset.hold_expires_at,
      waitlist_length: asset.waitlist_length,
      mine:
        reservation !== undefined && (reservation.status === "HELD" || reservation.status === "COMMITTED")
          ? {
              reservation_id: reservation.reservation_id,
              status: reservation.status,
              expires_at: reservation.expires_at,
              via: reservation.via,
            }
          : null,
      queue_position: positions.get(asset.id) ?? null,
      refund:
        lastRefund === undefined
          ? null
          : { refund_id: lastRefund.refund_id, reason: lastRefund.reason, payment_reference: lastRefund.payment_reference },
    };
  });
  return { items, now: new Date().toISOString() };
}

async function latestReservation(buyer: string, assetId: string): Promise<Reservation | null> {
  const list = await holdfast.GET("/v1/reservations", { params: { query: { buyer_id: buyer, asset_id: assetId, limit: 1 } } });
  if (list.data === undefined) throw new Error(describeFailure("find the buyer's reservation", list));
  return list.data.items[0] ?? null;
}

// ---- actions

async function hold(buyer: string, assetId: string, key: string): Promise<ActionAnswer> {
  const result = await sendIdempotent(() =>
    holdfast.POST("/v1/assets/{asset_id}/reservations", {
      params: { path: { asset_id: assetId }, header: { "Idempotency-Key": key } },
      body: holdSeconds === undefined ? { buyer_id: buyer } : { buyer_id: buyer, hold_seconds: holdSeconds },
    }),
  );
  if (result.data !== undefined) {
    // 200 without Idempotent-Replayed: the buyer already held it (another tab).
    const again = result.response.status === 200 && result.response.headers.get("Idempotent-Replayed") !== "true";
    return { outcome: "held", again, expires_at: result.data.expires_at };
  }
  const problem = result.error;
  if (problem.error_code === "ASSET_UNAVAILABLE") {
    return {
      outcome: "unavailable",
      asset_status: problem.asset_status,
      hold_expires_at: problem.hold_expires_at ?? null,
      waitlist_length: problem.waitlist_length ?? 0,
    };
  }
  if (problem.error_code === "HOLD_LIMIT_REACHED") {
    return { outcome: "refused", message: `You already hold ${problem.limit} plates, the most one buyer may. Pay for or release one first.` };
  }
  if (problem.error_code === "SALE_NOT_OPEN") {
    return { outcome: "refused", message: `This plate goes on sale at ${problem.available_from}.` };
  }
  if (problem.error_code === "ASSET_NOT_FOUND") {
    return { outcome: "refused", message: "There is no such plate." };
  }
  throw new Error(describeFailure("hold", result));
}

async function joinWaitlist(buyer: string, assetId: string, key: string): Promise<ActionAnswer> {
  const result = await sendIdempotent(() =>
    holdfast.POST("/v1/assets/{asset_id}/waitlist", {
      params: { path: { asset_id: assetId }, header: { "Idempotency-Key": key } },
      body: { buyer_id: buyer },
    }),
  );
  if (result.data !== undefined) return { outcome: "queued", position: result.data.position };
  const problem = result.error;
  if (problem.error_code === "WAITLIST_NOT_OPEN") {
    const message =
      problem.asset_status === "AVAILABLE"
        ? "This plate is free again: hold it instead."
        : problem.asset_status === "HELD"
          ? "You hold this plate yourself."
          : "This plate is no longer for sale.";
    return { outcome: "refused", message };
  }
  if (problem.error_code === "WAITLIST_FULL") {
    return { outcome: "refused", message: "The waiting list for this plate is full." };
  }
  if (problem.error_code === "ASSET_NOT_FOUND") {
    return { outcome: "refused", message: "There is no such plate." };
  }
  throw new Error(describeFailure("join the waiting list", result));
}

async function leaveWaitlist(buyer: string, assetId: string): Promise<ActionAnswer> {
  const result = await holdfast.DELETE("/v1/assets/{asset_id}/waitlist/{buyer_id}", {
    params: { path: { asset_id: assetId, buyer_id: buyer } },
  });
  if (result.response.status === 204) return { outcome: "left" };
  if (result.error?.error_code === "WAITLIST_ENTRY_NOT_FOUND") return { outcome: "left" };
  throw new Error(describeFailure("leave the waiting list", result));
}

async function release(buyer: string, assetId: string, key: string): Promise<ActionAnswer> {
  const reservation = await latestReservation(buyer, assetId);
  if (reservation === null) return { outcome: "refused", message: "You do not hold this plate." };
  const result = await sendIdempotent(() =>
    holdfast.POST("/v1/reservations/{reservation_id}/release", {
      params: { path: { reservation_id: reservation.reservation_id }, header: { "Idempotency-Key": key } },
    }),
  );
  if (result.data !== undefined) return { outcome: "released" };
  if (result.error.error_code === "RESERVATION_NOT_ACTIVE") {
    return { outcome: "refused", message: "Your hold of this plate had already ended." };
  }
  throw new Error(describeFailure("release", result));
}

async function pay(buyer: string, assetId: string, key: string, late: boolean): Promise<ActionAnswer> {
  const reservation = await latestReservation(buyer, assetId);
  if (reservation === null) return { outcome: "refused", message: "You do not hold this plate." };
  const request: ChargeRequest = {
    charge_id: key,
    reservation_id: reservation.reservation_id,
    amount: reservation.price,
    late,
  };
  const answer = await fetch(`${pspUrl}/charges`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(request),
  });
  if (!answer.ok) throw new Error(`payment provider: HTTP ${answer.status} ${await answer.text()}`);
  const charged: ChargeAnswer = await answer.json();
  return charged;
}

// ---- the page's files

const files = new Map<string, { type: string; body: Buffer }>();
for (const [path, file, type] of [
  ["/", "index.html", "text/html; charset=utf-8"],
  ["/app.js", "app.js", "text/javascript; charset=utf-8"],
  ["/style.css", "style.css", "text/css; charset=utf-8"],
] as const) {
  files.set(path, { type, body: await readFile(new URL(`../public/${file}`, import.meta.url)) });
}

function sendFile(res: ServerResponse, file: { type: string; body: Buffer }): void {
  res.writeHead(200, {
    "Content-Type": file.type,
    "Content-Length": file.body.length,
    "Cache-Control": "no-cache",
    "Content-Security-Policy": "default-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
  });
  res.end(file.body);
}

// ---- routing

const ACTION = /^\/api\/plates\/([^/]+)\/(hold|waitlist|release|pay)$/;

async function route(req: IncomingMessage, res: ServerResponse): Promise<void> {
  const url = new URL(req.url ?? "/", "http://storefront.invalid");
  const buyer = buyerOf(req, res);

  if (req.method === "GET" || req.method === "HEAD") {
    const file = files.get(url.pathname);
    if (file !== undefined) return sendFile(res, file);
    if (url.pathname === "/favicon.ico") {
      res.writeHead(204).end();
      return;
    }
    if (url.pathname === "/api/plates") {
      const prefix = (url.searchParams.get("prefix") ?? "").trim();
      if (prefix !== "" && !PREFIX.test(prefix)) {
        throw new HttpError(400, "A plate number has only letters, digits, '.', '_' and '-'.");
      }
      return sendJson(res, 200, await plates(buyer, prefix));
    }
    throw new HttpError(404, "Not found.");
  }

  const action = ACTION.exec(url.pathname);
  if (action === null) throw new HttpError(404, "Not found.");
  const assetId = decodeURIComponent(action[1] ?? "");
  if (!ASSET_ID.test(assetId)) throw new HttpError(404, "There is no such plate.");
  const verb = action[2];

  if (req.method === "DELETE" && verb === "waitlist") return sendJson(res, 200, await leaveWaitlist(buyer, assetId));
  if (req.method !== "POST") throw new HttpError(405, "Method not allowed.");
  if (!(req.headers["content-type"] ?? "").startsWith("application/json")) {
    throw new HttpError(415, "Send application/json.");
  }
  const body = await readJsonObject(req);
  const key = idempotencyKey(req, buyer);
  switch (verb) {
    case "hold":
      return sendJson(res, 200, await hold(buyer, assetId, key));
    case "waitlist":
      return sendJson(res, 200, await joinWaitlist(buyer, assetId, key));
    case "release":
      return sendJson(res, 200, await release(buyer, assetId, key));
    case "pay":
      return sendJson(res, 200, await pay(buyer, assetId, key, body.late === true));
  }
  throw new HttpError(404, "Not found.");
}

const server = createServer((req, res) => {
  route(req, res).catch((err: unknown) => sendFailure(res, err, `${req.method} ${req.url}`));
});

server.listen(port, host, () => {
  console.log(`storefront listening on ${listenUrl(host, port)}`);
});
