-- Reads and upkeep whose cost does not grow with history.

-- The status filter of GET /v1/assets in id order: a page of one status
-- reads its own rows only, however many assets of other statuses come first.
CREATE INDEX assets_status_idx ON assets (status, id);

-- Event retention: the purge takes the oldest events first.
CREATE INDEX events_created_idx ON events (created_at);

-- Asset counts without counting assets: the number of all assets, of SOLD
-- and of WITHDRAWN ones, kept by triggers (SQLite has one writer, so they
-- update the counts directly and `asset_count_changes` stays empty; it is
-- PostgreSQL's log of changes the janitor folds in). HELD assets are few
-- and read from their own index; AVAILABLE is what remains.
CREATE TABLE asset_counts (
    status TEXT PRIMARY KEY CHECK (status IN ('ALL', 'SOLD', 'WITHDRAWN')),
    n      INTEGER NOT NULL
);
CREATE TABLE asset_count_changes (
    status TEXT NOT NULL,
    delta  INTEGER NOT NULL
);
INSERT INTO asset_counts (status, n)
SELECT s, (SELECT count(*) FROM assets WHERE s = 'ALL' OR status = s)
  FROM (SELECT 'ALL' AS s UNION ALL SELECT 'SOLD' UNION ALL SELECT 'WITHDRAWN');

CREATE TRIGGER assets_counted_on_update AFTER UPDATE OF status ON assets
    WHEN OLD.status IS NOT NEW.status
         AND (OLD.status IN ('SOLD', 'WITHDRAWN') OR NEW.status IN ('SOLD', 'WITHDRAWN'))
BEGIN
    UPDATE asset_counts SET n = n - 1 WHERE status = OLD.status;
    UPDATE asset_counts SET n = n + 1 WHERE status = NEW.status;
END;

CREATE TRIGGER assets_counted_on_insert AFTER INSERT ON assets
BEGIN
    UPDATE asset_counts SET n = n + 1 WHERE status IN ('ALL', NEW.status);
END;

CREATE TRIGGER assets_counted_on_delete AFTER DELETE ON assets
BEGIN
    UPDATE asset_counts SET n = n - 1 WHERE status IN ('ALL', OLD.status);
END;
