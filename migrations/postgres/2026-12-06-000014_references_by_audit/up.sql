-- A stored answer and a payment name the reservation they are about. Each
-- is written by the transaction that makes or reads that reservation, and
-- reservations are never deleted: the foreign keys checked, on every hold
-- and every sale, something the writing statement already knows, and
-- their indexes served only the check of a reservation's deletion. The
-- audit verifies both references (`answers_point_at_changes`,
-- `payments_record_their_fate`).
ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_reservation_id_fkey;
ALTER TABLE payments DROP CONSTRAINT payments_reservation_id_fkey;
DROP INDEX idempotency_keys_reservation_idx;
DROP INDEX payments_reservation_idx;
