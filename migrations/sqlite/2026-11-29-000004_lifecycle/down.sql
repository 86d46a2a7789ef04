-- Back to the tables before sale opening, withdrawal and voided sales.
PRAGMA foreign_keys = OFF;
BEGIN IMMEDIATE;

CREATE TABLE assets_new (
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
INSERT INTO assets_new (id, name, status, hold_expires_at, current_reservation_id, version,
                        last_event_sequence, created_at, updated_at)
    SELECT id, name, status, hold_expires_at, current_reservation_id, version,
           last_event_sequence, created_at, updated_at FROM assets;
DROP TABLE assets;
ALTER TABLE assets_new RENAME TO assets;
CREATE INDEX assets_held_expiry_idx ON assets (hold_expires_at) WHERE status = 'HELD';

CREATE TABLE reservations_new (
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
    owner              TEXT NOT NULL DEFAULT '-',
    CONSTRAINT reservations_committed_has_payment
        CHECK ((status = 'COMMITTED') = (committed_at IS NOT NULL AND payment_reference IS NOT NULL))
) STRICT;
INSERT INTO reservations_new (id, asset_id, buyer_id, status, expires_at, created_at, committed_at,
                              released_at, payment_reference, owner)
    SELECT id, asset_id, buyer_id, status, expires_at, created_at, committed_at,
           released_at, payment_reference, owner FROM reservations;
DROP TABLE reservations;
ALTER TABLE reservations_new RENAME TO reservations;
CREATE UNIQUE INDEX reservations_one_held_per_asset ON reservations (asset_id) WHERE status = 'HELD';
CREATE UNIQUE INDEX reservations_payment_reference_key ON reservations (payment_reference);
CREATE INDEX reservations_asset_id_idx ON reservations (asset_id, created_at);
CREATE INDEX reservations_buyer_live_idx ON reservations (owner, buyer_id) WHERE status = 'HELD';

CREATE TABLE refunds_new (
    id                 TEXT PRIMARY KEY NOT NULL,
    reservation_id     TEXT NOT NULL REFERENCES reservations (id),
    asset_id           TEXT NOT NULL REFERENCES assets (id),
    payment_reference  TEXT NOT NULL,
    reason             TEXT NOT NULL
                       CHECK (reason IN ('HOLD_EXPIRED', 'RESERVATION_RELEASED', 'ALREADY_COMMITTED')),
    status             TEXT NOT NULL DEFAULT 'REQUESTED'
                       CHECK (status IN ('REQUESTED', 'COMPLETED')),
    created_at         TEXT NOT NULL,
    completed_at       TEXT,
    CONSTRAINT refunds_one_per_payment UNIQUE (reservation_id, payment_reference)
) STRICT;
INSERT INTO refunds_new (id, reservation_id, asset_id, payment_reference, reason, status, created_at, completed_at)
    SELECT id, reservation_id, asset_id, payment_reference, reason, status, created_at, completed_at FROM refunds;
DROP TABLE refunds;
ALTER TABLE refunds_new RENAME TO refunds;
CREATE INDEX refunds_status_idx ON refunds (status, id);

-- Nothing may point nowhere: a dangling reference fails this CHECK and
-- with it the migration.
CREATE TEMP TABLE lifecycle_dangling (n INTEGER NOT NULL CHECK (n = 0));
INSERT INTO lifecycle_dangling SELECT count(*) FROM pragma_foreign_key_check;
DROP TABLE lifecycle_dangling;

COMMIT;
PRAGMA foreign_keys = ON;
