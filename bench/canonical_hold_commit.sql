-- The SQL ceiling of `hold-commit` (sales per second): the design's hold
-- transaction, then the design's commit of that hold in a second
-- transaction; one pgbench transaction here is the pair (one sale). Run by
-- pgbench with prepared statements (-M prepared) at 64 clients, against a
-- database migrated by `holdfast migrate`.
--
-- The commit: the conditional update of the asset (HELD -> SOLD, guarded by
-- its status, its current reservation and the hold's expiry), the
-- reservation (HELD -> COMMITTED with the payment reference), the payment's
-- fate, the event and the stored answer.
--
-- Each transaction is sent in one round trip (a pipeline, see
-- canonical_hold.sql); the commit waits for the hold's answer, as the
-- payment system's request waits for the buyer's.
--
-- Each client sells its own assets K-<id> (id = n * 100 + client), seeded
-- by bench/run.sh. Variables set by run.sh with -D: n, hold_body and
-- commit_body (the answers, about 300 bytes of JSON each, also the events'
-- data), fingerprint. Ids carry the script's letter and have the service's
-- lengths. Every guard reaches a NOT NULL column: the events' numbers are
-- read back through the asset's guarded state, the payment's reservation
-- through the reservation's, so that a failed guard fails its transaction
-- and pgbench aborts the client.
\set n :n + 1
\set id :n * 100 + :client_id
\startpipeline
BEGIN;
UPDATE assets
   SET status = 'HELD', hold_expires_at = now() + interval '600 seconds',
       current_reservation_id = 'res_K' || lpad(:id::text, 25, '0'),
       version = version + 1, last_event_sequence = last_event_sequence + 1, updated_at = now()
 WHERE id = 'K-' || :id::text AND status = 'AVAILABLE';
INSERT INTO reservations (id, asset_id, buyer_id, status, expires_at, created_at, client)
VALUES ('res_K' || lpad(:id::text, 25, '0'), 'K-' || :id::text, 'b-K' || :id::text, 'HELD',
        now() + interval '600 seconds', now(), '-');
INSERT INTO events (id, asset_id, sequence, type, data, created_at, client)
VALUES ('evt_K' || lpad(:id::text, 24, '0') || 'H', 'K-' || :id::text,
        (SELECT last_event_sequence FROM assets
          WHERE id = 'K-' || :id::text AND current_reservation_id = 'res_K' || lpad(:id::text, 25, '0')),
        'reservation.held', :hold_body, now(), '-');
INSERT INTO idempotency_keys (client, key, fingerprint, status_code, body, location, reservation_id, created_at)
VALUES ('-', 'h-K' || :id::text, :fingerprint, 201, :hold_body,
        '/v1/reservations/res_K' || lpad(:id::text, 25, '0'), 'res_K' || lpad(:id::text, 25, '0'), now());
COMMIT;
\endpipeline
\startpipeline
BEGIN;
UPDATE assets
   SET status = 'SOLD', hold_expires_at = NULL,
       version = version + 1, last_event_sequence = last_event_sequence + 1, updated_at = now()
 WHERE id = 'K-' || :id::text AND status = 'HELD'
   AND current_reservation_id = 'res_K' || lpad(:id::text, 25, '0') AND hold_expires_at > now();
UPDATE reservations
   SET status = 'COMMITTED', committed_at = now(), payment_reference = 'pay-res_K' || lpad(:id::text, 25, '0'),
       payment_client = '-'
 WHERE id = 'res_K' || lpad(:id::text, 25, '0') AND status = 'HELD';
INSERT INTO payments (client, reference, reservation_id, created_at)
VALUES ('-', 'pay-res_K' || lpad(:id::text, 25, '0'),
        (SELECT id FROM reservations
          WHERE id = 'res_K' || lpad(:id::text, 25, '0') AND status = 'COMMITTED'),
        now());
INSERT INTO events (id, asset_id, sequence, type, data, created_at, client)
VALUES ('evt_K' || lpad(:id::text, 24, '0') || 'C', 'K-' || :id::text,
        (SELECT last_event_sequence FROM assets
          WHERE id = 'K-' || :id::text AND status = 'SOLD'
            AND current_reservation_id = 'res_K' || lpad(:id::text, 25, '0')),
        'reservation.committed', :commit_body, now(), '-');
INSERT INTO idempotency_keys (client, key, fingerprint, status_code, body, location, reservation_id, created_at)
VALUES ('-', 'c-res_K' || lpad(:id::text, 25, '0'), :fingerprint, 200, :commit_body,
        NULL, 'res_K' || lpad(:id::text, 25, '0'), now());
COMMIT;
\endpipeline
