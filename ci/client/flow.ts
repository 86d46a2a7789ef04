// The reservation flow through a client generated from openapi/holdfast.json.
//
// `tsc --noEmit` checks every call, header, body and field read below against
// the generated types, so a document that drifts from the wire fails here
// before anything runs; running it (tsx) then checks the live service agrees.
//
//   HOLDFAST_URL=http://127.0.0.1:8080 npx tsx flow.ts

import createClient, { type Middleware } from "openapi-fetch";
import type { paths } from "./generated/holdfast.d.ts";

class FlowError extends Error {}

function check(condition: boolean, message: string): asserts condition {
  if (!condition) throw new FlowError(message);
}

const show = (value: unknown): string => JSON.stringify(value);

const baseUrl = (process.env.HOLDFAST_URL ?? "").replace(/\/+$/, "");
if (baseUrl === "") {
  console.error("client flow: set HOLDFAST_URL, e.g. HOLDFAST_URL=http://127.0.0.1:8080");
  process.exitCode = 2;
} else {
  try {
    console.log(await runFlow(baseUrl));
  } catch (err) {
    if (err instanceof FlowError) {
      console.error(`client flow FAILED against ${baseUrl}: ${err.message}`);
    } else {
      const cause = err instanceof Error && err.cause !== undefined ? ` (cause: ${String(err.cause)})` : "";
      console.error(`client flow FAILED against ${baseUrl}: ${String(err)}${cause}`);
      if (err instanceof Error && err.stack) console.error(err.stack);
    }
    process.exitCode = 1;
  }
}

async function runFlow(baseUrl: string): Promise<string> {
  // openapi-fetch parses each body itself; keep the raw text as well, so the
  // replay can be compared byte for byte with the original.
  const rawBodies = new WeakMap<Response, string>();
  const keepRawBody: Middleware = {
    async onResponse({ response }) {
      rawBodies.set(response, await response.clone().text());
    },
  };
  // With API keys configured, HOLDFAST_TOKEN carries an admin key's token.
  const token = process.env.HOLDFAST_TOKEN ?? "";
  const client = createClient<paths>({
    baseUrl,
    headers: token === "" ? {} : { Authorization: `Bearer ${token}` },
  });
  client.use(keepRawBody);
  const rawBody = (response: Response): string => {
    const text = rawBodies.get(response);
    check(text !== undefined, `no raw body kept for ${response.url}`);
    return text;
  };

  const run = `${Date.now().toString(36)}-${crypto.randomUUID().slice(0, 8)}`;
  const assetId = `ci-flow-${run}`;
  const holdKey = `ci-hold-${run}`;
  const rivalKey = `ci-rival-${run}`;
  const commitKey = `ci-commit-${run}`;
  const paymentReference = `pay-${run}`;

  // 1. Create an asset with a unique id.
  const created = await client.POST("/v1/assets", {
    body: { id: assetId, name: "CI client-flow asset" },
  });
  check(created.response.status === 201, `create asset: expected 201, got ${created.response.status} ${show(created.error)}`);
  check(created.data !== undefined, "create asset: no body");
  check(created.data.id === assetId, `create asset: id ${show(created.data.id)}, expected ${show(assetId)}`);
  check(created.data.status === "AVAILABLE", `create asset: status ${show(created.data.status)}, expected "AVAILABLE"`);

  // 2. Hold it for buyer A.
  const holdParams = {
    path: { asset_id: assetId },
    header: { "Idempotency-Key": holdKey },
  };
  const holdBody = { buyer_id: "ci-buyer-a", hold_seconds: 600 };
  const held = await client.POST("/v1/assets/{asset_id}/reservations", {
    params: holdParams,
    body: holdBody,
  });
  check(held.response.status === 201, `hold: expected 201, got ${held.response.status} ${show(held.error)}`);
  check(held.data !== undefined, "hold: no body");
  check(held.data.status === "HELD", `hold: reservation status ${show(held.data.status)}, expected "HELD"`);
  check(held.data.asset_id === assetId, `hold: asset_id ${show(held.data.asset_id)}, expected ${show(assetId)}`);
  check(held.data.buyer_id === holdBody.buyer_id, `hold: buyer_id ${show(held.data.buyer_id)}`);
  const reservationId = held.data.reservation_id;
  const heldRaw = rawBody(held.response);

  // 3. The same hold again, same key and body: a replay.
  const replay = await client.POST("/v1/assets/{asset_id}/reservations", {
    params: holdParams,
    body: holdBody,
  });
  check(replay.response.status === 200, `replay: expected 200, got ${replay.response.status} ${show(replay.error)}`);
  const replayed = replay.response.headers.get("Idempotent-Replayed");
  check(replayed === "true", `replay: header Idempotent-Replayed is ${show(replayed)}, expected "true"`);
  check(replay.data !== undefined, "replay: no body");
  check(replay.data.reservation_id === reservationId, `replay: reservation_id ${show(replay.data.reservation_id)}, expected ${show(reservationId)}`);
  const replayRaw = rawBody(replay.response);
  check(replayRaw === heldRaw, `replay: body differs from the original\n  original: ${heldRaw}\n  replay:   ${replayRaw}`);

  // 4. Buyer B, with another key, meets the hold: 409, decoded as the typed problem.
  const rival = await client.POST("/v1/assets/{asset_id}/reservations", {
    params: { path: { asset_id: assetId }, header: { "Idempotency-Key": rivalKey } },
    body: { buyer_id: "ci-buyer-b" },
  });
  check(rival.response.status === 409, `rival hold: expected 409, got ${rival.response.status} ${show(rival.data ?? rival.error)}`);
  const contentType = rival.response.headers.get("Content-Type") ?? "";
  check(contentType.startsWith("application/problem+json"), `rival hold: Content-Type ${show(contentType)}, expected application/problem+json`);
  const problem = rival.error;
  check(problem !== undefined, "rival hold: no problem body");
  check(problem.error_code === "ASSET_UNAVAILABLE", `rival hold: error_code ${show(problem.error_code)}, expected "ASSET_UNAVAILABLE"`);
  check(problem.asset_status === "HELD", `rival hold: asset_status ${show(problem.asset_status)}, expected "HELD"`);
  check(problem.status === 409, `rival hold: problem status ${show(problem.status)}, expected 409`);
  check(typeof problem.hold_expires_at === "string" && problem.hold_expires_at === held.data.expires_at,
    `rival hold: hold_expires_at ${show(problem.hold_expires_at)}, expected the hold's expires_at ${show(held.data.expires_at)}`);

  // 5. The payment system commits buyer A's hold.
  const committed = await client.POST("/v1/reservations/{reservation_id}/commit", {
    params: { path: { reservation_id: reservationId }, header: { "Idempotency-Key": commitKey } },
    body: { payment_reference: paymentReference },
  });
  check(committed.response.status === 200, `commit: expected 200, got ${committed.response.status} ${show(committed.error)}`);
  check(committed.data !== undefined, "commit: no body");
  check(committed.data.status === "COMMITTED", `commit: status ${show(committed.data.status)}, expected "COMMITTED"`);
  check(committed.data.payment_reference === paymentReference, `commit: payment_reference ${show(committed.data.payment_reference)}`);

  // 6. The asset now reads SOLD.
  const asset = await client.GET("/v1/assets/{asset_id}", {
    params: { path: { asset_id: assetId } },
  });
  check(asset.response.status === 200, `read asset: expected 200, got ${asset.response.status} ${show(asset.error)}`);
  check(asset.data !== undefined, "read asset: no body");
  check(asset.data.status === "SOLD", `read asset: status ${show(asset.data.status)}, expected "SOLD"`);
  check(asset.data.current_reservation_id === reservationId, `read asset: current_reservation_id ${show(asset.data.current_reservation_id)}, expected ${show(reservationId)}`);

  return `client flow OK against ${baseUrl}: asset ${assetId} created, held (${reservationId}), replay 200 byte-identical, rival 409 ASSET_UNAVAILABLE/HELD, committed, asset SOLD`;
}
