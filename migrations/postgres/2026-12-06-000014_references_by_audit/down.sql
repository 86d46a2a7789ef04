CREATE INDEX payments_reservation_idx ON payments (reservation_id);
CREATE INDEX idempotency_keys_reservation_idx ON idempotency_keys (reservation_id);
ALTER TABLE payments ADD CONSTRAINT payments_reservation_id_fkey
    FOREIGN KEY (reservation_id) REFERENCES reservations (id);
ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_reservation_id_fkey
    FOREIGN KEY (reservation_id) REFERENCES reservations (id);
