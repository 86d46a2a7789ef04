ALTER TABLE assets RESET (fillfactor);
DROP INDEX assets_shelf_idx;
ALTER TABLE assets DROP COLUMN shelf;
CREATE INDEX assets_held_expiry_idx ON assets (hold_expires_at) WHERE status = 'HELD';
CREATE INDEX assets_status_idx ON assets (status, (id COLLATE "C"));
