-- Reads and upkeep whose cost does not grow with history.

-- The status filter of GET /v1/assets in the byte order of ids (the order
-- every page is in): a page of one status reads its own rows only, however
-- many assets of other statuses come first.
CREATE INDEX assets_status_idx ON assets (status, (id COLLATE "C"));

-- Event retention: the purge takes the oldest events first, a range of
-- this index, never a scan and sort of the whole table.
CREATE INDEX events_created_idx ON events (created_at);

-- Asset counts without counting assets. `asset_counts` holds the number of
-- all assets, of SOLD and of WITHDRAWN ones; every change of those numbers
-- appends a row to `asset_count_changes` (triggers below, so that no write
-- path can forget one), and the janitor folds the changes into the counts.
-- Appending, not updating one row, keeps concurrent sales from queueing on
-- a counter. HELD assets are few and read from their own index; AVAILABLE
-- is what remains. The audit compares the counts with the assets.
CREATE TABLE asset_counts (
    status text PRIMARY KEY CHECK (status IN ('ALL', 'SOLD', 'WITHDRAWN')),
    n      bigint NOT NULL
);
CREATE TABLE asset_count_changes (
    status text NOT NULL,
    delta  bigint NOT NULL
);
INSERT INTO asset_counts (status, n)
SELECT s, (SELECT count(*) FROM assets WHERE s = 'ALL' OR status = s)
  FROM (VALUES ('ALL'), ('SOLD'), ('WITHDRAWN')) AS v(s);

CREATE FUNCTION asset_counts_status_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO asset_count_changes (status, delta)
    SELECT OLD.status, -1 WHERE OLD.status IN ('SOLD', 'WITHDRAWN')
    UNION ALL
    SELECT NEW.status, 1 WHERE NEW.status IN ('SOLD', 'WITHDRAWN');
    RETURN NULL;
END $$;
CREATE TRIGGER assets_counted_on_update AFTER UPDATE OF status ON assets
    FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status
          AND (OLD.status IN ('SOLD', 'WITHDRAWN') OR NEW.status IN ('SOLD', 'WITHDRAWN')))
    EXECUTE FUNCTION asset_counts_status_changed();

-- Insertions are counted per statement: an import of thousands of assets
-- appends one row per status.
CREATE FUNCTION asset_counts_added() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO asset_count_changes (status, delta)
    SELECT v.status, v.n
      FROM (SELECT count(*) AS n_all,
                   count(*) FILTER (WHERE status = 'SOLD') AS n_sold,
                   count(*) FILTER (WHERE status = 'WITHDRAWN') AS n_withdrawn
              FROM added) c,
           LATERAL (VALUES ('ALL', c.n_all), ('SOLD', c.n_sold),
                           ('WITHDRAWN', c.n_withdrawn)) AS v(status, n)
     WHERE v.n <> 0;
    RETURN NULL;
END $$;
CREATE TRIGGER assets_counted_on_insert AFTER INSERT ON assets
    REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION asset_counts_added();

CREATE FUNCTION asset_counts_removed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO asset_count_changes (status, delta)
    SELECT 'ALL', -1
    UNION ALL
    SELECT OLD.status, -1 WHERE OLD.status IN ('SOLD', 'WITHDRAWN');
    RETURN NULL;
END $$;
CREATE TRIGGER assets_counted_on_delete AFTER DELETE ON assets
    FOR EACH ROW EXECUTE FUNCTION asset_counts_removed();
