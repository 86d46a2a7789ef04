// The reservation flow through the fetch client that orval generates from
// openapi/holdfast.json (`client: 'fetch'`, through transport.ts).
//
// `tsc --noEmit` checks every call, header, body and field read below against
// the generated types, so a document that drifts from the wire fails here
// before anything runs; running it (tsx) then checks the live service agrees.
//
//   HOLDFAST_URL=http://127.0.0.1:8080 HOLDFAST_TOKEN=hf_... npx tsx flow.ts

import {
  commitReservation,
  createAsset,
  getAsset,
  getReservation,
  holdAsset,
  joinWaitlist,
  type CommitReservationRequest,
  type holdAssetResponse409,
  type commitReservationResponse503,
} from "./generated/holdfast";
import { rawBody, transport } from "./transport";

class FlowError extends Error {}

function check(condition: boolean, message: string): asserts condition {
  if (!condition) throw new FlowError(message);
}

const show = (value: unknown): string => JSON.stringify(value);

// Every reason a hold is refused with 409, told apart by `error_code` alone.
// A code added to the document later fails to compile here (`never`); one the
// service sends before this client is regenerated is "another conflict".
export function holdConflict(problem: holdAssetResponse409["data"]): string {
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
export function commitUnavailable(problem: commitReservationResponse503["data"]): string {
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
  transport.baseUrl = baseUrl;
  transport.token = process.env.HOLDFAST_TOKEN ?? "";

  const run = `${Date.now().toString(36)}-${crypto.randomUUID().slice(0, 8)}`;
  const key = (step: string): string => `ci-${step}-${run}`;
  const price = { amount: 250000, currency: "EUR" };

  const commit = async (reservationId: string, idempotencyKey: string, body: CommitReservationRequest) => {
    const answer = await commitReservation(reservationId, body, { "Idempotency-Key": idempotencyKey });
    if (answer.status === 503) {
      throw new FlowError(`commit ${reservationId}: 503, ${commitUnavailable(answer.data)}`);
    }
    return answer;
  };

  // a. An asset with a unique id and a price.
  const assetId = `ci-flow-${run}`;
  const created = await createAsset({ id: assetId, name: "CI client-flow asset", price });
  check(created.status === 201, `create asset: expected 201, got ${created.status} ${show(created.data)}`);
  check(created.data.id === assetId && created.data.status === "AVAILABLE", `create asset: ${show(created.data)}`);
  check(created.data.price?.amount === price.amount, `create asset: price ${show(created.data.price)}`);

  // b. Buyer A holds it.
  const holdKey = { "Idempotency-Key": key("hold-a") };
  const holdBody = { buyer_id: "ci-buyer-a", hold_seconds: 600 };
  const held = await holdAsset(assetId, holdBody, holdKey);
  check(held.status === 201, `hold: expected 201, got ${held.status} ${show(held.data)}`);
  check(held.data.status === "HELD", `hold: status ${show(held.data.status)}, expected "HELD"`);
  check(held.data.price?.amount === price.amount, `hold: price ${show(held.data.price)}`);
  const reservationId = held.data.reservation_id;

  // c. The same request again: a replay, byte for byte.
  const replay = await holdAsset(assetId, holdBody, holdKey);
  check(replay.status === 200, `replay: expected 200, got ${replay.status} ${show(replay.data)}`);
  const replayed = replay.headers.get("Idempotent-Replayed");
  check(replayed === "true", `replay: Idempotent-Replayed is ${show(replayed)}, expected "true"`);
  const [heldRaw, replayRaw] = [rawBody(held.headers), rawBody(replay.headers)];
  check(heldRaw !== undefined && heldRaw === replayRaw, `replay: body differs\n  original: ${heldRaw}\n  replay:   ${replayRaw}`);

  // d. Buyer B meets the hold: 409, told apart by error_code.
  const rival = await holdAsset(assetId, { buyer_id: "ci-buyer-b" }, { "Idempotency-Key": key("hold-b") });
  check(rival.status === 409, `rival hold: expected 409, got ${rival.status} ${show(rival.data)}`);
  const contentType = rival.headers.get("Content-Type") ?? "";
  check(contentType.startsWith("application/problem+json"), `rival hold: Content-Type ${show(contentType)}`);
  const rivalProblem = rival.data;
  check(rivalProblem.error_code === "ASSET_UNAVAILABLE", `rival hold: error_code ${show(rivalProblem.error_code)}, expected "ASSET_UNAVAILABLE"`);
  check(rivalProblem.asset_status === "HELD", `rival hold: asset_status ${show(rivalProblem.asset_status)}, expected "HELD"`);
  check(rivalProblem.hold_expires_at === held.data.expires_at, `rival hold: hold_expires_at ${show(rivalProblem.hold_expires_at)}`);
  const rivalSays = holdConflict(rivalProblem);

  // e. Buyer A again, with a new key: its own hold, unchanged.
  const again = await holdAsset(assetId, { buyer_id: "ci-buyer-a" }, { "Idempotency-Key": key("hold-a-again") });
  check(again.status === 200, `own hold: expected 200, got ${again.status} ${show(again.data)}`);
  check(again.data.reservation_id === reservationId, `own hold: ${show(again.data)}, expected ${reservationId}`);
  check(again.data.expires_at === held.data.expires_at, `own hold: expires_at moved to ${again.data.expires_at}`);

  // f. Buyer B queues for the asset.
  const joined = await joinWaitlist(assetId, { buyer_id: "ci-buyer-b" }, { "Idempotency-Key": key("wait-b") });
  check(joined.status === 201, `waitlist: expected 201, got ${joined.status} ${show(joined.data)}`);
  check(joined.data.position === 1, `waitlist: ${show(joined.data)}, expected position 1`);

  // g. The payment system commits A's hold; the asset is sold.
  const paymentReference = `pay-${run}`;
  const committed = await commit(reservationId, key("commit"), { payment_reference: paymentReference });
  check(committed.status === 200, `commit: expected 200, got ${committed.status} ${show(committed.data)}`);
  check(committed.data.status === "COMMITTED", `commit: ${show(committed.data)}`);
  check(committed.data.payment_reference === paymentReference, `commit: payment_reference ${show(committed.data.payment_reference)}`);
  const asset = await getAsset(assetId);
  check(asset.status === 200 && asset.data.status === "SOLD", `read asset: ${asset.status} ${show(asset.data)}, expected SOLD`);

  // h. A payment that arrives after its hold lapsed: 409 HOLD_EXPIRED and a refund.
  const lateAssetId = `ci-flow-late-${run}`;
  const lateAsset = await createAsset({ id: lateAssetId, name: "CI late commit", price });
  check(lateAsset.status === 201, `create late asset: ${lateAsset.status} ${show(lateAsset.data)}`);
  const shortHold = await holdAsset(lateAssetId, { buyer_id: "ci-buyer-a", hold_seconds: 1 }, { "Idempotency-Key": key("hold-late") });
  check(shortHold.status === 201, `short hold: ${shortHold.status} ${show(shortHold.data)}`);
  const lateId = shortHold.data.reservation_id;
  const deadline = Date.now() + 15_000;
  for (;;) {
    const read = await getReservation(lateId);
    check(read.status === 200, `read reservation: ${read.status} ${show(read.data)}`);
    if (read.data.status === "EXPIRED") break;
    check(Date.now() < deadline, `short hold: still ${read.data.status} 15 s after a 1 s hold`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  const latePayment = `pay-late-${run}`;
  const late = await commit(lateId, key("commit-late"), { payment_reference: latePayment, amount: price });
  check(late.status === 409, `late commit: expected 409, got ${late.status} ${show(late.data)}`);
  const lateProblem = late.data;
  check(lateProblem.error_code === "HOLD_EXPIRED", `late commit: ${show(lateProblem)}, expected error_code "HOLD_EXPIRED"`);
  const refund = lateProblem.refund;
  check(refund !== undefined, `late commit: no refund in ${show(lateProblem)}`);
  check(refund.reason === "HOLD_EXPIRED", `late commit: refund reason ${show(refund.reason)}, expected "HOLD_EXPIRED"`);
  check(refund.payment_reference === latePayment, `late commit: refund of ${show(refund.payment_reference)}`);
  check(lateProblem.reservation?.status === "EXPIRED", `late commit: reservation ${show(lateProblem.reservation)}`);

  return `client flow OK against ${baseUrl}: ${assetId} held (${reservationId}), replay 200 byte-identical, ` +
    `rival 409 (${rivalSays}), own hold 200, waitlist position 1, committed, SOLD; ` +
    `late commit 409 HOLD_EXPIRED, refund ${refund.refund_id} ${refund.reason} ${refund.status}`;
}
