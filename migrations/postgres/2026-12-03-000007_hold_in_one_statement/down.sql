CREATE TABLE buyer_locks (
    owner     text NOT NULL,
    buyer_id  text NOT NULL,
    PRIMARY KEY (owner, buyer_id)
);
DROP FUNCTION hold_asset;
DROP FUNCTION lock_buyer(text, text);
