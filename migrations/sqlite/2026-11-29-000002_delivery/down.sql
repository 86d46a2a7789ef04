DROP INDEX events_dead_idx;
DROP INDEX events_pending_idx;
ALTER TABLE events DROP COLUMN last_error;
ALTER TABLE events DROP COLUMN dead_at;
ALTER TABLE events DROP COLUMN delivered_at;
ALTER TABLE events DROP COLUMN next_attempt_at;
ALTER TABLE events DROP COLUMN attempts;
ALTER TABLE refunds DROP COLUMN completed_at;
