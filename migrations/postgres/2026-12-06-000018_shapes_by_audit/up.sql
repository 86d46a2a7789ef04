-- The shape of an asset's and a reservation's row (a status among its
-- values; an expiry exactly while HELD; a current reservation exactly while
-- HELD or SOLD; a payment exactly on a sale; a price whole and in range),
-- now verified by the audit (`rows_keep_their_shapes`) instead of on every
-- write. Every write of these rows sets the columns of its new status
-- together, in the same statement, from the status its guard requires.
--
-- PostgreSQL reads a table's CHECK expressions from their stored text and
-- prepares them again at every execution of a statement that writes the
-- table: the thirteen of `assets` and `reservations` cost a hold, the
-- statement alone, about a seventh of its time (pgbench, 64 clients,
-- `hold_asset` on this schema beside the same without them, 4 rounds of
-- 5 s, 2026-12-06: 1.15, 1.12 / 1.15 / 1.09 / 1.21). The same checks merged
-- into one per table cost the same: the time is in their expressions, not
-- their number. SQLite compiles its checks into each prepared statement
-- once, and keeps them.
ALTER TABLE assets
    DROP CONSTRAINT assets_status_check,
    DROP CONSTRAINT assets_hold_expiry_iff_held,
    DROP CONSTRAINT assets_reservation_iff_held_or_sold,
    DROP CONSTRAINT assets_price_amount_check,
    DROP CONSTRAINT assets_price_currency_check,
    DROP CONSTRAINT assets_price_whole,
    DROP CONSTRAINT assets_waitlist_length_check;
ALTER TABLE reservations
    DROP CONSTRAINT reservations_status_check,
    DROP CONSTRAINT reservations_via_check,
    DROP CONSTRAINT reservations_committed_has_payment,
    DROP CONSTRAINT reservations_voided_at_iff_voided,
    DROP CONSTRAINT reservations_payment_scope_with_reference,
    DROP CONSTRAINT reservations_price_whole;
