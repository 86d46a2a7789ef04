-- Delivery of events (outbox) and completion of refunds.

-- Global order for the feed: the writing transaction's id, then insertion
-- order. Only events whose transaction id is below the oldest running
-- transaction are served, so a reader never skips one that commits late.
ALTER TABLE events ADD COLUMN position bigint GENERATED ALWAYS AS IDENTITY;
ALTER TABLE events ADD COLUMN txid xid8 NOT NULL DEFAULT pg_current_xact_id();
CREATE INDEX events_feed_idx ON events (txid, position);

-- Webhook delivery state: due when next_attempt_at is null or past.
ALTER TABLE events ADD COLUMN attempts integer NOT NULL DEFAULT 0;
ALTER TABLE events ADD COLUMN next_attempt_at timestamptz;
ALTER TABLE events ADD COLUMN delivered_at timestamptz;
ALTER TABLE events ADD COLUMN dead_at timestamptz;
ALTER TABLE events ADD COLUMN last_error text;
CREATE INDEX events_pending_idx ON events (position) WHERE delivered_at IS NULL AND dead_at IS NULL;
CREATE INDEX events_dead_idx ON events (position) WHERE dead_at IS NOT NULL;

ALTER TABLE refunds ADD COLUMN completed_at timestamptz;
ALTER TABLE refunds ADD CONSTRAINT refunds_completed_at_iff_completed
    CHECK ((status = 'COMPLETED') = (completed_at IS NOT NULL));

