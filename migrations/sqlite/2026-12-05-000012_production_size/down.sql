DROP TRIGGER assets_counted_on_delete;
DROP TRIGGER assets_counted_on_insert;
DROP TRIGGER assets_counted_on_update;
DROP TABLE asset_count_changes;
DROP TABLE asset_counts;
DROP INDEX events_created_idx;
DROP INDEX assets_status_idx;
