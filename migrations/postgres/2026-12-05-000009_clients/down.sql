DROP FUNCTION hold_asset(text, text, text, timestamptz, timestamptz, text, text, text, text, text,
                         integer, text, text, bigint, text, text, text);
DROP FUNCTION lock_buyer(text, text);
ALTER TABLE reservations RENAME COLUMN client TO owner;
ALTER TABLE reservations RENAME COLUMN payment_client TO payment_scope;
ALTER TABLE refunds RENAME COLUMN payment_client TO payment_scope;
ALTER TABLE payments RENAME COLUMN client TO scope;
ALTER TABLE idempotency_keys RENAME COLUMN client TO scope;
ALTER TABLE events RENAME COLUMN client TO owner;

CREATE FUNCTION lock_buyer(owner text, buyer_id text) RETURNS void
LANGUAGE sql VOLATILE
AS $$ SELECT pg_advisory_xact_lock(1752132708, hashtext(owner || chr(31) || buyer_id)) $$;

CREATE FUNCTION hold_asset(asset_id text, reservation_id text, buyer_id text,
                           at timestamptz, expires_at timestamptz, event_id text,
                           body text, key_scope text, key text, fingerprint text,
                           status_code integer, location text, owner text,
                           max_live_holds bigint)
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
         WHERE r.owner = $13 AND r.buyer_id = $3 AND r.status = 'HELD' AND r.expires_at > $4;
        IF live >= $14 THEN
            RETURN QUERY SELECT 0::bigint, true;
            RETURN;
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
    INSERT INTO reservations (id, asset_id, buyer_id, status, expires_at, created_at, owner)
    VALUES ($2, $1, $3, 'HELD', $5, $4, $13);
    INSERT INTO events (id, asset_id, sequence, type, data, created_at, owner)
    VALUES ($6, $1, event_sequence, 'reservation.held', $7, $4, $13);
    INSERT INTO idempotency_keys (scope, key, fingerprint, status_code, body, location,
                                  reservation_id, created_at)
    VALUES ($8, $9, $10, $11, $7, $12, $2, $4);
    RETURN QUERY SELECT 1::bigint, false;
END
$$;
