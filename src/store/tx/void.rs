//! The void: a sale undone (a defaulting bidder, a chargeback). The
//! reservation becomes VOIDED, the asset AVAILABLE, and, unless told not
//! to, the payment is refunded (SALE_VOIDED) as part of its one fate.

use diesel::sql_query;
use diesel::sql_types::{BigInt, Text};
use diesel::QueryableByName;

use super::refund::insert_refund;
use super::{about, write_after, Keep, Target};
use crate::domain::{EventType, Refund, RefundReason, Reservation, ReservationStatus, Timestamp};
use crate::store::api::{Answer, Keyed, VoidOutcome, VoidRequest};
use crate::store::db::Store;
use crate::store::error::{Abort, Context};
use crate::store::error::{StoreError, StoreResult};
use crate::store::schema::Instant;

pub(crate) async fn void(store: &Store, req: &VoidRequest) -> StoreResult<Keyed<VoidOutcome>> {
    Target::new("void the sale", &req.reservation_id, &req.idempotency)
        .act(store, async |reservation, now, _| {
            match reservation.status {
                ReservationStatus::Committed => {
                    let voided = undo_sale(store, reservation, now, req).await?;
                    Ok(voided.map(VoidOutcome::Voided))
                }
                ReservationStatus::Voided => Ok(Some(VoidOutcome::AlreadyVoided(reservation))),
                _ => Ok(Some(VoidOutcome::NotActive(reservation))),
            }
        })
        .await
}

/// Undoes the sale of `reservation`, read at `now`, while it is still the
/// asset's sale; `None` when it no longer was.
async fn undo_sale(
    store: &Store,
    reservation: Reservation,
    now: Timestamp,
    req: &VoidRequest,
) -> StoreResult<Option<Reservation>> {
    #[derive(QueryableByName)]
    struct Sequence {
        #[diesel(sql_type = BigInt)]
        last_event_sequence: i64,
    }
    // Part of the payment's one fate: it bought this sale.
    let refund = match (
        req.refund,
        &reservation.payment_client,
        &reservation.payment_reference,
    ) {
        (true, Some(client), Some(reference)) => Some(Refund::requested(
            &reservation,
            client,
            reference,
            RefundReason::SaleVoided,
            now,
        )),
        _ => None,
    };
    let (store_, idempotency, client) =
        (store.clone(), req.idempotency.clone(), req.client.clone());
    store
        .write("void the sale", async move |conn| {
            let (id, asset) = (&reservation.reservation_id, &reservation.asset_id);
            // Free to hold from this write on, not from the read before it.
            let freed = conn.now_after_locks().await?;
            let sold = sql_query(
                "UPDATE assets SET status = 'AVAILABLE', current_reservation_id = NULL, \
                     hold_expires_at = NULL, version = version + 1, \
                     last_event_sequence = last_event_sequence + 1, updated_at = $1, \
                     available_since = $2 \
                 WHERE id = $3 AND status = 'SOLD' AND current_reservation_id = $4 \
                 RETURNING last_event_sequence",
            )
            .bind::<Instant, _>(now)
            .bind::<Instant, _>(freed)
            .bind::<Text, _>(asset)
            .bind::<Text, _>(id);
            let Some(sequence) = conn
                .optional::<_, Sequence>(sold)
                .await
                .context("void the sale")?
            else {
                return Err(Abort::Retry);
            };
            let voided = sql_query(
                "UPDATE reservations SET status = 'VOIDED', voided_at = $1 \
                 WHERE id = $2 AND status = 'COMMITTED'",
            )
            .bind::<Instant, _>(now)
            .bind::<Text, _>(id);
            if conn.execute(voided).await.context("void the reservation")? != 1 {
                return Err(Abort::Retry);
            }
            if let Some(refund) = &refund {
                insert_refund(conn, refund).await?;
            }
            let current = crate::store::read::reservation_in(conn, id, now)
                .await?
                .ok_or_else(|| StoreError::Corrupt(format!("reservation {id} vanished")))?;
            let answer = store_.render(Answer::Changed(&current));
            let mut events = vec![about(
                &current,
                EventType::ReservationVoided,
                answer.body.clone(),
                now,
            )
            .by(&client)];
            if let Some(refund) = &refund {
                let data = serde_json::to_string(refund).unwrap_or_default();
                events.push(about(&current, EventType::RefundRequested, data, now).by(&client));
            }
            let keep = Keep {
                idempotency: &idempotency,
                answer: &answer,
                reservation_id: Some(id),
            };
            let first = Some(sequence.last_event_sequence);
            write_after(conn, asset, first, events, Some(keep), now).await?;
            Ok(current)
        })
        .await
}
