// The reservation flow through openapi-fetch, with the types openapi-typescript
// generates from openapi/holdfast.json.
//
// `tsc --noEmit` checks every call, header, body and field read below against
// the generated types, so a document that drifts from the wire fails here
// before anything runs; running it (tsx) then checks the live service agrees.
//
//   HOLDFAST_URL=http://127.0.0.1:8080 HOLDFAST_TOKEN=hf_... npx tsx flow.ts

import createClient, { type Middleware } from "openapi-fetch";
import type { operations, paths } from "./generated/holdfast.d.ts";

type HoldConflict = operations["hold_asset"]["responses"][409]["content"]["application/problem+json"];
type CommitUnavailable = operations["commit_reservation"]["responses"][503]["content"]["application/problem+json"];
type CommitBody = operations["commit_reservation"]["requestBody"]["content"]["application/json"];

class FlowError extends Error {}

function check(condition: boolean, message: string): asserts condition {
  if (!condition) throw new FlowError(message);
}

const show = (value: unknown): string => JSON.stringify(value);

// Every reason a hold is refused with 409, told apart by `error_code` alone.
// A code added to the document later fails to compile here (`never`); one the
// service sends before this client is regenerated is "another conflict".
export function holdConflict(problem: HoldConflict): string {
  const code = problem.error_code;
  switch (code) {
    case "ASSET_UNAVAILABLE":
      return problem.asset_status === "HELD"
        ? `held by another buyer until ${problem.hold_expires_at ?? "?"}`
        : `not for sale: ${problem.asset_status ?? "?"}`;
    case "SALE_NOT_OPEN":
      return `the sale opens at ${problem.available_from ?? "?"}`;
    case "HOLD_LIMIT_REACHED":
      return "the buyer already holds as many assets as allowed";
    case "IDEMPOTENCY_KEY_IN_USE":
      return "an earlier attempt of this hold still runs: retry with the same Idempotency-Key";
    default: {
      const other: never = code;
      return `another conflict: ${String(other)}`;
    }
  }
}

// A 503 from a commit: whether the commit may have happened.
export function commitUnavailable(problem: CommitUnavailable): string {
  switch (problem.write_outcome) {
    case "NOT_APPLIED":
      return "nothing was written: retry";
    case "UNKNOWN":
      return "the commit may have happened: retry with the same Idempotency-Key to learn its answer";
    default: {
      const other: never = problem.write_outcome;
      return `write_outcome ${String(other)}`;
    }
  }
}

const baseUrl = (process.env.HOLDFAST_URL ?? "").replace(/\/+$/, "");
if (baseUrl === "") {
  console.error("client flow: set HOLDFAST_URL, e.g. HOLDFAST_URL=http://127.0.0.1:8080");
  process.exitCode = 2;
} else {
  try {
    console.log(await runFlow(baseUrl));
  } catch (err) {
    const cause = err instanceof Error && err.cause !== undefined ? ` (cause: ${String(err.cause)})` : "";
    console.error(`client flow FAILED against ${baseUrl}: ${err instanceof FlowError ? err.message : String(err) + cause}`);
    if (!(err instanceof FlowError) && err instanceof Error && err.stack) console.error(err.stack);
    process.exitCode = 1;
  }
}

async function runFlow(baseUrl: string): Promise<string> {
  // openapi-fetch parses each body itself; keep the raw text as well, so that
  // a replay can be compared byte for byte with the original.
  const rawBodies = new WeakMap<Response, string>();
  const keepRawBody: Middleware = {
    async onResponse({ response }) {
      rawBodies.set(response, await response.clone().text());
    },
  };
  const token = process.env.HOLDFAST_TOKEN ?? "";
  const client = createClient<paths>({
    baseUrl,
    headers: token === "" ? {} : { Authorization: `Bearer ${token}` },
  });
  client.use(keepRawBody);

  const run = `${Date.now().toString(36)}-${crypto.randomUUID().slice(0, 8)}`;
  const key = (step: string): string => `ci-${step}-${run}`;
  const price = { amount: 250000, currency: "EUR" };

  const commit = async (reservationId: string, idempotencyKey: string, body: CommitBody) => {
    const answer = await client.POST("/v1/reservations/{reservation_id}/commit", {
      params: { path: { reservation_id: reservationId }, header: { "Idempotency-Key": idempotencyKey } },
      body,
    });
    const problem = answer.error;
    if (answer.response.status === 503 && problem?.error_code === "SERVICE_UNAVAILABLE") {
      throw new FlowError(`commit ${reservationId}: 503, ${commitUnavailable(problem)}`);
    }
    return answer;
  };

  // a. An asset with a unique id and a price.
  const assetId = `ci-flow-${run}`;
  const created = await client.POST("/v1/assets", { body: { id: assetId, name: "CI client-flow asset", price } });
  check(created.response.status === 201, `create asset: expected 201, got ${created.response.status} ${show(created.error)}`);
  check(created.data !== undefined, "create asset: no body");
  check(created.data.id === assetId && created.data.status === "AVAILABLE", `create asset: ${show(created.data)}`);
  check(created.data.price?.amount === price.amount, `create asset: price ${show(created.data.price)}`);

  // b. Buyer A holds it.
  const holdA = { path: { asset_id: assetId }, header: { "Idempotency-Key": key("hold-a") } };
  const holdBody = { buyer_id: "ci-buyer-a", hold_seconds: 600 };
  const held = await client.POST("/v1/assets/{asset_id}/reservations", { params: holdA, body: holdBody });
  check(held.response.status === 201, `hold: expected 201, got ${held.response.status} ${show(held.error)}`);
  check(held.data !== undefined, "hold: no body");
  check(held.data.status === "HELD", `hold: status ${show(held.data.status)}, expected "HELD"`);
  check(held.data.price?.amount === price.amount, `hold: price ${show(held.data.price)}`);
  const reservationId = held.data.reservation_id;

  // c. The same request again: a replay, byte for byte.
  const replay = await client.POST("/v1/assets/{asset_id}/reservations", { params: holdA, body: holdBody });
  check(replay.response.status === 200, `replay: expected 200, got ${replay.response.status} ${show(replay.error)}`);
  const replayed = replay.response.headers.get("Idempotent-Replayed");
  check(replayed === "true", `replay: Idempotent-Replayed is ${show(replayed)}, expected "true"`);
  const [heldRaw, replayRaw] = [rawBodies.get(held.response), rawBodies.get(replay.response)];
  check(heldRaw !== undefined && heldRaw === replayRaw, `replay: body differs\n  original: ${heldRaw}\n  replay:   ${replayRaw}`);

  // d. Buyer B meets the hold: 409, told apart by error_code.
  const rival = await client.POST("/v1/assets/{asset_id}/reservations", {
    params: { path: { asset_id: assetId }, header: { "Idempotency-Key": key("hold-b") } },
    body: { buyer_id: "ci-buyer-b" },
  });
  check(rival.response.status === 409, `rival hold: expected 409, got ${rival.response.status} ${show(rival.data ?? rival.error)}`);
  const contentType = rival.response.headers.get("Content-Type") ?? "";
  check(contentType.startsWith("application/problem+json"), `rival hold: Content-Type ${show(contentType)}`);
  const rivalProblem = rival.error;
  check(rivalProblem !== undefined, "rival hold: no problem body");
  check(rivalProblem.error_code === "ASSET_UNAVAILABLE", `rival hold: error_code ${show(rivalProblem.error_code)}, expected "ASSET_UNAVAILABLE"`);
  check(rivalProblem.asset_status === "HELD", `rival hold: asset_status ${show(rivalProblem.asset_status)}, expected "HELD"`);
  check(rivalProblem.hold_expires_at === held.data.expires_at, `rival hold: hold_expires_at ${show(rivalProblem.hold_expires_at)}`);
  const rivalSays = holdConflict(rivalProblem);

  // e. Buyer A again, with a new key: its own hold, unchanged.
  const again = await client.POST("/v1/assets/{asset_id}/reservations", {
    params: { path: { asset_id: assetId }, header: { "Idempotency-Key": key("hold-a-again") } },
    body: { buyer_id: "ci-buyer-a" },
  });
  check(again.response.status === 200, `own hold: expected 200, got ${again.response.status} ${show(again.error)}`);
  check(again.data?.reservation_id === reservationId, `own hold: ${show(again.data)}, expected ${reservationId}`);
  check(again.data.expires_at === held.data.expires_at, `own hold: expires_at moved to ${again.data.expires_at}`);

  // f. Buyer B queues for the asset.
  const joined = await client.POST("/v1/assets/{asset_id}/waitlist", {
    params: { path: { asset_id: assetId }, header: { "Idempotency-Key": key("wait-b") } },
    body: { buyer_id: "ci-buyer-b" },
  });
  check(joined.response.status === 201, `waitlist: expected 201, got ${joined.response.status} ${show(joined.error)}`);
  check(joined.data?.position === 1, `waitlist: ${show(joined.data)}, expected position 1`);

  // g. The payment system commits A's hold; the asset is sold.
  const paymentReference = `pay-${run}`;
  const committed = await commit(reservationId, key("commit"), { payment_reference: paymentReference });
  check(committed.response.status === 200, `commit: expected 200, got ${committed.response.status} ${show(committed.error)}`);
  check(committed.data?.status === "COMMITTED", `commit: ${show(committed.data)}`);
  check(committed.data.payment_reference === paymentReference, `commit: payment_reference ${show(committed.data.payment_reference)}`);
  const asset = await client.GET("/v1/assets/{asset_id}", { params: { path: { asset_id: assetId } } });
  check(asset.data?.status === "SOLD", `read asset: ${asset.response.status} ${show(asset.data ?? asset.error)}, expected SOLD`);

  // h. A payment that arrives after its hold lapsed: 409 HOLD_EXPIRED and a refund.
  const lateAssetId = `ci-flow-late-${run}`;
  const lateAsset = await client.POST("/v1/assets", { body: { id: lateAssetId, name: "CI late commit", price } });
  check(lateAsset.response.status === 201, `create late asset: ${lateAsset.response.status} ${show(lateAsset.error)}`);
  const shortHold = await client.POST("/v1/assets/{asset_id}/reservations", {
    params: { path: { asset_id: lateAssetId }, header: { "Idempotency-Key": key("hold-late") } },
    body: { buyer_id: "ci-buyer-a", hold_seconds: 1 },
  });
  check(shortHold.data !== undefined, `short hold: ${shortHold.response.status} ${show(shortHold.error)}`);
  const lateId = shortHold.data.reservation_id;
  const deadline = Date.now() + 15_000;
  for (;;) {
    const read = await client.GET("/v1/reservations/{reservation_id}", { params: { path: { reservation_id: lateId } } });
    check(read.data !== undefined, `read reservation: ${read.response.status} ${show(read.error)}`);
    if (read.data.status === "EXPIRED") break;
    check(Date.now() < deadline, `short hold: still ${read.data.status} 15 s after a 1 s hold`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  const latePayment = `pay-late-${run}`;
  const late = await commit(lateId, key("commit-late"), { payment_reference: latePayment, amount: price });
  check(late.response.status === 409, `late commit: expected 409, got ${late.response.status} ${show(late.data ?? late.error)}`);
  const lateProblem = late.error;
  check(lateProblem?.error_code === "HOLD_EXPIRED", `late commit: ${show(lateProblem)}, expected error_code "HOLD_EXPIRED"`);
  const refund = lateProblem.refund;
  check(refund !== undefined, `late commit: no refund in ${show(lateProblem)}`);
  check(refund.reason === "HOLD_EXPIRED", `late commit: refund reason ${show(refund.reason)}, expected "HOLD_EXPIRED"`);
  check(refund.payment_reference === latePayment, `late commit: refund of ${show(refund.payment_reference)}`);
  check(lateProblem.reservation?.status === "EXPIRED", `late commit: reservation ${show(lateProblem.reservation)}`);

  return `client flow OK against ${baseUrl}: ${assetId} held (${reservationId}), replay 200 byte-identical, ` +
    `rival 409 (${rivalSays}), own hold 200, waitlist position 1, committed, SOLD; ` +
    `late commit 409 HOLD_EXPIRED, refund ${refund.refund_id} ${refund.reason} ${refund.status}`;
}
