-- One index of a buyer's reservations instead of two: the count of a
-- buyer's live holds reads the buyer's ids since the longest hold began
-- (reservation ids are made at their creation), a range of
-- `reservations_buyer_idx` (buyer, id), as on PostgreSQL.
DROP INDEX reservations_buyer_live_idx;
