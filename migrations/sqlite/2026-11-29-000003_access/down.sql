DROP INDEX reservations_buyer_live_idx;
ALTER TABLE reservations DROP COLUMN owner;
