//! Refunds: a payment refused (its one fate is a refund), and a refund the
//! payment system reports done.

use diesel::sql_query;
use diesel::sql_types::Text;
use diesel::QueryableByName;

use super::end_hold::{record_fate, Payment};
use super::expire::{expire_lapsed, Lapsed};
use super::{about, answered, contention, write_after, Keep, Snapshot, MAX_ATTEMPTS};
use crate::domain::{EventType, Refund, RefundReason, Reservation, Timestamp};
use crate::store::api::{Answer, CompleteRefundOutcome, CompleteRefundRequest, Idempotency, Keyed};
use crate::store::conn::Conn;
use crate::store::db::Store;
use crate::store::error::{Abort, Context};
use crate::store::error::{StoreError, StoreResult};
use crate::store::rows::RefundRow;
use crate::store::schema::Instant;

/// Refuses `payment` sent for `reservation` (read at `now`), with a refund
/// of `reason` as its one fate, while the reservation is still in the state
/// the refusal was decided on: its asset locked first, and a lapsed hold
/// nobody swept yet expired, so that the timeline reads held → expired →
/// refund requested. The reservation as it became (with the new refund) and
/// the refund; `None` when the reservation moved on meanwhile (a sale voided,
/// a late payment accepted) or the payment got a fate concurrently.
pub(crate) async fn refuse(
    store: &Store,
    reservation: Reservation,
    payment: &Payment,
    reason: RefundReason,
    now: Timestamp,
    idempotency: &Idempotency,
) -> StoreResult<Option<(Reservation, Refund)>> {
    let (store_, payment, idempotency) = (store.clone(), payment.clone(), idempotency.clone());
    store
        .write("refund the payment", async move |conn| {
            let id = reservation.reservation_id.as_str();
            let asset = reservation.asset_id.as_str();
            conn.lock_asset(asset).await?;
            expire_lapsed(conn, Lapsed::Of(asset), now, store_.policy()).await?;
            if stored_status(conn, id).await? != reservation.status.as_str() {
                return Err(Abort::Retry);
            }
            let refusal = Refusal {
                store: &store_,
                payment: &payment,
                idempotency: &idempotency,
            };
            Ok(refusal.write(conn, &reservation, reason, now).await?)
        })
        .await
}

/// A payment refused within a transaction that decided so on the state it
/// holds: the refund, the payment's fate, the event and the kept answer.
pub(super) struct Refusal<'a> {
    pub store: &'a Store,
    pub payment: &'a Payment,
    pub idempotency: &'a Idempotency,
}

impl Refusal<'_> {
    /// Writes the refusal of the payment for `reservation` at `now`; the
    /// reservation as it is now (with the new refund) and the refund.
    pub(super) async fn write(
        &self,
        conn: &mut Conn<'_>,
        reservation: &Reservation,
        reason: RefundReason,
        now: Timestamp,
    ) -> StoreResult<(Reservation, Refund)> {
        let Self {
            store,
            payment,
            idempotency,
        } = self;
        let refund = Refund::requested(
            reservation,
            &payment.client,
            &payment.reference,
            reason,
            now,
        );
        let id = reservation.reservation_id.as_str();
        insert_refund(conn, &refund).await?;
        record_fate(conn, payment, id, Some(&refund.refund_id), now).await?;
        let current = crate::store::read::reservation_in(conn, id, now)
            .await?
            .ok_or_else(|| StoreError::Corrupt(format!("reservation {id} vanished")))?;
        let answer = store.render(Answer::Refused {
            reason,
            reservation: &current,
            refund: &refund,
        });
        let data = serde_json::to_string(&refund).unwrap_or_default();
        let event = about(&current, EventType::RefundRequested, data, now);
        let keep = Keep {
            idempotency,
            answer: &answer,
            reservation_id: Some(id),
        };
        write_after(conn, &current.asset_id, None, vec![event], Some(keep), now).await?;
        Ok((current, refund))
    }
}

/// A reservation's status as stored.
pub(super) async fn stored_status(conn: &mut Conn<'_>, id: &str) -> StoreResult<String> {
    #[derive(QueryableByName)]
    struct Status {
        #[diesel(sql_type = Text)]
        status: String,
    }
    let read = sql_query("SELECT status FROM reservations WHERE id = $1").bind::<Text, _>(id);
    let row: Status = conn
        .first(read)
        .await
        .context("read the reservation's status")?;
    Ok(row.status)
}

/// Records a refund; a unique violation when this payment of this
/// reservation has one.
pub(crate) async fn insert_refund(conn: &mut Conn<'_>, refund: &Refund) -> StoreResult<()> {
    let insert = sql_query(
        "INSERT INTO refunds (id, reservation_id, asset_id, payment_reference, payment_client, \
             reason, status, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    )
    .bind::<Text, _>(&refund.refund_id)
    .bind::<Text, _>(&refund.reservation_id)
    .bind::<Text, _>(&refund.asset_id)
    .bind::<Text, _>(&refund.payment_reference)
    .bind::<Text, _>(&refund.payment_client)
    .bind::<Text, _>(refund.reason.as_str())
    .bind::<Text, _>(refund.status.as_str())
    .bind::<Instant, _>(refund.created_at);
    conn.execute(insert).await.context("record a refund")?;
    Ok(())
}

/// The payment system reports a refund done: REQUESTED becomes COMPLETED once.
pub(crate) async fn complete(
    store: &Store,
    req: &CompleteRefundRequest,
) -> StoreResult<Keyed<CompleteRefundOutcome>> {
    for _ in 0..MAX_ATTEMPTS {
        let snap = snapshot(store, req).await?;
        if let Some(stored) = snap.stored {
            return Ok(answered(stored, &req.idempotency));
        }
        let Some(refund) = snap.row else {
            return Ok(Keyed::NotFound);
        };
        if refund.status == crate::domain::RefundStatus::Completed {
            return Ok(Keyed::Done(CompleteRefundOutcome::AlreadyCompleted(refund)));
        }
        let (store_, idempotency) = (store.clone(), req.idempotency.clone());
        let completed = store
            .write("complete the refund", async move |conn| {
                let now = conn.now().await?;
                let complete = sql_query(
                    "UPDATE refunds SET status = 'COMPLETED', completed_at = $1 \
                     WHERE id = $2 AND status = 'REQUESTED' RETURNING *",
                )
                .bind::<Instant, _>(now)
                .bind::<Text, _>(&refund.refund_id);
                let Some(row) = conn
                    .optional::<_, RefundRow>(complete)
                    .await
                    .context("complete a refund")?
                else {
                    return Err(Abort::Retry);
                };
                let completed = row.into_refund()?;
                let answer = store_.render(Answer::RefundCompleted(&completed));
                let event = crate::store::rows::NewEvent::new(
                    &completed.asset_id,
                    EventType::RefundCompleted,
                    answer.body.clone(),
                    now,
                )
                .about(&completed.reservation_id);
                let keep = Keep {
                    idempotency: &idempotency,
                    answer: &answer,
                    reservation_id: Some(&completed.reservation_id),
                };
                let asset = completed.asset_id.clone();
                write_after(conn, &asset, None, vec![event], Some(keep), now).await?;
                Ok(completed)
            })
            .await?;
        if let Some(completed) = completed {
            return Ok(Keyed::Done(CompleteRefundOutcome::Completed(completed)));
        }
    }
    Err(contention("complete the refund"))
}

/// The refund and the answer stored under the request's key, with the clock.
async fn snapshot(store: &Store, req: &CompleteRefundRequest) -> StoreResult<Snapshot<Refund>> {
    let (id, idempotency) = (req.refund_id.to_string(), req.idempotency.clone());
    store
        .run("read the refund", async move |conn| {
            let now = conn.now().await?;
            let key = super::read_key(conn, &idempotency, now).await?;
            let refund = sql_query("SELECT * FROM refunds WHERE id = $1").bind::<Text, _>(&id);
            let refund = conn
                .optional::<_, RefundRow>(refund)
                .await
                .context("read a refund")?
                .map(RefundRow::into_refund)
                .transpose()?;
            Ok(key.with_row(refund))
        })
        .await
}
