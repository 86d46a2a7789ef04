//! The end of a live hold: its sale to a payment (commit) or its release.
//!
//! The answer, its event and the answer kept under the key are built from
//! the first read, at that read's clock, before anything is sent; the write
//! then checks, at its own clock, that the hold is still live and still the
//! asset's. On PostgreSQL it is one statement of data-modifying CTEs
//! ([`END_HOLD_SQL`]), one round trip with its commit; on SQLite the same
//! writes are statements in one transaction ([`on_sqlite`]).

use diesel::sql_query;
use diesel::sql_types::{BigInt, Integer, Nullable, Text, Timestamptz};
use diesel::QueryableByName;

use super::waitlist::{clear, hand_off};
use super::{about, store_answer, write_after, Keep};
use crate::domain::{EventType, Reservation, Timestamp};
use crate::store::api::{Answer, Idempotency, Policy, Rendered};
use crate::store::conn::Conn;
use crate::store::db::Store;
use crate::store::error::{Abort, Context};
use crate::store::error::{StoreError, StoreResult};
use crate::store::postgres::Prepared;
use crate::store::rows::NewEvent;
use crate::store::schema::Instant;

/// A payment: the payments client and its reference.
#[derive(Debug, Clone)]
pub(crate) struct Payment {
    pub client: String,
    pub reference: String,
}

/// Sells (with `payment`) or releases `reservation`, live at `read_at`
/// when it was read. The reservation as it became, or `None` when the hold
/// was no longer live and nothing was written (or a concurrent request took
/// the key or the payment): the caller reads again.
pub(crate) async fn end_live_hold(
    store: &Store,
    reservation: Reservation,
    payment: Option<Payment>,
    read_at: Timestamp,
    idempotency: &Idempotency,
) -> StoreResult<Option<Reservation>> {
    let (ended, event_type) = match &payment {
        Some(p) => (
            reservation.sold(read_at, &p.client, &p.reference),
            EventType::ReservationCommitted,
        ),
        None => (
            reservation.released(read_at),
            EventType::ReservationReleased,
        ),
    };
    let end = End {
        answer: store.render(Answer::Changed(&ended)),
        event: about(&ended, event_type, String::new(), read_at),
        idempotency: idempotency.clone(),
        payment,
        read_at,
        ended,
        policy: *store.policy(),
    };
    if store.postgres().is_some() {
        let fast = end.clone();
        let end_hold = async move |c: &mut Conn<'_>| {
            fast.on_postgres(c).await?;
            Ok(fast.ended)
        };
        if let Some(ended) = store.write_statement("end the hold", end_hold).await? {
            return Ok(Some(ended));
        }
        // Not live any more, or buyers wait for the asset: the transaction
        // below tells which, and hands the asset over or clears the queue.
    }
    let end_hold = async move |c: &mut Conn<'_>| {
        end.in_transaction(c).await?;
        Ok(end.ended)
    };
    store.write("end the hold", end_hold).await
}

#[derive(Clone)]
struct End {
    ended: Reservation,
    payment: Option<Payment>,
    read_at: Timestamp,
    answer: Rendered,
    /// Its data is the answer's body.
    event: NewEvent,
    idempotency: Idempotency,
    policy: Policy,
}

/// The sale ($3 payment reference, $4 its client) or, without a payment,
/// the release of a live hold of an asset nobody waits for: the asset first
/// (lock order: asset, then reservation), guarded by status, reservation,
/// expiry at the statement's own now() and an empty queue; then the
/// reservation, the payment's fate (whose key fails the statement when the
/// payment has one already), the event under the number the asset's update
/// took, and the answer kept under the key. It records the first read's
/// clock ($5).
///
/// The asset is reached by its primary key: no index of `assets` covers
/// its status or expiry (migration `hot_holds`). A partial index of HELD
/// assets did once; with statistics taken while few assets were HELD, the
/// planner chose it (estimated one row) and every commit read the entry of
/// every live hold: after a flash sale's 24,000 holds, commits ran seven
/// times slower.
const END_HOLD_SQL: &str = "\
WITH a AS (
    UPDATE assets
       SET status = CASE WHEN $3::text IS NULL THEN 'AVAILABLE' ELSE 'SOLD' END,
           current_reservation_id = CASE WHEN $3::text IS NULL THEN NULL ELSE $1 END,
           hold_expires_at = NULL, version = version + 1,
           last_event_sequence = last_event_sequence + 1, updated_at = $5,
           available_since = CASE WHEN $3::text IS NULL THEN clock_timestamp()
                                  ELSE available_since END
     WHERE id = $2 AND status = 'HELD' AND current_reservation_id = $1
       AND hold_expires_at > now()
       AND waitlist_length = 0
 RETURNING id, last_event_sequence
), r AS (
    UPDATE reservations
       SET status = CASE WHEN $3::text IS NULL THEN 'RELEASED' ELSE 'COMMITTED' END,
           committed_at = CASE WHEN $3::text IS NULL THEN NULL ELSE $5 END,
           released_at = CASE WHEN $3::text IS NULL THEN $5 END,
           payment_reference = $3, payment_client = $4
     WHERE id = $1 AND status = 'HELD' AND EXISTS (SELECT 1 FROM a)
 RETURNING id, client
), fate AS (
    INSERT INTO payments (client, reference, reservation_id, created_at)
    SELECT $4, $3, id, $5 FROM r WHERE $3::text IS NOT NULL
), event AS (
    INSERT INTO events (id, asset_id, sequence, type, data, created_at, client, actor)
    SELECT $6, a.id, a.last_event_sequence, $7, $8, $5, r.client, NULL FROM a, r
), answer AS (
    INSERT INTO idempotency_keys (client, key, fingerprint, status_code, body, location,
        reservation_id, created_at)
    SELECT $9, $10, $11, $12, $8, $13, r.id, $5 FROM r
)
SELECT count(*) AS ended FROM r";

#[derive(QueryableByName)]
struct Ended {
    #[diesel(sql_type = BigInt)]
    ended: i64,
}

#[derive(QueryableByName)]
struct Sequence {
    #[diesel(sql_type = BigInt)]
    last_event_sequence: i64,
    #[diesel(sql_type = diesel::sql_types::Integer)]
    waitlist_length: i32,
}

impl End {
    async fn on_postgres(&self, conn: &mut Conn<'_>) -> Result<(), Abort> {
        let Conn::Pg(c) = conn else {
            return Err(
                StoreError::Corrupt("the PostgreSQL end of a hold on SQLite".into()).into(),
            );
        };
        let (r, idem, answer) = (&self.ended, &self.idempotency, &self.answer);
        let payment = self.payment.as_ref();
        let end_hold = Prepared(
            sql_query(END_HOLD_SQL)
                .bind::<Text, _>(&r.reservation_id)
                .bind::<Text, _>(&r.asset_id)
                .bind::<Nullable<Text>, _>(payment.map(|p| p.reference.as_str()))
                .bind::<Nullable<Text>, _>(payment.map(|p| p.client.as_str()))
                .bind::<Timestamptz, _>(self.read_at)
                .bind::<Text, _>(&self.event.id)
                .bind::<Text, _>(self.event.event_type.as_str())
                .bind::<Text, _>(&answer.body)
                .bind::<Text, _>(&idem.client)
                .bind::<Text, _>(idem.key.as_str())
                .bind::<Text, _>(&idem.fingerprint)
                .bind::<Integer, _>(i32::from(answer.status))
                .bind::<Nullable<Text>, _>(answer.location.as_deref()),
        );
        let rows = diesel_async::RunQueryDsl::load::<Ended>(end_hold, &mut **c)
            .await
            .context("end the hold")?;
        match rows.first() {
            Some(row) if row.ended > 0 => Ok(()),
            Some(_) => Err(Abort::Retry),
            None => Err(StoreError::Corrupt("ending a hold answered no row".into()).into()),
        }
    }

    /// The end of the hold as statements in a transaction, either dialect:
    /// SQLite's way, and PostgreSQL's when buyers wait for the asset (a
    /// release then hands it to the first of them, a sale clears the queue).
    async fn in_transaction(&self, conn: &mut Conn<'_>) -> Result<(), Abort> {
        let r = &self.ended;
        let payment = self.payment.as_ref();
        // Judged at the write's own clock, after any wait for the writer.
        let now = conn.now().await?;
        let asset = sql_query(
            "UPDATE assets SET status = $1, current_reservation_id = $2, hold_expires_at = NULL, \
                 version = version + 1, last_event_sequence = last_event_sequence + 1, \
                 updated_at = $3, \
                 available_since = CASE WHEN $1 = 'AVAILABLE' THEN $4 ELSE available_since END \
             WHERE id = $5 AND status = 'HELD' AND current_reservation_id = $6 \
               AND hold_expires_at > $4 \
             RETURNING last_event_sequence, waitlist_length",
        )
        .bind::<Text, _>(if payment.is_some() {
            "SOLD"
        } else {
            "AVAILABLE"
        })
        .bind::<Nullable<Text>, _>(payment.map(|_| r.reservation_id.as_str()))
        .bind::<Instant, _>(self.read_at)
        .bind::<Instant, _>(now)
        .bind::<Text, _>(&r.asset_id)
        .bind::<Text, _>(&r.reservation_id);
        let Some(sequence) = conn
            .optional::<_, Sequence>(asset)
            .await
            .context("change the asset")?
        else {
            return Err(Abort::Retry);
        };
        let reservation = sql_query(
            "UPDATE reservations SET status = $1, committed_at = $2, released_at = $3, \
                 payment_reference = $4, payment_client = $5 \
             WHERE id = $6 AND status = 'HELD'",
        )
        .bind::<Text, _>(r.status.as_str())
        .bind::<Nullable<Instant>, _>(r.committed_at)
        .bind::<Nullable<Instant>, _>(r.released_at)
        .bind::<Nullable<Text>, _>(r.payment_reference.as_deref())
        .bind::<Nullable<Text>, _>(r.payment_client.as_deref())
        .bind::<Text, _>(&r.reservation_id);
        if conn
            .execute(reservation)
            .await
            .context("end the reservation")?
            != 1
        {
            return Err(Abort::Retry);
        }
        if let Some(p) = payment {
            record_fate(conn, p, &r.reservation_id, None, self.read_at).await?;
        }
        let mut event = about(
            r,
            self.event.event_type,
            self.answer.body.clone(),
            self.read_at,
        );
        event.id = self.event.id.clone();
        event.sequence = sequence.last_event_sequence;
        conn.insert_event(&event).await?;
        let keep = Keep {
            idempotency: &self.idempotency,
            answer: &self.answer,
            reservation_id: Some(&r.reservation_id),
        };
        store_answer(conn, keep, self.read_at).await?;
        if sequence.waitlist_length > 0 {
            match payment {
                Some(_) => {
                    let asset = r.asset_id.as_str();
                    if let Some(cleared) = clear(conn, asset, "sold", self.read_at).await? {
                        write_after(conn, asset, None, vec![cleared], None, self.read_at).await?;
                    }
                }
                None => {
                    hand_off(conn, &r.asset_id, &r.reservation_id, now, &self.policy).await?;
                }
            }
        }
        Ok(())
    }
}

/// Records a payment's one fate: it bought `reservation_id`, or
/// `refund_id` gives it back. A unique violation when it has one already.
pub(crate) async fn record_fate(
    conn: &mut Conn<'_>,
    payment: &Payment,
    reservation_id: &str,
    refund_id: Option<&str>,
    now: Timestamp,
) -> StoreResult<()> {
    let insert = sql_query(
        "INSERT INTO payments (client, reference, reservation_id, refund_id, created_at) \
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind::<Text, _>(&payment.client)
    .bind::<Text, _>(&payment.reference)
    .bind::<Text, _>(reservation_id)
    .bind::<Nullable<Text>, _>(refund_id)
    .bind::<Instant, _>(now);
    conn.execute(insert)
        .await
        .context("record the payment's fate")?;
    Ok(())
}
