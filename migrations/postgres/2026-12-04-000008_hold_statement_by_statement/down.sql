-- `hold_asset` as one statement of data-modifying CTEs again.
CREATE OR REPLACE FUNCTION hold_asset(asset_id text, reservation_id text, buyer_id text, at timestamptz,
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
