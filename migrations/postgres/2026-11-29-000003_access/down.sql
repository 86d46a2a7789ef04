DROP TABLE buyer_locks;
DROP INDEX reservations_buyer_live_idx;
ALTER TABLE reservations DROP COLUMN owner;
