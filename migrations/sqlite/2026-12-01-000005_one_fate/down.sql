PRAGMA foreign_keys = OFF;
BEGIN;
DROP TABLE payments;
CREATE TABLE refunds_old (
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
    CONSTRAINT refunds_one_per_payment UNIQUE (reservation_id, payment_reference),
    CONSTRAINT refunds_completed_at_iff_completed
        CHECK ((status = 'COMPLETED') = (completed_at IS NOT NULL))
) STRICT;
INSERT INTO refunds_old (id, reservation_id, asset_id, payment_reference, reason, status, created_at, completed_at)
    SELECT id, reservation_id, asset_id, payment_reference, reason, status, created_at, completed_at FROM refunds;
DROP TABLE refunds;
ALTER TABLE refunds_old RENAME TO refunds;
CREATE INDEX refunds_status_idx ON refunds (status, id);
ALTER TABLE reservations DROP COLUMN payment_scope;
CREATE UNIQUE INDEX reservations_payment_reference_key ON reservations (payment_reference);
COMMIT;
PRAGMA foreign_keys = ON;
