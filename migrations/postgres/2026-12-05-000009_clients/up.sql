-- One name for one thing: the authenticated caller's API key name is the
-- `client`, in every table and function (it was `owner`, `scope` and
-- `payment_scope`).
ALTER TABLE reservations RENAME COLUMN owner TO client;
ALTER TABLE reservations RENAME COLUMN payment_scope TO payment_client;
ALTER TABLE refunds RENAME COLUMN payment_scope TO payment_client;
ALTER TABLE payments RENAME COLUMN scope TO client;
ALTER TABLE idempotency_keys RENAME COLUMN scope TO client;
ALTER TABLE events RENAME COLUMN owner TO client;

DROP FUNCTION hold_asset(text, text, text, timestamptz, timestamptz, text, text, text, text, text,
                         integer, text, text, bigint);
DROP FUNCTION lock_buyer(text, text);

-- The per-buyer limit's lock, on the (client, buyer) pair; see
-- migration `hold_in_one_statement`.
CREATE FUNCTION lock_buyer(client text, buyer_id text) RETURNS void
LANGUAGE sql VOLATILE
AS $$ SELECT pg_advisory_xact_lock(1752132708, hashtext(client || chr(31) || buyer_id)) $$;

-- The hold, whole, in one statement: src/store/tx/hold.rs says what it
-- does and why. The buyer's lock (when there is a limit, $14) is taken
-- first, before the asset's row, by every hold; then the buyer's live holds
-- are counted in a statement of their own (a new snapshot, after the lock);
-- then a lapsed hold the caller read ($15, its expiry event $16, $17) is
-- displaced, when it is still the asset's and still lapsed; then the asset
-- is claimed, and the reservation, its event and the stored answer
-- (`body`, also the event's data) are written. A taken asset, or a buyer at
-- the limit, writes nothing. A key used concurrently fails it whole.
CREATE FUNCTION hold_asset(asset_id text, reservation_id text, buyer_id text,
                           at timestamptz, expires_at timestamptz, event_id text,
                           body text, key_client text, key text, fingerprint text,
                           status_code integer, location text, client text,
                           max_live_holds bigint, displaced text, displaced_event_id text,
                           displaced_data text)
RETURNS TABLE (claimed bigint, limit_reached boolean)
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    live bigint;
    event_sequence bigint;
BEGIN
    IF $14 IS NOT NULL THEN
        PERFORM lock_buyer($13, $3);
        SELECT count(*) INTO live FROM reservations r
         WHERE r.client = $13 AND r.buyer_id = $3 AND r.status = 'HELD' AND r.expires_at > $4;
        IF live >= $14 THEN
            RETURN QUERY SELECT 0::bigint, true;
            RETURN;
        END IF;
    END IF;
    IF $15 IS NOT NULL THEN
        UPDATE assets a
           SET status = 'AVAILABLE', hold_expires_at = NULL, current_reservation_id = NULL,
               version = a.version + 1, last_event_sequence = a.last_event_sequence + 1,
               updated_at = $4
         WHERE a.id = $1 AND a.status = 'HELD' AND a.current_reservation_id = $15
           AND a.hold_expires_at <= $4
        RETURNING a.last_event_sequence INTO event_sequence;
        IF FOUND THEN
            UPDATE reservations r SET status = 'EXPIRED' WHERE r.id = $15 AND r.status = 'HELD';
            INSERT INTO events (id, asset_id, sequence, type, data, created_at, client)
            SELECT $16, $1, event_sequence, 'reservation.expired', $17, $4, r.client
              FROM reservations r WHERE r.id = $15;
        END IF;
    END IF;
    UPDATE assets a
       SET status = 'HELD', hold_expires_at = $5, current_reservation_id = $2,
           version = a.version + 1, last_event_sequence = a.last_event_sequence + 1,
           updated_at = $4
     WHERE a.id = $1 AND a.status = 'AVAILABLE' AND (a.available_from IS NULL OR a.available_from <= $4)
    RETURNING a.last_event_sequence INTO event_sequence;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 0::bigint, false;
        RETURN;
    END IF;
    INSERT INTO reservations (id, asset_id, buyer_id, status, expires_at, created_at, client)
    VALUES ($2, $1, $3, 'HELD', $5, $4, $13);
    INSERT INTO events (id, asset_id, sequence, type, data, created_at, client)
    VALUES ($6, $1, event_sequence, 'reservation.held', $7, $4, $13);
    INSERT INTO idempotency_keys (client, key, fingerprint, status_code, body, location,
                                  reservation_id, created_at)
    VALUES ($8, $9, $10, $11, $7, $12, $2, $4);
    RETURN QUERY SELECT 1::bigint, false;
END
$$;
