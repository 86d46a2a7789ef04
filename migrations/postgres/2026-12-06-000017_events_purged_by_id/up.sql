-- The retention purge reads delivered events oldest first by their ids: an
-- event's id is made at its creation by the database's clock, so the ids
-- before the cutoff's are a range of the primary key. The index of creation
-- times, an entry written by every event, served only that purge.
DROP INDEX events_created_idx;
