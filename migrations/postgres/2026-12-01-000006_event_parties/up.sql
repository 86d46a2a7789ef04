-- Who an event concerns and who caused it. `owner` is the client whose
-- reservation the event reports (NULL for events about the asset alone):
-- another storefront sees such an event without its reservation, buyer or
-- payment. `actor` is the API key that undid a sale or took an asset off
-- sale, so that the timeline shows who did it.
ALTER TABLE events ADD COLUMN owner text;
ALTER TABLE events ADD COLUMN actor text;
UPDATE events e SET owner = r.owner
  FROM reservations r
 WHERE (e.type LIKE 'reservation.%' OR e.type LIKE 'refund.%')
   AND r.id = e.data::jsonb ->> 'reservation_id';
