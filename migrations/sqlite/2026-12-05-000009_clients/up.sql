-- One name for one thing: the authenticated caller's API key name is the
-- `client`, in every table (it was `owner`, `scope` and `payment_scope`).
ALTER TABLE reservations RENAME COLUMN owner TO client;
ALTER TABLE reservations RENAME COLUMN payment_scope TO payment_client;
ALTER TABLE refunds RENAME COLUMN payment_scope TO payment_client;
ALTER TABLE payments RENAME COLUMN scope TO client;
ALTER TABLE idempotency_keys RENAME COLUMN scope TO client;
ALTER TABLE events RENAME COLUMN owner TO client;
