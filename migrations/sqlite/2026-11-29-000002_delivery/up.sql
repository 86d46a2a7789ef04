-- Delivery of events (outbox) and completion of refunds. Writes are
-- serialised, so rowid order is commit order: the feed follows rowid.
ALTER TABLE events ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0;
ALTER TABLE events ADD COLUMN next_attempt_at TEXT;
ALTER TABLE events ADD COLUMN delivered_at TEXT;
ALTER TABLE events ADD COLUMN dead_at TEXT;
ALTER TABLE events ADD COLUMN last_error TEXT;
CREATE INDEX events_pending_idx ON events (created_at) WHERE delivered_at IS NULL AND dead_at IS NULL;
CREATE INDEX events_dead_idx ON events (created_at) WHERE dead_at IS NOT NULL;

ALTER TABLE refunds ADD COLUMN completed_at TEXT;
