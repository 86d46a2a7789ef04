DROP INDEX reservations_one_held_per_asset;
ALTER TABLE reservations ADD CONSTRAINT reservations_one_held_per_asset
    EXCLUDE USING btree (asset_id WITH =) WHERE (status = 'HELD') DEFERRABLE INITIALLY IMMEDIATE;
ALTER TABLE events ADD CONSTRAINT events_asset_id_fkey FOREIGN KEY (asset_id) REFERENCES assets (id);
ALTER TABLE reservations ADD CONSTRAINT reservations_asset_id_fkey FOREIGN KEY (asset_id) REFERENCES assets (id);
