ALTER TABLE reservations RENAME COLUMN client TO owner;
ALTER TABLE reservations RENAME COLUMN payment_client TO payment_scope;
ALTER TABLE refunds RENAME COLUMN payment_client TO payment_scope;
ALTER TABLE payments RENAME COLUMN client TO scope;
ALTER TABLE idempotency_keys RENAME COLUMN client TO scope;
ALTER TABLE events RENAME COLUMN client TO owner;
