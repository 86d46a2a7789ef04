// A stand-in payment provider. It holds the payments key and nothing else:
// the BFF asks it to charge a reservation, it "takes" the money and confirms
// the payment to holdfast with a commit carrying its payment reference and
// the amount taken. Told to pay late, it waits until the hold has lapsed
// first, and holdfast answers with the refund.
//
//   HOLDFAST_URL=… HOLDFAST_PAYMENTS_TOKEN=hf_… PSP_PORT=8091 npx tsx src/psp.ts
//
// It listens on 127.0.0.1 only: the BFF on the same machine is its one caller.

import { createServer } from "node:http";
import { randomBytes } from "node:crypto";
import { HttpError, listenUrl, readJsonObject, sendFailure, sendJson } from "./http.ts";
import { describeFailure, holdfastClient, requireEnv, sendIdempotent, sleep, type Price, type Refund, type Reservation } from "./holdfast.ts";
import type { ChargeAnswer, ChargeRequest } from "./wire.ts";

const holdfast = holdfastClient(requireEnv("HOLDFAST_URL"), requireEnv("HOLDFAST_PAYMENTS_TOKEN"));
const port = Number(process.env.PSP_PORT ?? "8091");

// A charge id seen again (the BFF retrying) gets the same payment reference,
// and while the first attempt runs or after it succeeded, its answer.
const references = new Map<string, string>();
const charges = new Map<string, Promise<ChargeAnswer>>();

function charge(request: ChargeRequest): Promise<ChargeAnswer> {
  const running = charges.get(request.charge_id);
  if (running !== undefined) return running;
  let reference = references.get(request.charge_id);
  if (reference === undefined) {
    reference = `psp_${randomBytes(12).toString("hex")}`;
    references.set(request.charge_id, reference);
  }
  const answer = runCharge(request, reference);
  charges.set(request.charge_id, answer);
  answer.catch(() => charges.delete(request.charge_id));
  return answer;
}

async function readReservation(reservationId: string): Promise<Reservation | null> {
  const read = await holdfast.GET("/v1/reservations/{reservation_id}", {
    params: { path: { reservation_id: reservationId } },
  });
  if (read.data !== undefined) return read.data;
  if (read.error.error_code === "RESERVATION_NOT_FOUND") return null;
  throw new Error(describeFailure("read reservation", read));
}

async function runCharge(request: ChargeRequest, paymentReference: string): Promise<ChargeAnswer> {
  let reservation = await readReservation(request.reservation_id);
  if (reservation === null || reservation.status !== "HELD") {
    return { outcome: "refused", message: "This hold has ended; nothing was charged." };
  }
  if (request.late) {
    // Wait for holdfast to read the hold as over (its clock decides), at
    // most until a minute past its expiry by ours.
    const deadline = Date.parse(reservation.expires_at) + 60_000;
    while (reservation !== null && reservation.status === "HELD" && Date.now() < deadline) {
      await sleep(250);
      reservation = await readReservation(request.reservation_id);
    }
  }
  return commit(request.reservation_id, paymentReference, request.amount);
}

async function commit(reservationId: string, paymentReference: string, amount: Price | null): Promise<ChargeAnswer> {
  const result = await sendIdempotent(() =>
    holdfast.POST("/v1/reservations/{reservation_id}/commit", {
      params: { path: { reservation_id: reservationId }, header: { "Idempotency-Key": `commit-${paymentReference}` } },
      body: amount === null ? { payment_reference: paymentReference } : { payment_reference: paymentReference, amount },
    }),
  );
  if (result.data !== undefined) return { outcome: "paid", payment_reference: paymentReference };
  const problem = result.error;
  if (
    problem.error_code === "HOLD_EXPIRED" ||
    problem.error_code === "ALREADY_COMMITTED" ||
    problem.error_code === "PAYMENT_AMOUNT_MISMATCH"
  ) {
    return refunded(problem.error_code, problem.refund);
  }
  if (problem.error_code === "RESERVATION_NOT_ACTIVE") {
    // Released: refunded. Voided and paid with this reference: the void settled it.
    return problem.refund === undefined
      ? { outcome: "refused", message: `${problem.error_code}: ${problem.message}` }
      : refunded(problem.error_code, problem.refund);
  }
  if (problem.error_code === "PAYMENT_REFERENCE_USED") {
    return { outcome: "refused", message: `This payment was already used for reservation ${problem.payment.reservation.reservation_id}.` };
  }
  throw new Error(describeFailure("commit", result));
}

function refunded(errorCode: string, refund: Refund): ChargeAnswer {
  return {
    outcome: "refunded",
    error_code: errorCode,
    refund: { refund_id: refund.refund_id, reason: refund.reason, payment_reference: refund.payment_reference },
  };
}

function parseChargeRequest(body: Record<string, unknown>): ChargeRequest {
  const { charge_id, reservation_id, amount, late } = body;
  if (typeof charge_id !== "string" || charge_id === "" || typeof reservation_id !== "string" || typeof late !== "boolean") {
    throw new HttpError(422, "Expected {charge_id, reservation_id, amount, late}.");
  }
  if (amount === null) return { charge_id, reservation_id, amount: null, late };
  if (typeof amount === "object" && amount !== null && "amount" in amount && "currency" in amount) {
    const { amount: minor, currency } = amount;
    if (typeof minor === "number" && typeof currency === "string") {
      return { charge_id, reservation_id, amount: { amount: minor, currency }, late };
    }
  }
  throw new HttpError(422, "amount must be null or {amount, currency}.");
}

const server = createServer((req, res) => {
  void (async () => {
    try {
      if (req.method !== "POST" || req.url !== "/charges") throw new HttpError(404, "Only POST /charges.");
      const request = parseChargeRequest(await readJsonObject(req));
      sendJson(res, 200, await charge(request));
    } catch (err) {
      sendFailure(res, err, "psp");
    }
  })();
});

server.listen(port, "127.0.0.1", () => {
  console.log(`payment provider listening on ${listenUrl("127.0.0.1", port)}`);
});
