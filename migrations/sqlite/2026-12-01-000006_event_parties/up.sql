-- Who an event concerns and who caused it. `owner` is the client whose
-- reservation the event reports (NULL for events about the asset alone):
-- another storefront sees such an event without its reservation, buyer or
-- payment. `actor` is the API key that undid a sale or took an asset off
-- sale, so that the timeline shows who did it.
ALTER TABLE events ADD COLUMN owner TEXT;
ALTER TABLE events ADD COLUMN actor TEXT;
UPDATE events SET owner = (
    SELECT r.owner FROM reservations r WHERE r.id = json_extract(events.data, '$.reservation_id'))
 WHERE type LIKE 'reservation.%' OR type LIKE 'refund.%';
