DROP TABLE waitlist;
ALTER TABLE events DROP COLUMN via;
ALTER TABLE reservations DROP COLUMN via;
ALTER TABLE assets DROP COLUMN waitlist_seq;
ALTER TABLE assets DROP COLUMN waitlist_length;
