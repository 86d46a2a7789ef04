ALTER TABLE assets DROP COLUMN waitlist_full_at;
