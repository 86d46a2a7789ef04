-- Each payment reference has exactly one fate: it bought one reservation,
-- or it is refunded once, whichever reservation it was sent to. References
-- are scoped by the payments client's key name ('-' in open mode).

-- The scope of the payment a reservation was sold with. Sales recorded
-- before this migration did not record their client: their scope is ''
-- ("unknown client"), which every client's lookup also matches.
ALTER TABLE reservations ADD COLUMN payment_scope text;
UPDATE reservations SET payment_scope = '' WHERE payment_reference IS NOT NULL;
ALTER TABLE reservations ADD CONSTRAINT reservations_payment_scope_with_reference
    CHECK ((payment_scope IS NULL) = (payment_reference IS NULL));
-- Replaced by the payments table: a reference is unique within its scope.
DROP INDEX reservations_payment_reference_key;

ALTER TABLE refunds ADD COLUMN payment_scope text NOT NULL DEFAULT '';
ALTER TABLE refunds ALTER COLUMN payment_scope DROP DEFAULT;
ALTER TABLE refunds DROP CONSTRAINT refunds_one_per_payment;
ALTER TABLE refunds ADD CONSTRAINT refunds_one_per_payment
    UNIQUE (reservation_id, payment_scope, payment_reference);

-- The fate of each payment reference: the reservation it bought (refund_id
-- NULL; a later void's refund belongs to that same fate), or the refund that
-- gives it back. Written in the transaction that decides it; the primary
-- key is what makes a second fate impossible.
CREATE TABLE payments (
    scope           text NOT NULL,
    reference       text NOT NULL,
    reservation_id  text NOT NULL REFERENCES reservations (id),
    refund_id       text REFERENCES refunds (id),
    created_at      timestamptz NOT NULL,
    PRIMARY KEY (scope, reference)
);

-- History: each reference's earliest fate. A refund of a voided sale's own
-- payment is part of that sale's fate. Existing refunds stay as they are;
-- `holdfast audit` lists older conflicts apart.
INSERT INTO payments (scope, reference, reservation_id, refund_id, created_at)
SELECT DISTINCT ON (reference) '', reference, reservation_id, refund_id, at
  FROM (
    SELECT r.payment_reference AS reference, r.id AS reservation_id,
           NULL::text AS refund_id, r.committed_at AS at
      FROM reservations r WHERE r.payment_reference IS NOT NULL
    UNION ALL
    SELECT f.payment_reference, f.reservation_id, f.id, f.created_at
      FROM refunds f JOIN reservations r ON r.id = f.reservation_id
     WHERE f.reason <> 'SALE_VOIDED' OR r.payment_reference IS DISTINCT FROM f.payment_reference
  ) fates
 ORDER BY reference, at, refund_id NULLS FIRST;
