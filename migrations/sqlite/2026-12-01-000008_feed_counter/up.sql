-- The event feed's last position, in a row of its own that purging never
-- deletes. Positions were max(last position + 1, the clock in microseconds):
-- once every event was purged, the next one rested on the clock alone, and a
-- clock set back would hand out positions below cursors pollers already
-- hold. Each new event now takes the last position plus one, and the trigger
-- moves the mark up in the event's own transaction (SQLite has one writer),
-- so positions only ever grow, whatever the clock does. A restore raises the
-- restored copy's mark (see `holdfast restore`).
CREATE TABLE feed_position (
    one            INTEGER PRIMARY KEY CHECK (one = 1),
    last_position  INTEGER NOT NULL
) STRICT;
INSERT INTO feed_position (one, last_position)
    SELECT 1, coalesce(max(position), 0) FROM events;
CREATE TRIGGER events_feed_position AFTER INSERT ON events
BEGIN
    UPDATE feed_position SET last_position = NEW.position WHERE NEW.position > last_position;
END;
