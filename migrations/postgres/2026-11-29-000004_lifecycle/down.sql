DROP INDEX reservations_buyer_idx;
ALTER TABLE refunds DROP CONSTRAINT refunds_reason_check;
ALTER TABLE refunds ADD CONSTRAINT refunds_reason_check
    CHECK (reason IN ('HOLD_EXPIRED', 'RESERVATION_RELEASED', 'ALREADY_COMMITTED'));
ALTER TABLE reservations DROP CONSTRAINT reservations_voided_at_iff_voided;
ALTER TABLE reservations DROP CONSTRAINT reservations_committed_has_payment;
ALTER TABLE reservations ADD CONSTRAINT reservations_committed_has_payment
    CHECK ((status = 'COMMITTED') = (committed_at IS NOT NULL AND payment_reference IS NOT NULL));
ALTER TABLE reservations DROP CONSTRAINT reservations_status_check;
ALTER TABLE reservations ADD CONSTRAINT reservations_status_check
    CHECK (status IN ('HELD', 'COMMITTED', 'RELEASED', 'EXPIRED'));
ALTER TABLE reservations DROP COLUMN voided_at;
ALTER TABLE assets DROP CONSTRAINT assets_reservation_iff_held_or_sold;
ALTER TABLE assets ADD CONSTRAINT assets_reservation_unless_available
    CHECK ((status = 'AVAILABLE') = (current_reservation_id IS NULL));
ALTER TABLE assets DROP CONSTRAINT assets_status_check;
ALTER TABLE assets ADD CONSTRAINT assets_status_check CHECK (status IN ('AVAILABLE', 'HELD', 'SOLD'));
ALTER TABLE assets DROP COLUMN available_from;
