-- The function as migration `holds_decided_at_arrival` made it.
CREATE OR REPLACE FUNCTION hold_asset(asset_id text, reservation_id text, buyer_id text,
                           at timestamptz, expires_at timestamptz, event_id text,
                           body text, key_client text, key text, fingerprint text,
                           status_code integer, location text, client text,
                           max_live_holds bigint, displaced text, displaced_event_id text,
                           displaced_data text, price_amount bigint, price_currency text,
                           metadata text, live_since text, decided_at timestamptz)
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
         WHERE r.buyer_id = $3 AND r.id >= $21 AND r.client = $13 AND r.status || '' = 'HELD'
           AND r.expires_at > $4 AND r.via IS DISTINCT FROM 'offer';
        IF live >= $14 THEN
            RETURN QUERY SELECT 0::bigint, true;
            RETURN;
        END IF;
    END IF;
    IF $15 IS NOT NULL THEN
        UPDATE assets a
           SET status = 'AVAILABLE', hold_expires_at = NULL, current_reservation_id = NULL,
               version = a.version + 1, last_event_sequence = a.last_event_sequence + 1,
               updated_at = $4, available_since = a.hold_expires_at
         WHERE a.id = $1 AND a.status = 'HELD' AND a.current_reservation_id = $15
           AND a.hold_expires_at <= $22 AND a.waitlist_length = 0
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
     WHERE a.id = $1 AND a.status = 'AVAILABLE' AND (a.available_from IS NULL OR a.available_from <= $22)
       AND (a.available_since IS NULL OR a.available_since <= $22)
       AND a.price_amount IS NOT DISTINCT FROM $18 AND a.price_currency IS NOT DISTINCT FROM $19
       AND a.waitlist_length = 0
    RETURNING a.last_event_sequence INTO event_sequence;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 0::bigint, false;
        RETURN;
    END IF;
    INSERT INTO reservations (id, asset_id, buyer_id, status, expires_at, created_at, client,
                              price_amount, price_currency, metadata)
    VALUES ($2, $1, $3, 'HELD', $5, $4, $13, $18, $19, $20);
    INSERT INTO events (id, asset_id, sequence, type, data, created_at, client)
    VALUES ($6, $1, event_sequence, 'reservation.held', $7, $4, $13);
    INSERT INTO idempotency_keys (client, key, fingerprint, status_code, body, location,
                                  reservation_id, created_at)
    VALUES ($8, $9, $10, $11, $7, $12, $2, $4);
    RETURN QUERY SELECT 1::bigint, false;
END
$$;
ALTER TABLE reservations DROP COLUMN began_at;
