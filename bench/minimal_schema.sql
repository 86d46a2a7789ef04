-- The least schema the design's canonical transactions need
-- (bench/canonical_hold.sql, bench/canonical_hold_commit.sql): each table
-- with its primary key and nothing else. The assets' key decides which
-- asset a write changes, the reservations', events' and stored answers'
-- keys make each write once, the payments' key gives a payment one fate.
-- bench/schema_price.py runs the same transactions on this schema and on
-- holdfast's own: what the second costs more is the price of everything
-- holdfast's schema adds (the other indexes, constraints, foreign keys and
-- triggers, each justified in bench/README.md).
CREATE TABLE assets (
    id                     text PRIMARY KEY,
    name                   text NOT NULL,
    status                 text NOT NULL DEFAULT 'AVAILABLE',
    hold_expires_at        timestamptz,
    current_reservation_id text,
    version                bigint NOT NULL DEFAULT 1,
    last_event_sequence    bigint NOT NULL DEFAULT 0,
    created_at             timestamptz NOT NULL,
    updated_at             timestamptz NOT NULL
);

CREATE TABLE reservations (
    id                text PRIMARY KEY,
    asset_id          text NOT NULL,
    buyer_id          text NOT NULL,
    status            text NOT NULL,
    expires_at        timestamptz NOT NULL,
    created_at        timestamptz NOT NULL,
    committed_at      timestamptz,
    payment_reference text,
    payment_client    text,
    client            text NOT NULL
);

CREATE TABLE events (
    id         text PRIMARY KEY,
    asset_id   text NOT NULL,
    sequence   bigint NOT NULL,
    type       text NOT NULL,
    data       text NOT NULL,
    created_at timestamptz NOT NULL,
    client     text
);

CREATE TABLE idempotency_keys (
    client         text NOT NULL,
    key            text NOT NULL,
    fingerprint    text NOT NULL,
    status_code    integer NOT NULL,
    body           text NOT NULL,
    location       text,
    reservation_id text,
    created_at     timestamptz NOT NULL,
    PRIMARY KEY (client, key)
);

CREATE TABLE payments (
    client         text NOT NULL,
    reference      text NOT NULL,
    reservation_id text NOT NULL,
    created_at     timestamptz NOT NULL,
    PRIMARY KEY (client, reference)
);
