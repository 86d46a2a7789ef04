CREATE INDEX reservations_buyer_live_idx ON reservations (client, buyer_id) WHERE status = 'HELD';
