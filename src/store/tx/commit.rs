//! The commit: the payment system pays for a reservation.
//!
//! Decided first by the payment's one fate, then by the reservation's
//! effective status (`crate::domain::commit_decision`), on one snapshot of
//! both. A live hold is sold ([`end_live_hold`]); a lapsed one is sold late
//! when the policy accepts late payments and nobody held or bought the asset
//! since, else refunded, in one transaction ([`pay_late`]); otherwise the
//! payment is refunded
//! ([`super::refund::refuse`]). Answers that change nothing come from the
//! snapshot.

use diesel::sql_query;
use diesel::sql_types::Text;

use super::end_hold::{end_live_hold, record_fate, Payment};
use super::expire::{expire_lapsed, Lapsed};
use super::refund::{refuse, stored_status, Refusal};
use super::{about, write_after, Keep, Target};
use crate::domain::{
    commit_decision, pays, CommitDecision, EventType, Refund, RefundReason, Reservation,
    ReservationStatus,
};
use crate::store::api::{Answer, CommitOutcome, CommitRequest, Idempotency, Keyed};
use crate::store::conn::Conn;
use crate::store::db::Store;
use crate::store::error::{Abort, Context};
use crate::store::error::{StoreError, StoreResult};
use crate::store::schema::Instant;

pub(crate) async fn commit(
    store: &Store,
    req: &CommitRequest,
) -> StoreResult<Keyed<CommitOutcome>> {
    let payment = Payment {
        client: req.client.clone(),
        reference: req.payment_reference.to_string(),
    };
    let accepts_late = store.policy().accept_late_commits;
    let target = Target::new(
        "commit the reservation",
        &req.reservation_id,
        &req.idempotency,
    )
    .paying(&payment.client, &payment.reference);
    target
        .act(store, async |reservation, now, fate| {
            let id = reservation.reservation_id.clone();
            // Every write below either lands, or finds the state moved (a
            // lost race, a key or a payment taken by a concurrent request)
            // and reads again: the payments table's key decides, not this read.
            let pays = pays(reservation.price.as_ref(), req.amount.as_ref());
            let decision = match commit_decision(&id, reservation.status, fate.as_ref()) {
                // A payment short of the price: the hold stays, and the
                // payment's one fate is its refund.
                CommitDecision::Commit if !pays => {
                    CommitDecision::Refuse(RefundReason::AmountMismatch)
                }
                decision => decision,
            };
            match decision {
                CommitDecision::Commit => {
                    let paid = Some(payment.clone());
                    let sold = end_live_hold(store, reservation, paid, now, &req.idempotency);
                    Ok(sold.await?.map(CommitOutcome::Committed))
                }
                CommitDecision::Refuse(RefundReason::HoldExpired) if accepts_late && pays => {
                    let late = pay_late(store, reservation, &payment, &req.idempotency).await?;
                    Ok(late.map(|late| match late {
                        Late::Sold(sold) => CommitOutcome::CommittedLate(sold),
                        Late::Refunded(reservation, refund) => CommitOutcome::Refunded {
                            reason: RefundReason::HoldExpired,
                            reservation,
                            refund,
                        },
                    }))
                }
                CommitDecision::Refuse(reason) => {
                    let refused =
                        refuse(store, reservation, &payment, reason, now, &req.idempotency);
                    Ok(refused
                        .await?
                        .map(|(reservation, refund)| CommitOutcome::Refunded {
                            reason,
                            reservation,
                            refund,
                        }))
                }
                CommitDecision::AlreadyCommittedWithThisPayment => {
                    Ok(Some(CommitOutcome::AlreadyCommitted(reservation)))
                }
                CommitDecision::RefundedBefore => {
                    let refund_id = fate.and_then(|f| f.refund_id);
                    let refund = reservation
                        .refunds
                        .iter()
                        .find(|r| Some(&r.refund_id) == refund_id.as_ref())
                        .cloned()
                        .ok_or_else(|| {
                            StoreError::Corrupt(format!(
                                "the refund of reservation {id} for this payment vanished"
                            ))
                        })?;
                    Ok(Some(CommitOutcome::Refused {
                        reason: refund.reason,
                        reservation,
                        refund,
                    }))
                }
                CommitDecision::SaleVoided => {
                    // Its own payment: the void's refund, if it gave one.
                    let refund = reservation
                        .refunds
                        .iter()
                        .find(|r| {
                            r.reason == RefundReason::SaleVoided
                                && r.payment_reference == payment.reference
                                && Some(&r.payment_client) == reservation.payment_client.as_ref()
                        })
                        .cloned();
                    Ok(Some(CommitOutcome::SaleVoided {
                        reservation,
                        refund,
                    }))
                }
                CommitDecision::UsedElsewhere => {
                    let reference = &req.payment_reference;
                    let mut fates =
                        crate::store::read::payment_of(store, Some(&payment.client), reference)
                            .await?;
                    // Its fate went away between two reads: impossible
                    // unless rows were deleted by hand; read again.
                    Ok(fates
                        .pop()
                        .map(|(_, payment)| CommitOutcome::PaymentReferenceUsed {
                            reservation: Box::new(reservation),
                            payment: Box::new(payment),
                        }))
                }
            }
        })
        .await
}

/// What a late payment came to, decided in one transaction on the state it
/// holds: the asset sold to it, or its refund when somebody held or bought
/// the asset since (or it is withdrawn).
enum Late {
    Sold(Reservation),
    Refunded(Reservation, Refund),
}

/// Sells the asset to a lapsed hold (expired first, if nobody swept it yet)
/// when nobody held or bought the asset since, else refunds the payment;
/// `None` when the reservation moved on meanwhile (another payment bought
/// it) or a concurrent request took the key or the payment.
async fn pay_late(
    store: &Store,
    reservation: Reservation,
    payment: &Payment,
    idempotency: &Idempotency,
) -> StoreResult<Option<Late>> {
    let (store_, payment, idempotency) = (store.clone(), payment.clone(), idempotency.clone());
    store
        .write("sell to a late payment", async move |conn| {
            let asset = reservation.asset_id.as_str();
            conn.lock_asset(asset).await?;
            // Whoever held the asset before this lock came first: the sale or
            // the refund is dated after them.
            let now = conn.now_after_locks().await?;
            expire_lapsed(conn, Lapsed::Of(asset), now, store_.policy()).await?;
            if stored_status(conn, &reservation.reservation_id).await? != "EXPIRED" {
                return Err(Abort::Retry);
            }
            let Some((sequence, sold)) = sell_if_free(conn, &reservation, &payment, now).await?
            else {
                let refusal = Refusal {
                    store: &store_,
                    payment: &payment,
                    idempotency: &idempotency,
                };
                let reason = RefundReason::HoldExpired;
                let (reservation, refund) = refusal.write(conn, &reservation, reason, now).await?;
                return Ok(Late::Refunded(reservation, refund));
            };
            record_fate(conn, &payment, &sold.reservation_id, None, now).await?;
            let answer = store_.render(Answer::Changed(&sold));
            let event = about(
                &sold,
                EventType::ReservationCommitted,
                answer.body.clone(),
                now,
            );
            let keep = Keep {
                idempotency: &idempotency,
                answer: &answer,
                reservation_id: Some(&sold.reservation_id),
            };
            write_after(conn, asset, Some(sequence), vec![event], Some(keep), now).await?;
            Ok(Late::Sold(sold))
        })
        .await
}

/// The asset SOLD to the lapsed `reservation` (EXPIRED by now) when it is
/// AVAILABLE and no reservation of it was made since: the event number the
/// asset took, and the reservation as it became (with the refunds it had);
/// `None` when the asset is not free.
async fn sell_if_free(
    conn: &mut Conn<'_>,
    reservation: &Reservation,
    payment: &Payment,
    now: crate::domain::Timestamp,
) -> Result<Option<(i64, Reservation)>, Abort> {
    #[derive(diesel::QueryableByName)]
    struct Sequence {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        last_event_sequence: i64,
    }
    let free = sql_query(
        "UPDATE assets SET status = 'SOLD', current_reservation_id = $1, hold_expires_at = NULL, \
             version = version + 1, last_event_sequence = last_event_sequence + 1, \
             updated_at = $2 \
         WHERE id = $3 AND status = 'AVAILABLE' AND NOT EXISTS ( \
             SELECT 1 FROM reservations WHERE asset_id = $3 AND id <> $1 AND created_at >= $4) \
         RETURNING last_event_sequence",
    )
    .bind::<Text, _>(&reservation.reservation_id)
    .bind::<Instant, _>(now)
    .bind::<Text, _>(&reservation.asset_id)
    .bind::<Instant, _>(reservation.created_at);
    let Some(sequence) = conn
        .optional::<_, Sequence>(free)
        .await
        .context("sell to a late payment")?
    else {
        return Ok(None);
    };
    let sold = sql_query(
        "UPDATE reservations SET status = 'COMMITTED', committed_at = $1, \
             payment_reference = $2, payment_client = $3 \
         WHERE id = $4 AND status = 'EXPIRED'",
    )
    .bind::<Instant, _>(now)
    .bind::<Text, _>(&payment.reference)
    .bind::<Text, _>(&payment.client)
    .bind::<Text, _>(&reservation.reservation_id);
    if conn.execute(sold).await.context("commit the reservation")? != 1 {
        return Err(Abort::Retry);
    }
    let id = &reservation.reservation_id;
    let sold = crate::store::read::reservation_in(conn, id, now).await?;
    match sold {
        Some(sold) if sold.status == ReservationStatus::Committed => {
            Ok(Some((sequence.last_event_sequence, sold)))
        }
        _ => Err(StoreError::Corrupt(format!("reservation {id} was sold and is not")).into()),
    }
}
