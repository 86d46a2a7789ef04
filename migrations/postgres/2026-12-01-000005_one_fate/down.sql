DROP TABLE payments;
ALTER TABLE refunds DROP CONSTRAINT refunds_one_per_payment;
ALTER TABLE refunds ADD CONSTRAINT refunds_one_per_payment UNIQUE (reservation_id, payment_reference);
ALTER TABLE refunds DROP COLUMN payment_scope;
CREATE UNIQUE INDEX reservations_payment_reference_key ON reservations (payment_reference);
ALTER TABLE reservations DROP CONSTRAINT reservations_payment_scope_with_reference;
ALTER TABLE reservations DROP COLUMN payment_scope;
