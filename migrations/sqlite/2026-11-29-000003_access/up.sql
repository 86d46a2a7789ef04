-- The client (API key name) that created each reservation; '-' in open mode.
ALTER TABLE reservations ADD COLUMN owner TEXT NOT NULL DEFAULT '-';
CREATE INDEX reservations_buyer_live_idx ON reservations (owner, buyer_id) WHERE status = 'HELD';
