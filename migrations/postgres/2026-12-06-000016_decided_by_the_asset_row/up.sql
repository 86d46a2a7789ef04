-- Checks that the writing transaction's own conditional write already makes,
-- now verified by the audit instead of on every write:
--
-- - A reservation and an event name their asset: each is written by the
--   transaction that has just changed that asset's row under its guard (and
--   so holds its lock), and assets are never deleted. The foreign keys ran a
--   lookup of the asset on every hold and every sale (about a tenth of the
--   canonical hold's time); audit `reservations_and_events_name_assets`.
-- - At most one HELD reservation per asset: a HELD reservation is inserted
--   only by the transaction that moved its asset to HELD, naming it as the
--   asset's current reservation, under the guard `status = 'AVAILABLE'` (or
--   the lapsed hold it displaces in the same statement). The exclusion
--   constraint searched the index on every hold for what that guard
--   decided; audit `one_held_reservation_per_asset`. The index stays, for
--   the HELD reservations that lists, counts and the janitor read.
ALTER TABLE reservations DROP CONSTRAINT reservations_asset_id_fkey;
ALTER TABLE events DROP CONSTRAINT events_asset_id_fkey;
ALTER TABLE reservations DROP CONSTRAINT reservations_one_held_per_asset;
CREATE INDEX reservations_one_held_per_asset ON reservations (asset_id) WHERE status = 'HELD';
