-- A hold in one statement, and so in one round trip with its commit.
--
-- The per-buyer limit counts the buyer's live holds after taking a lock that
-- serialises that buyer's holds, and the count must see every hold that
-- committed before the lock was granted. In READ COMMITTED a statement sees
-- what committed before it began, so the count cannot share a plain
-- statement with the lock; inside a VOLATILE function each statement takes
-- a new snapshot, so `hold_asset` takes the lock and then counts and claims
-- in the statement after it, all in the caller's one statement.
--
-- The lock is a transaction-scoped advisory lock on the (owner, buyer) pair
-- instead of a `buyer_locks` row: nothing to write, no WAL, no index entry.
-- Its key is a 32-bit hash within holdfast's class of advisory locks
-- (1752132708, 'hold' in ASCII): two buyers whose hashes collide only wait
-- for each other's holds, which changes no outcome.
CREATE FUNCTION lock_buyer(owner text, buyer_id text) RETURNS void
LANGUAGE sql VOLATILE
AS $$ SELECT pg_advisory_xact_lock(1752132708, hashtext(owner || chr(31) || buyer_id)) $$;

-- Claims an AVAILABLE asset, unless the buyer is at the limit of live holds
-- (NULL: no limit), and writes the reservation, its event and the stored
-- answer (`body`, also the event's data). A taken asset, or a buyer at the
-- limit, writes nothing. A key used concurrently fails it whole (unique
-- violation). The body names the arguments by position ($1 to $14), so that
-- none is taken for a column of the same name.
CREATE FUNCTION hold_asset(asset_id text, reservation_id text, buyer_id text, at timestamptz,
                           expires_at timestamptz, event_id text, body text, key_scope text,
                           key text, fingerprint text, status_code integer, location text,
                           owner text, max_live_holds bigint)
RETURNS TABLE (claimed bigint, limit_reached boolean)
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
BEGIN
    IF $14 IS NOT NULL THEN
        PERFORM lock_buyer($13, $3);
    END IF;
    RETURN QUERY
    WITH live AS (
        SELECT count(*) AS holds FROM reservations
         WHERE $14 IS NOT NULL AND owner = $13 AND buyer_id = $3 AND status = 'HELD'
           AND expires_at > $4
    ), claim AS (
        UPDATE assets
           SET status = 'HELD', hold_expires_at = $5, current_reservation_id = $2,
               version = version + 1, last_event_sequence = last_event_sequence + 1,
               updated_at = $4
         WHERE id = $1 AND status = 'AVAILABLE' AND (available_from IS NULL OR available_from <= $4)
           AND ($14 IS NULL OR (SELECT holds FROM live) < $14)
     RETURNING id, last_event_sequence
    ), reservation AS (
        INSERT INTO reservations (id, asset_id, buyer_id, status, expires_at, created_at, owner)
        SELECT $2, id, $3, 'HELD', $5, $4, $13 FROM claim
     RETURNING id
    ), event AS (
        INSERT INTO events (id, asset_id, sequence, type, data, created_at, owner)
        SELECT $6, id, last_event_sequence, 'reservation.held', $7, $4, $13 FROM claim
    ), answer AS (
        INSERT INTO idempotency_keys (scope, key, fingerprint, status_code, body, location,
                                      reservation_id, created_at)
        SELECT $8, $9, $10, $11, $7, $12, id, $4 FROM reservation
    )
    SELECT (SELECT count(*) FROM claim),
           coalesce($14 IS NOT NULL AND (SELECT holds FROM live) >= $14, false);
END
$$;

DROP TABLE buyer_locks;
