-- Offers (a hold made for a named buyer) and waiting lists: see the
-- PostgreSQL migration.
ALTER TABLE assets ADD COLUMN waitlist_length INTEGER NOT NULL DEFAULT 0
    CHECK (waitlist_length >= 0);
ALTER TABLE assets ADD COLUMN waitlist_seq INTEGER NOT NULL DEFAULT 0;
ALTER TABLE reservations ADD COLUMN via TEXT CHECK (via IN ('offer', 'waitlist'));
ALTER TABLE events ADD COLUMN via TEXT;

CREATE TABLE waitlist (
    asset_id   TEXT NOT NULL REFERENCES assets (id),
    client     TEXT NOT NULL,
    buyer_id   TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    joined_at  TEXT NOT NULL,
    PRIMARY KEY (asset_id, client, buyer_id),
    CONSTRAINT waitlist_one_place UNIQUE (asset_id, seq)
) STRICT, WITHOUT ROWID;
