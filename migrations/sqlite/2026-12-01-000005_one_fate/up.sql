-- Each payment reference has exactly one fate: it bought one reservation,
-- or it is refunded once, whichever reservation it was sent to. References
-- are scoped by the payments client's key name ('-' in open mode).
PRAGMA foreign_keys = OFF;
BEGIN;

-- The scope of the payment a reservation was sold with. Sales recorded
-- before this migration did not record their client: their scope is ''
-- ("unknown client"), which every client's lookup also matches.
ALTER TABLE reservations ADD COLUMN payment_scope TEXT;
UPDATE reservations SET payment_scope = '' WHERE payment_reference IS NOT NULL;
-- Replaced by the payments table: a reference is unique within its scope.
DROP INDEX reservations_payment_reference_key;

-- Refunds name the scope of the payment they give back.
CREATE TABLE refunds_new (
    id                 TEXT PRIMARY KEY NOT NULL,
    reservation_id     TEXT NOT NULL REFERENCES reservations (id),
    asset_id           TEXT NOT NULL REFERENCES assets (id),
    payment_reference  TEXT NOT NULL,
    reason             TEXT NOT NULL
                       CHECK (reason IN ('HOLD_EXPIRED', 'RESERVATION_RELEASED', 'ALREADY_COMMITTED', 'SALE_VOIDED')),
    status             TEXT NOT NULL DEFAULT 'REQUESTED'
                       CHECK (status IN ('REQUESTED', 'COMPLETED')),
    created_at         TEXT NOT NULL,
    completed_at       TEXT,
    payment_scope      TEXT NOT NULL,
    CONSTRAINT refunds_one_per_payment UNIQUE (reservation_id, payment_scope, payment_reference),
    CONSTRAINT refunds_completed_at_iff_completed
        CHECK ((status = 'COMPLETED') = (completed_at IS NOT NULL))
) STRICT;
INSERT INTO refunds_new (id, reservation_id, asset_id, payment_reference, reason, status, created_at,
                         completed_at, payment_scope)
    SELECT id, reservation_id, asset_id, payment_reference, reason, status, created_at, completed_at, ''
      FROM refunds;
DROP TABLE refunds;
ALTER TABLE refunds_new RENAME TO refunds;
CREATE INDEX refunds_status_idx ON refunds (status, id);

-- The fate of each payment reference: the reservation it bought (refund_id
-- NULL; a later void's refund belongs to that same fate), or the refund that
-- gives it back. Written in the transaction that decides it; the primary
-- key is what makes a second fate impossible.
CREATE TABLE payments (
    scope           TEXT NOT NULL,
    reference       TEXT NOT NULL,
    reservation_id  TEXT NOT NULL REFERENCES reservations (id),
    refund_id       TEXT REFERENCES refunds (id),
    created_at      TEXT NOT NULL,
    PRIMARY KEY (scope, reference)
) STRICT, WITHOUT ROWID;

-- History: each reference's earliest fate. A refund of a voided sale's own
-- payment is part of that sale's fate. Existing refunds stay as they are;
-- `holdfast audit` lists older conflicts apart.
INSERT INTO payments (scope, reference, reservation_id, refund_id, created_at)
SELECT '', reference, reservation_id, refund_id, at FROM (
    SELECT reference, reservation_id, refund_id, at,
           row_number() OVER (PARTITION BY reference ORDER BY at, refund_id IS NOT NULL, refund_id) AS n
      FROM (
        SELECT r.payment_reference AS reference, r.id AS reservation_id, NULL AS refund_id,
               r.committed_at AS at
          FROM reservations r WHERE r.payment_reference IS NOT NULL
        UNION ALL
        SELECT f.payment_reference, f.reservation_id, f.id, f.created_at
          FROM refunds f JOIN reservations r ON r.id = f.reservation_id
         WHERE f.reason <> 'SALE_VOIDED' OR r.payment_reference IS NOT f.payment_reference
      )
) WHERE n = 1;

CREATE TEMP TABLE one_fate_dangling (n INTEGER NOT NULL CHECK (n = 0));
INSERT INTO one_fate_dangling SELECT count(*) FROM pragma_foreign_key_check;
DROP TABLE one_fate_dangling;

COMMIT;
PRAGMA foreign_keys = ON;
