PRAGMA foreign_keys = OFF;
BEGIN;
CREATE TABLE events_old (
    id               TEXT PRIMARY KEY NOT NULL,
    asset_id         TEXT NOT NULL REFERENCES assets (id),
    sequence         INTEGER NOT NULL,
    type             TEXT NOT NULL,
    data             TEXT NOT NULL,
    created_at       TEXT NOT NULL,
    attempts         INTEGER NOT NULL DEFAULT 0,
    next_attempt_at  TEXT,
    delivered_at     TEXT,
    dead_at          TEXT,
    last_error       TEXT,
    owner            TEXT,
    actor            TEXT,
    CONSTRAINT events_asset_sequence_key UNIQUE (asset_id, sequence)
) STRICT;
INSERT INTO events_old SELECT id, asset_id, sequence, type, data, created_at, attempts,
       next_attempt_at, delivered_at, dead_at, last_error, owner, actor FROM events ORDER BY position;
DROP TABLE events;
ALTER TABLE events_old RENAME TO events;
CREATE INDEX events_pending_idx ON events (created_at) WHERE delivered_at IS NULL AND dead_at IS NULL;
CREATE INDEX events_dead_idx ON events (created_at) WHERE dead_at IS NOT NULL;
COMMIT;
PRAGMA foreign_keys = ON;
