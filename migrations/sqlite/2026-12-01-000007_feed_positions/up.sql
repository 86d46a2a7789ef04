-- The event feed's cursor is an explicit position that only ever grows.
-- It was the implicit rowid, which SQLite hands out again once the newest
-- rows are deleted (retention purging every event, say), so that a poller
-- resuming from its cursor would miss the events that reused old numbers.
-- Each new event now takes max(last position + 1, the microseconds of the
-- Unix clock): it grows across purges and restarts, and after a restore
-- from a backup it starts above every cursor handed out before. Existing
-- events keep their rowid as position, so issued cursors stay valid.
PRAGMA foreign_keys = OFF;
BEGIN;

CREATE TABLE events_new (
    position         INTEGER PRIMARY KEY,
    id               TEXT NOT NULL UNIQUE,
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
INSERT INTO events_new (position, id, asset_id, sequence, type, data, created_at, attempts,
                        next_attempt_at, delivered_at, dead_at, last_error, owner, actor)
    SELECT rowid, id, asset_id, sequence, type, data, created_at, attempts,
           next_attempt_at, delivered_at, dead_at, last_error, owner, actor
      FROM events;
DROP TABLE events;
ALTER TABLE events_new RENAME TO events;
CREATE INDEX events_pending_idx ON events (position) WHERE delivered_at IS NULL AND dead_at IS NULL;
CREATE INDEX events_dead_idx ON events (position) WHERE dead_at IS NOT NULL;

CREATE TEMP TABLE feed_dangling (n INTEGER NOT NULL CHECK (n = 0));
INSERT INTO feed_dangling SELECT count(*) FROM pragma_foreign_key_check;
DROP TABLE feed_dangling;

COMMIT;
PRAGMA foreign_keys = ON;
