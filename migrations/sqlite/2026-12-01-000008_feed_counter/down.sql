DROP TRIGGER events_feed_position;
DROP TABLE feed_position;
