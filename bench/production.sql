-- A holdfast database at production size, consistent (`holdfast audit`
-- passes), written through the migrations' own schema. Run by
-- bench/production.py on a database `holdfast migrate` has just created;
-- psql variables: n (assets), sold (the oldest, SOLD), twice (the next ones,
-- held twice), days (the history's length), keys (stored answers in the last
-- day).
--
-- Asset i (PS-0000001 …) has its history at t(i), i/n of the way through
-- the last `days` days:
--   i <= sold:          a hold that lapsed, a late payment refunded
--                       (HOLD_EXPIRED), then a hold committed: 5 events;
--   sold < i <= +twice: a hold released, then a hold that lapsed: 4 events;
--   the rest:           one hold, lapsed (even i) or released (odd i): 2.
-- Every reservation is res_ and its number as 26 digits (a ULID's alphabet),
-- refunds likewise; an event's id is a ULID of its creation time (the
-- service's are: the retention purge reads them in that order) followed by
-- its number. Events are delivered. Foreign keys are not
-- checked while loading (session_replication_role = replica): the rows are
-- written consistent, and the audit afterwards says so.

\set ON_ERROR_STOP on
SET session_replication_role = replica;
SET synchronous_commit = off;

-- The first 10 characters of a ULID made at `t`: its milliseconds since
-- 1970 in Crockford's base 32.
CREATE FUNCTION pg_temp.ulid_time(t timestamptz) RETURNS text LANGUAGE sql IMMUTABLE AS $$
SELECT string_agg(substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ',
                         ((floor(extract(epoch FROM t) * 1000)::bigint >> (5 * (9 - d))) & 31)::int + 1,
                         1), '' ORDER BY d)
  FROM generate_series(0, 9) AS d
$$;

CREATE TEMP TABLE plan AS
SELECT i,
       'PS-' || lpad(i::text, 7, '0') AS asset_id,
       now() - make_interval(days => :days) + make_interval(secs => i::float8 / :n * :days * 86400) AS t,
       CASE WHEN i <= :sold THEN 'sold' WHEN i <= :sold + :twice THEN 'twice'
            WHEN i % 2 = 0 THEN 'lapsed' ELSE 'released' END AS kind
  FROM generate_series(1, :n) AS i;

\echo assets
INSERT INTO assets (id, name, status, current_reservation_id, version, last_event_sequence,
                    created_at, updated_at, price_amount, price_currency)
SELECT asset_id, 'Plate ' || asset_id,
       CASE kind WHEN 'sold' THEN 'SOLD' ELSE 'AVAILABLE' END,
       CASE kind WHEN 'sold' THEN 'res_' || lpad((2 * i)::text, 26, '0') END,
       CASE kind WHEN 'sold' THEN 6 WHEN 'twice' THEN 5 ELSE 3 END,
       CASE kind WHEN 'sold' THEN 5 WHEN 'twice' THEN 4 ELSE 2 END,
       now() - make_interval(days => :days + 1),
       t + interval '11 minutes',
       100000000 + (i % 97) * 1000000, 'IDR'
  FROM plan;

-- Each reservation: (asset, number, slot, status, created).
CREATE TEMP TABLE held AS
SELECT p.asset_id, p.i, 2 * p.i - 1 AS k, p.t AS created,
       CASE p.kind WHEN 'sold' THEN 'EXPIRED' WHEN 'twice' THEN 'RELEASED'
                   WHEN 'lapsed' THEN 'EXPIRED' ELSE 'RELEASED' END AS status
  FROM plan p
UNION ALL
SELECT p.asset_id, p.i, 2 * p.i, p.t + interval '10 minutes',
       CASE p.kind WHEN 'sold' THEN 'COMMITTED' ELSE 'EXPIRED' END
  FROM plan p WHERE p.kind IN ('sold', 'twice');

\echo reservations
INSERT INTO reservations (id, asset_id, buyer_id, status, expires_at, created_at, committed_at,
                          released_at, payment_reference, client, payment_client,
                          price_amount, price_currency)
SELECT 'res_' || lpad(k::text, 26, '0'), asset_id, 'buyer-' || (k % 100000), status,
       created + interval '5 minutes', created,
       CASE status WHEN 'COMMITTED' THEN created + interval '1 minute' END,
       CASE status WHEN 'RELEASED' THEN created + interval '1 minute' END,
       CASE status WHEN 'COMMITTED' THEN 'pay-' || i END,
       '-',
       CASE status WHEN 'COMMITTED' THEN '-' END,
       100000000 + (i % 97) * 1000000, 'IDR'
  FROM held;

\echo refunds
INSERT INTO refunds (id, reservation_id, asset_id, payment_reference, reason, status,
                     created_at, completed_at, payment_client)
SELECT 'rf_' || lpad(i::text, 26, '0'), 'res_' || lpad((2 * i - 1)::text, 26, '0'), asset_id,
       'late-' || i, 'HOLD_EXPIRED', 'COMPLETED', t + interval '6 minutes',
       t + interval '7 minutes', '-'
  FROM plan WHERE kind = 'sold';

\echo payments
INSERT INTO payments (client, reference, reservation_id, refund_id, created_at)
SELECT '-', 'pay-' || i, 'res_' || lpad((2 * i)::text, 26, '0'), NULL,
       t + interval '11 minutes'
  FROM plan WHERE kind = 'sold'
UNION ALL
SELECT '-', 'late-' || i, 'res_' || lpad((2 * i - 1)::text, 26, '0'),
       'rf_' || lpad(i::text, 26, '0'), t + interval '6 minutes'
  FROM plan WHERE kind = 'sold';

-- Each event: (asset, sequence, type, reservation, at), then its data: the
-- reservation as the answer showed it (about 600 bytes), or the refund.
\echo events
INSERT INTO events (id, asset_id, sequence, type, data, created_at, delivered_at, client)
SELECT 'evt_' || pg_temp.ulid_time(h.created + e.after) || lpad((h.i * 8 + e.sequence)::text, 16, '0'),
       h.asset_id, e.sequence, e.type,
       CASE WHEN e.type = 'refund.requested' THEN
         '{"refund_id":"rf_' || lpad(h.i::text, 26, '0') || '","reservation_id":"res_'
         || lpad(h.k::text, 26, '0') || '","asset_id":"' || h.asset_id
         || '","payment_reference":"late-' || h.i || '","payment_client":"-",'
         || '"reason":"HOLD_EXPIRED","status":"REQUESTED"}'
       ELSE
         '{"reservation_id":"res_' || lpad(h.k::text, 26, '0') || '","asset_id":"' || h.asset_id
         || '","buyer_id":"buyer-' || (h.k % 100000) || '","status":"' || e.shown
         || '","expires_at":"' || to_char((h.created + interval '5 minutes') AT TIME ZONE 'UTC',
                                          'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
         || '","created_at":"' || to_char(h.created AT TIME ZONE 'UTC',
                                          'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
         || '","committed_at":null,"released_at":null,"payment_reference":null,'
         || '"voided_at":null,"refunds":[],"price":{"amount":' || (100000000 + (h.i % 97) * 1000000)
         || ',"currency":"IDR"},"metadata":{"applicant":"' || repeat('x', 200)
         || '"},"via":null}'
       END,
       h.created + e.after, h.created + e.after + interval '1 second', '-'
  FROM held h
  CROSS JOIN LATERAL (VALUES
      (1, 'reservation.held', 'HELD', interval '0'),
      (2, CASE h.status WHEN 'RELEASED' THEN 'reservation.released'
                        WHEN 'COMMITTED' THEN 'reservation.committed'
                        ELSE 'reservation.expired' END,
          h.status, CASE h.status WHEN 'EXPIRED' THEN interval '5 minutes'
                                  ELSE interval '1 minute' END),
      (3, 'refund.requested', h.status, interval '6 minutes')
  ) AS e0(n, type, shown, after)
  CROSS JOIN LATERAL (SELECT
      -- numbered within the asset: the first reservation's events first
      CASE WHEN h.k = 2 * h.i - 1 THEN e0.n ELSE
        (CASE WHEN h.status = 'COMMITTED' THEN 3 ELSE 2 END) + e0.n END AS sequence,
      e0.type, e0.shown, e0.after) AS e
 WHERE e0.n < 3 OR (h.k = 2 * h.i - 1 AND h.i <= :sold);

\echo idempotency keys
INSERT INTO idempotency_keys (client, key, fingerprint, status_code, body, location,
                              reservation_id, created_at)
SELECT '-', 'key-' || j, 'production', 201,
       '{"reservation_id":"res_' || lpad(k::text, 26, '0') || '"}',
       '/v1/reservations/res_' || lpad(k::text, 26, '0'),
       'res_' || lpad(k::text, 26, '0'),
       now() - make_interval(secs => j::float8 / :keys * 86400)
  FROM generate_series(1, :keys) AS j,
       LATERAL (SELECT 2 * (:sold + :twice) + 1 + 2 * ((j::bigint * 7919) % (:n - :sold - :twice)) AS k0) x,
       LATERAL (SELECT CASE WHEN k0 > 2 * :n THEN 1 ELSE k0 END AS k) y;

RESET session_replication_role;

-- The triggers that keep asset counts did not run while loading.
UPDATE asset_counts SET n = (SELECT count(*) FROM assets WHERE asset_counts.status = 'ALL'
                                                         OR assets.status = asset_counts.status);
DELETE FROM asset_count_changes;
