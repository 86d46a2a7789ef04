// What the page, the BFF and the payment provider send each other (never
// holdfast's own bodies: the page sees only these).

import type { Price, Schemas } from "./holdfast.ts";

/** The buyer's own reservation of a plate, when it is live or bought. */
export interface MineView {
  reservation_id: string;
  status: "HELD" | "COMMITTED";
  expires_at: string;
  /** "waitlist" when it was handed over from the waiting list. */
  via: Schemas["Via"] | null;
}

export interface RefundView {
  refund_id: string;
  reason: Schemas["RefundReason"];
  payment_reference: string;
}

export interface PlateView {
  id: string;
  name: string;
  price: Price | null;
  status: Schemas["AssetStatus"];
  hold_expires_at: string | null;
  waitlist_length: number;
  mine: MineView | null;
  /** The buyer's place in the plate's waiting list (1 is next). */
  queue_position: number | null;
  /** The latest refund of the buyer's latest reservation of this plate. */
  refund: RefundView | null;
}

/** GET /api/plates?prefix= */
export interface PlatesAnswer {
  items: PlateView[];
  /** The BFF's clock, so the page can run countdowns on it. */
  now: string;
}

/** Every POST and DELETE under /api/plates/{id}/ answers 200 with one of these. */
export type ActionAnswer =
  | { outcome: "held"; again: boolean; expires_at: string }
  | { outcome: "unavailable"; asset_status: Schemas["AssetStatus"]; hold_expires_at: string | null; waitlist_length: number }
  | { outcome: "queued"; position: number }
  | { outcome: "left" }
  | { outcome: "released" }
  | ChargeAnswer;

/** Any other status from the BFF: a request to fix (4xx) or a failure upstream (502). */
export interface FailureAnswer {
  message: string;
}

/** POST /charges on the payment provider. */
export interface ChargeRequest {
  /** The same id on a retry: the provider then charges once. */
  charge_id: string;
  reservation_id: string;
  amount: Price | null;
  /** Wait until the hold has lapsed before confirming the payment. */
  late: boolean;
}

export type ChargeAnswer =
  | { outcome: "paid"; payment_reference: string }
  | { outcome: "refunded"; error_code: string; refund: RefundView }
  | { outcome: "refused"; message: string };
