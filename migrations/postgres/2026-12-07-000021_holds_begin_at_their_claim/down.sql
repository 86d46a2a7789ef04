ALTER TABLE reservations DROP COLUMN began_at;
