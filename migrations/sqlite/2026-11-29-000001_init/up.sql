-- The embedded backend's schema: the same tables as on PostgreSQL. Instants
-- are RFC 3339 UTC text with six fraction digits, so they compare as text.
CREATE TABLE assets (
    id                      TEXT PRIMARY KEY NOT NULL,
    name                    TEXT NOT NULL,
    status                  TEXT NOT NULL DEFAULT 'AVAILABLE'
                            CHECK (status IN ('AVAILABLE', 'HELD', 'SOLD')),
    hold_expires_at         TEXT,
    current_reservation_id  TEXT,
    version                 INTEGER NOT NULL DEFAULT 1,
    last_event_sequence     INTEGER NOT NULL DEFAULT 0,
    created_at              TEXT NOT NULL,
    updated_at              TEXT NOT NULL,
    CONSTRAINT assets_hold_expiry_iff_held
        CHECK ((status = 'HELD') = (hold_expires_at IS NOT NULL)),
    CONSTRAINT assets_reservation_unless_available
        CHECK ((status = 'AVAILABLE') = (current_reservation_id IS NULL))
) STRICT;

CREATE INDEX assets_held_expiry_idx ON assets (hold_expires_at) WHERE status = 'HELD';

CREATE TABLE reservations (
    id                 TEXT PRIMARY KEY NOT NULL,
    asset_id           TEXT NOT NULL REFERENCES assets (id),
    buyer_id           TEXT NOT NULL,
    status             TEXT NOT NULL
                       CHECK (status IN ('HELD', 'COMMITTED', 'RELEASED', 'EXPIRED')),
    expires_at         TEXT NOT NULL,
    created_at         TEXT NOT NULL,
    committed_at       TEXT,
    released_at        TEXT,
    payment_reference  TEXT,
    CONSTRAINT reservations_committed_has_payment
        CHECK ((status = 'COMMITTED') = (committed_at IS NOT NULL AND payment_reference IS NOT NULL))
) STRICT;

-- At most one HELD reservation per asset.
CREATE UNIQUE INDEX reservations_one_held_per_asset ON reservations (asset_id) WHERE status = 'HELD';
-- A payment reference commits at most one reservation.
CREATE UNIQUE INDEX reservations_payment_reference_key ON reservations (payment_reference);
CREATE INDEX reservations_asset_id_idx ON reservations (asset_id, created_at);

CREATE TABLE refunds (
    id                 TEXT PRIMARY KEY NOT NULL,
    reservation_id     TEXT NOT NULL REFERENCES reservations (id),
    asset_id           TEXT NOT NULL REFERENCES assets (id),
    payment_reference  TEXT NOT NULL,
    reason             TEXT NOT NULL
                       CHECK (reason IN ('HOLD_EXPIRED', 'RESERVATION_RELEASED', 'ALREADY_COMMITTED')),
    status             TEXT NOT NULL DEFAULT 'REQUESTED'
                       CHECK (status IN ('REQUESTED', 'COMPLETED')),
    created_at         TEXT NOT NULL,
    -- Exactly one refund per payment a reservation could not honour.
    CONSTRAINT refunds_one_per_payment UNIQUE (reservation_id, payment_reference)
) STRICT;

CREATE INDEX refunds_status_idx ON refunds (status, id);

CREATE TABLE events (
    id          TEXT PRIMARY KEY NOT NULL,
    asset_id    TEXT NOT NULL REFERENCES assets (id),
    sequence    INTEGER NOT NULL,
    type        TEXT NOT NULL,
    data        TEXT NOT NULL,
    created_at  TEXT NOT NULL,
    CONSTRAINT events_asset_sequence_key UNIQUE (asset_id, sequence)
) STRICT;

CREATE TABLE idempotency_keys (
    scope           TEXT NOT NULL,
    key             TEXT NOT NULL,
    fingerprint     TEXT NOT NULL,
    status_code     INTEGER NOT NULL,
    body            TEXT NOT NULL,
    location        TEXT,
    reservation_id  TEXT NOT NULL REFERENCES reservations (id),
    created_at      TEXT NOT NULL,
    PRIMARY KEY (scope, key)
) STRICT;

CREATE INDEX idempotency_keys_created_at_idx ON idempotency_keys (created_at);
