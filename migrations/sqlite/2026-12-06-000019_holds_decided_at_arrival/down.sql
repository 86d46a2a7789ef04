ALTER TABLE assets DROP COLUMN available_since;
