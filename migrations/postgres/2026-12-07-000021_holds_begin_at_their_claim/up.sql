-- A hold begins, for a waiting list, when its write claims the asset.
--
-- A join queues only for a hold that began before the join arrived: as the
-- asset stood then, it had a hold to queue for. The reservation's
-- `created_at` is the clock of the hold's first read, which its expiry
-- counts from; the write may come later, after a wait for a connection or
-- for the asset's lock, and a join that arrived during that wait found the
-- asset free (a later attempt of the same join, on another instance, was
-- refused as WAITLIST_NOT_OPEN). `began_at` is the clock once the write
-- holds the asset's row. NULL: the reservation was written before this
-- migration, and began at `created_at`.
ALTER TABLE reservations ADD COLUMN began_at timestamptz;

-- `hold_asset` inserts its reservation after its claim of the asset's row,
-- so the column's default, the clock when the row is inserted, is that
-- moment (the statement's own start precedes the wait for the lock). Its
-- signature and body stay as they are, and instances of the release before
-- keep holding through it while a deploy replaces them. Set apart from the
-- column, so that the rows already written keep NULL and the table is not
-- rewritten. Offers, hand-overs and SQLite give the value explicitly.
ALTER TABLE reservations ALTER COLUMN began_at SET DEFAULT clock_timestamp();
