-- The client (API key name) that created each reservation: it alone may see
-- it among storefronts. '-' is the shared caller of open mode.
ALTER TABLE reservations ADD COLUMN owner text NOT NULL DEFAULT '-';

-- Live holds per (client, buyer), for the per-buyer limit.
CREATE INDEX reservations_buyer_live_idx ON reservations (owner, buyer_id) WHERE status = 'HELD';

-- One row per (client, buyer), locked by a hold while it counts the
-- buyer's live holds, so that a burst of one buyer's holds is serialised
-- without serialising anyone else.
CREATE TABLE buyer_locks (
    owner     text NOT NULL,
    buyer_id  text NOT NULL,
    PRIMARY KEY (owner, buyer_id)
);
