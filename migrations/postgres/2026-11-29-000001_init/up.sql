-- Assets are one of a kind. `status` is the stored status; readers apply the
-- expiry rule (a HELD row whose hold_expires_at has passed reads AVAILABLE).
CREATE TABLE assets (
    id                      text PRIMARY KEY,
    name                    text NOT NULL,
    status                  text NOT NULL DEFAULT 'AVAILABLE'
                            CHECK (status IN ('AVAILABLE', 'HELD', 'SOLD')),
    hold_expires_at         timestamptz,
    current_reservation_id  text,
    version                 bigint NOT NULL DEFAULT 1,
    last_event_sequence     bigint NOT NULL DEFAULT 0,
    created_at              timestamptz NOT NULL,
    updated_at              timestamptz NOT NULL,
    CONSTRAINT assets_hold_expiry_iff_held
        CHECK ((status = 'HELD') = (hold_expires_at IS NOT NULL)),
    CONSTRAINT assets_reservation_unless_available
        CHECK ((status = 'AVAILABLE') = (current_reservation_id IS NULL))
);

-- The janitor looks for lapsed holds.
CREATE INDEX assets_held_expiry_idx ON assets (hold_expires_at) WHERE status = 'HELD';

CREATE TABLE reservations (
    id                 text PRIMARY KEY,
    asset_id           text NOT NULL REFERENCES assets (id),
    buyer_id           text NOT NULL,
    status             text NOT NULL
                       CHECK (status IN ('HELD', 'COMMITTED', 'RELEASED', 'EXPIRED')),
    expires_at         timestamptz NOT NULL,
    created_at         timestamptz NOT NULL,
    committed_at       timestamptz,
    released_at        timestamptz,
    payment_reference  text,
    CONSTRAINT reservations_committed_has_payment
        CHECK ((status = 'COMMITTED') = (committed_at IS NOT NULL AND payment_reference IS NOT NULL)),
    -- At most one HELD reservation per asset, checked at the end of each
    -- statement so that one statement may expire the old hold and insert the new.
    CONSTRAINT reservations_one_held_per_asset
        EXCLUDE USING btree (asset_id WITH =) WHERE (status = 'HELD')
        DEFERRABLE INITIALLY IMMEDIATE
);

-- A payment reference commits at most one reservation.
CREATE UNIQUE INDEX reservations_payment_reference_key ON reservations (payment_reference);
CREATE INDEX reservations_asset_id_idx ON reservations (asset_id, created_at);

CREATE TABLE refunds (
    id                 text PRIMARY KEY,
    reservation_id     text NOT NULL REFERENCES reservations (id),
    asset_id           text NOT NULL REFERENCES assets (id),
    payment_reference  text NOT NULL,
    reason             text NOT NULL
                       CHECK (reason IN ('HOLD_EXPIRED', 'RESERVATION_RELEASED', 'ALREADY_COMMITTED')),
    status             text NOT NULL DEFAULT 'REQUESTED'
                       CHECK (status IN ('REQUESTED', 'COMPLETED')),
    created_at         timestamptz NOT NULL,
    -- Exactly one refund per payment a reservation could not honour.
    CONSTRAINT refunds_one_per_payment UNIQUE (reservation_id, payment_reference)
);

CREATE INDEX refunds_status_idx ON refunds (status, id);

-- Transactional outbox: written in the same transaction as the change it reports.
CREATE TABLE events (
    id          text PRIMARY KEY,
    asset_id    text NOT NULL REFERENCES assets (id),
    sequence    bigint NOT NULL,
    type        text NOT NULL,
    data        text NOT NULL,
    created_at  timestamptz NOT NULL,
    CONSTRAINT events_asset_sequence_key UNIQUE (asset_id, sequence)
);

-- Stored responses of requests that changed something, replayed on retry.
CREATE TABLE idempotency_keys (
    scope           text NOT NULL,
    key             text NOT NULL,
    fingerprint     text NOT NULL,
    status_code     integer NOT NULL,
    body            text NOT NULL,
    location        text,
    reservation_id  text NOT NULL REFERENCES reservations (id),
    created_at      timestamptz NOT NULL,
    PRIMARY KEY (scope, key)
);

CREATE INDEX idempotency_keys_created_at_idx ON idempotency_keys (created_at);
