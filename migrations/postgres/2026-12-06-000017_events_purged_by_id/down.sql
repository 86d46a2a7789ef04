CREATE INDEX events_created_idx ON events (created_at);
