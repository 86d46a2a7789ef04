-- The SQL ceiling of `spread-hold`: the design's hold transaction, run by
-- pgbench with prepared statements (-M prepared) at 64 clients, against a
-- database migrated by `holdfast migrate`. In one transaction: the
-- conditional update of the asset (AVAILABLE -> HELD, guarded by its
-- status), the reservation, its event and the stored answer.
--
-- The transaction is sent in one round trip (a pipeline: pgbench sends every
-- statement and the COMMIT without waiting for an answer), the fewest the
-- protocol allows, so that the ceiling is the database's work and not the
-- client's waits: a ceiling sent one statement at a time was beaten by the
-- service on hosts where a round trip costs more than the statement.
--
-- Each client holds its own assets C-<id> (id = n * 100 + client), seeded
-- by bench/run.sh, so that no two clients meet. Variables set by run.sh
-- with -D: n (where the client's count starts), hold_body (the 201's body,
-- about 300 bytes of JSON, also the event's data, as in the service) and
-- fingerprint (64 hex digits). Ids carry the script's letter, so that the
-- scripts share a database, and have the service's lengths (res_ and 26
-- characters). The event takes the number the update gave the asset, read
-- back by the reservation the update set: when the guard fails that read
-- finds nothing, the event's NOT NULL number fails the transaction and
-- pgbench aborts the client, so a failed guard shows as an error, not as a
-- faster transaction.
\set n :n + 1
\set id :n * 100 + :client_id
\startpipeline
BEGIN;
UPDATE assets
   SET status = 'HELD', hold_expires_at = now() + interval '600 seconds',
       current_reservation_id = 'res_C' || lpad(:id::text, 25, '0'),
       version = version + 1, last_event_sequence = last_event_sequence + 1, updated_at = now()
 WHERE id = 'C-' || :id::text AND status = 'AVAILABLE';
INSERT INTO reservations (id, asset_id, buyer_id, status, expires_at, created_at, client)
VALUES ('res_C' || lpad(:id::text, 25, '0'), 'C-' || :id::text, 'b-C' || :id::text, 'HELD',
        now() + interval '600 seconds', now(), '-');
INSERT INTO events (id, asset_id, sequence, type, data, created_at, client)
VALUES ('evt_C' || lpad(:id::text, 24, '0') || 'H', 'C-' || :id::text,
        (SELECT last_event_sequence FROM assets
          WHERE id = 'C-' || :id::text AND current_reservation_id = 'res_C' || lpad(:id::text, 25, '0')),
        'reservation.held', :hold_body, now(), '-');
INSERT INTO idempotency_keys (client, key, fingerprint, status_code, body, location, reservation_id, created_at)
VALUES ('-', 'h-C' || :id::text, :fingerprint, 201, :hold_body,
        '/v1/reservations/res_C' || lpad(:id::text, 25, '0'), 'res_C' || lpad(:id::text, 25, '0'), now());
COMMIT;
\endpipeline
