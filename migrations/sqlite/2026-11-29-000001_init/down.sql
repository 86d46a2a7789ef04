DROP TABLE idempotency_keys;
DROP TABLE events;
DROP TABLE refunds;
DROP TABLE reservations;
DROP TABLE assets;
