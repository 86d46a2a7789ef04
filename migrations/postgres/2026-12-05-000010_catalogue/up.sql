-- A catalogue a shop sells from: each asset's price and attributes, the
-- price a reservation was made at and the shop's metadata on it, payments
-- refused for their amount, and answers kept for batches (about no
-- reservation).
ALTER TABLE assets
    ADD COLUMN price_amount bigint CHECK (price_amount BETWEEN 0 AND 1000000000000000),
    ADD COLUMN price_currency text CHECK (price_currency ~ '^[A-Z]{3}$'),
    ADD COLUMN attributes text NOT NULL DEFAULT '{}',
    ADD CONSTRAINT assets_price_whole CHECK ((price_amount IS NULL) = (price_currency IS NULL));

ALTER TABLE reservations
    ADD COLUMN price_amount bigint,
    ADD COLUMN price_currency text,
    ADD COLUMN metadata text,
    ADD CONSTRAINT reservations_price_whole CHECK ((price_amount IS NULL) = (price_currency IS NULL));

-- The attributes, one row each, for the list's filters: equality on any
-- key, typed (`i` integer, `b` boolean, `s` string), walked in id order
-- from the key and value, so that a filtered page reads about as many rows
-- as it answers whatever the catalogue's size. Kept by the same statements
-- that change `assets.attributes`, in their transaction. No foreign key:
-- the rows are written with their asset, assets are never deleted, and a
-- key check on every row would be a third of an import's time; the audit's
-- `attributes_are_indexed` checks that the rows are exactly the attributes.
CREATE TABLE asset_attributes (
    asset_id  text COLLATE "C" NOT NULL,
    key       text NOT NULL,
    kind      text NOT NULL CHECK (kind IN ('i', 'b', 's')),
    value     text NOT NULL,
    PRIMARY KEY (key, kind, value, asset_id)
);
CREATE INDEX asset_attributes_asset_idx ON asset_attributes (asset_id);

-- A price filter that few assets pass reads them through this index (and
-- sorts that page by id) instead of walking the whole catalogue in id order.
CREATE INDEX assets_price_idx ON assets (price_currency, price_amount);

-- Asset lists go in byte order of the id, whatever the database's
-- collation, so that a prefix is a range of this index.
CREATE INDEX assets_id_bytes_idx ON assets ((id COLLATE "C"));

ALTER TABLE refunds DROP CONSTRAINT refunds_reason_check;
ALTER TABLE refunds ADD CONSTRAINT refunds_reason_check
    CHECK (reason IN ('HOLD_EXPIRED', 'RESERVATION_RELEASED', 'ALREADY_COMMITTED', 'SALE_VOIDED',
                      'AMOUNT_MISMATCH'));

ALTER TABLE idempotency_keys ALTER COLUMN reservation_id DROP NOT NULL;

-- Deleting a reservation checks these foreign keys.
CREATE INDEX idempotency_keys_reservation_idx ON idempotency_keys (reservation_id);
CREATE INDEX payments_reservation_idx ON payments (reservation_id);

-- The hold keeps the price the buyer was shown ($18, $19: the asset's price
-- as the hold's first read saw it; the claim finds the asset taken if the
-- price changed since, and the hold reads again) and the shop's metadata
-- ($20). Otherwise as in migration `clients`.
DROP FUNCTION hold_asset(text, text, text, timestamptz, timestamptz, text, text, text, text, text,
                         integer, text, text, bigint, text, text, text);
CREATE FUNCTION hold_asset(asset_id text, reservation_id text, buyer_id text,
                           at timestamptz, expires_at timestamptz, event_id text,
                           body text, key_client text, key text, fingerprint text,
                           status_code integer, location text, client text,
                           max_live_holds bigint, displaced text, displaced_event_id text,
                           displaced_data text, price_amount bigint, price_currency text,
                           metadata text)
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
       AND a.price_amount IS NOT DISTINCT FROM $18 AND a.price_currency IS NOT DISTINCT FROM $19
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
