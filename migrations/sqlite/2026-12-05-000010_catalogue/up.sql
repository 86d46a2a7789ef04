-- A catalogue a shop sells from: each asset's price and attributes, the
-- price a reservation was made at and the shop's metadata on it, payments
-- refused for their amount, and answers kept for batches (about no
-- reservation). SQLite cannot change a CHECK or a NOT NULL in place:
-- refunds and idempotency_keys are rebuilt, in one transaction, with
-- foreign keys checked before it commits.
PRAGMA foreign_keys = OFF;
BEGIN IMMEDIATE;

ALTER TABLE assets ADD COLUMN price_amount INTEGER
    CHECK (price_amount BETWEEN 0 AND 1000000000000000);
ALTER TABLE assets ADD COLUMN price_currency TEXT
    CHECK (length(price_currency) = 3 AND price_currency NOT GLOB '*[^A-Z]*');
ALTER TABLE assets ADD COLUMN attributes TEXT NOT NULL DEFAULT '{}';

ALTER TABLE reservations ADD COLUMN price_amount INTEGER;
ALTER TABLE reservations ADD COLUMN price_currency TEXT;
ALTER TABLE reservations ADD COLUMN metadata TEXT;

-- The attributes, one row each, for the list's filters (see the PostgreSQL
-- migration): equality on any key, typed, walked in id order.
CREATE TABLE asset_attributes (
    asset_id  TEXT NOT NULL,
    key       TEXT NOT NULL,
    kind      TEXT NOT NULL CHECK (kind IN ('i', 'b', 's')),
    value     TEXT NOT NULL,
    PRIMARY KEY (key, kind, value, asset_id)
) STRICT, WITHOUT ROWID;
CREATE INDEX asset_attributes_asset_idx ON asset_attributes (asset_id);

-- A price filter that few assets pass reads them through this index (and
-- sorts that page by id) instead of walking the whole catalogue in id order.
CREATE INDEX assets_price_idx ON assets (price_currency, price_amount);

CREATE TABLE refunds_new (
    id                 TEXT PRIMARY KEY NOT NULL,
    reservation_id     TEXT NOT NULL REFERENCES reservations (id),
    asset_id           TEXT NOT NULL REFERENCES assets (id),
    payment_reference  TEXT NOT NULL,
    reason             TEXT NOT NULL
                       CHECK (reason IN ('HOLD_EXPIRED', 'RESERVATION_RELEASED', 'ALREADY_COMMITTED',
                                         'SALE_VOIDED', 'AMOUNT_MISMATCH')),
    status             TEXT NOT NULL DEFAULT 'REQUESTED'
                       CHECK (status IN ('REQUESTED', 'COMPLETED')),
    created_at         TEXT NOT NULL,
    completed_at       TEXT,
    payment_client     TEXT NOT NULL,
    CONSTRAINT refunds_one_per_payment UNIQUE (reservation_id, payment_client, payment_reference),
    CONSTRAINT refunds_completed_at_iff_completed
        CHECK ((status = 'COMPLETED') = (completed_at IS NOT NULL))
) STRICT;
INSERT INTO refunds_new SELECT id, reservation_id, asset_id, payment_reference, reason, status,
                               created_at, completed_at, payment_client FROM refunds;
DROP TABLE refunds;
ALTER TABLE refunds_new RENAME TO refunds;
CREATE INDEX refunds_status_idx ON refunds (status, id);

CREATE TABLE idempotency_keys_new (
    client          TEXT NOT NULL,
    key             TEXT NOT NULL,
    fingerprint     TEXT NOT NULL,
    status_code     INTEGER NOT NULL,
    body            TEXT NOT NULL,
    location        TEXT,
    reservation_id  TEXT REFERENCES reservations (id),
    created_at      TEXT NOT NULL,
    PRIMARY KEY (client, key)
) STRICT;
INSERT INTO idempotency_keys_new SELECT client, key, fingerprint, status_code, body, location,
                                        reservation_id, created_at FROM idempotency_keys;
DROP TABLE idempotency_keys;
ALTER TABLE idempotency_keys_new RENAME TO idempotency_keys;
CREATE INDEX idempotency_keys_created_at_idx ON idempotency_keys (created_at);
-- Deleting a reservation checks these foreign keys.
CREATE INDEX idempotency_keys_reservation_idx ON idempotency_keys (reservation_id);
CREATE INDEX payments_reservation_idx ON payments (reservation_id);

CREATE TEMP TABLE catalogue_dangling (n INTEGER NOT NULL CHECK (n = 0));
INSERT INTO catalogue_dangling SELECT count(*) FROM pragma_foreign_key_check;
DROP TABLE catalogue_dangling;

COMMIT;
PRAGMA foreign_keys = ON;
