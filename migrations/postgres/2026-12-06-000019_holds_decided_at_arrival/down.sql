DROP FUNCTION hold_asset(text, text, text, timestamptz, timestamptz, text, text, text, text, text,
                         integer, text, text, bigint, text, text, text, bigint, text, text, text,
                         timestamptz);
ALTER TABLE assets DROP COLUMN available_since;
