-- Sale opening, withdrawal and voided sales.

-- Holds before this instant (database clock) answer SALE_NOT_OPEN.
ALTER TABLE assets ADD COLUMN available_from timestamptz;

-- WITHDRAWN: off sale, no reservation.
ALTER TABLE assets DROP CONSTRAINT assets_status_check;
ALTER TABLE assets ADD CONSTRAINT assets_status_check
    CHECK (status IN ('AVAILABLE', 'HELD', 'SOLD', 'WITHDRAWN'));
ALTER TABLE assets DROP CONSTRAINT assets_reservation_unless_available;
ALTER TABLE assets ADD CONSTRAINT assets_reservation_iff_held_or_sold
    CHECK ((status IN ('HELD', 'SOLD')) = (current_reservation_id IS NOT NULL));

-- VOIDED: a sale undone; it keeps its payment reference (still used) and
-- its commit time.
ALTER TABLE reservations ADD COLUMN voided_at timestamptz;
ALTER TABLE reservations DROP CONSTRAINT reservations_status_check;
ALTER TABLE reservations ADD CONSTRAINT reservations_status_check
    CHECK (status IN ('HELD', 'COMMITTED', 'RELEASED', 'EXPIRED', 'VOIDED'));
ALTER TABLE reservations DROP CONSTRAINT reservations_committed_has_payment;
ALTER TABLE reservations ADD CONSTRAINT reservations_committed_has_payment
    CHECK ((status IN ('COMMITTED', 'VOIDED')) = (committed_at IS NOT NULL AND payment_reference IS NOT NULL));
ALTER TABLE reservations ADD CONSTRAINT reservations_voided_at_iff_voided
    CHECK ((status = 'VOIDED') = (voided_at IS NOT NULL));

ALTER TABLE refunds DROP CONSTRAINT refunds_reason_check;
ALTER TABLE refunds ADD CONSTRAINT refunds_reason_check
    CHECK (reason IN ('HOLD_EXPIRED', 'RESERVATION_RELEASED', 'ALREADY_COMMITTED', 'SALE_VOIDED'));

-- A buyer's reservations, newest first.
CREATE INDEX reservations_buyer_idx ON reservations (buyer_id, id);
