-- A hold, an extension and the expiry of a lapsed hold change an asset's
-- row in place: PostgreSQL then writes no index entry at all (a HOT
-- update), provided that no index covers a column the update changes and
-- that the row's page has room. They change the asset's status, expiry and
-- current reservation, so no index of `assets` covers those any more:
--
-- - lapsed holds, and the HELD assets that lists and counts read, are
--   found through their HELD reservations (few, and indexed by
--   `reservations_one_held_per_asset`), each asset then by its primary key;
-- - the status filter of asset lists walks `shelf`, which holds and
--   expiries leave as it is: ON_SALE (AVAILABLE or HELD), SOLD or
--   WITHDRAWN. A page of AVAILABLE assets skips the few HELD ones.
--
-- A sale, a withdrawal and their reversal move an asset to another shelf:
-- those updates still write the asset's index entries.
ALTER TABLE assets ADD COLUMN shelf text NOT NULL GENERATED ALWAYS AS (
    CASE WHEN status IN ('SOLD', 'WITHDRAWN') THEN status ELSE 'ON_SALE' END) STORED;
DROP INDEX assets_status_idx;
DROP INDEX assets_held_expiry_idx;
-- The ids in byte order under the name POSIX (the same order as "C"): a
-- page of one shelf asks for that order, which only this index gives, so
-- that the planner cannot walk every id in "C" order (assets_id_bytes_idx)
-- filtering by shelf through all the SOLD assets that come first.
CREATE INDEX assets_shelf_idx ON assets (shelf, (id COLLATE "POSIX"));
-- Room on each new page for its rows' next versions.
ALTER TABLE assets SET (fillfactor = 80);
