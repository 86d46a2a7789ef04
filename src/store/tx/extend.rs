//! The extension: a live hold lapses later (some seconds from now, or at an
//! instant), as long as it lives at most the policy's cap from its
//! creation: `hold_max_total_seconds` for a hold, `offer_max_seconds` for an
//! offer.

use chrono::Duration;
use diesel::sql_query;
use diesel::sql_types::{BigInt, Text};
use diesel::QueryableByName;

use super::{about, write_after, Keep, Target};
use crate::domain::{extension_allowed, EventType, Reservation, ReservationStatus, Timestamp, Via};
use crate::store::api::{Answer, ExtendOutcome, ExtendRequest, Keyed, Until};
use crate::store::db::Store;
use crate::store::error::StoreResult;
use crate::store::error::{Abort, Context};
use crate::store::schema::Instant;

pub(crate) async fn extend(
    store: &Store,
    req: &ExtendRequest,
) -> StoreResult<Keyed<ExtendOutcome>> {
    let policy = store.policy();
    Target::new("extend the hold", &req.reservation_id, &req.idempotency)
        .seen_by(&req.client)
        .act(store, async |reservation, now, _| {
            let until = match req.until {
                Until::Seconds(seconds) => now + Duration::seconds(seconds),
                Until::At(at) => at,
            };
            if reservation.status != ReservationStatus::Held {
                return Ok(Some(ExtendOutcome::NotActive(reservation)));
            }
            if until <= now {
                return Ok(Some(ExtendOutcome::NotAhead(reservation)));
            }
            let cap = match reservation.via {
                Some(Via::Offer) => policy.offer_max_seconds,
                _ => policy.hold_max_total_seconds,
            };
            if !extension_allowed(reservation.created_at, until, cap) {
                return Ok(Some(ExtendOutcome::LimitReached {
                    reservation,
                    max_total_seconds: cap,
                }));
            }
            let extended = move_expiry(store, reservation, now, until, req).await?;
            Ok(extended.map(ExtendOutcome::Extended))
        })
        .await
}

/// Moves the live hold's expiry to `until`, decided at `now`; `None` when it
/// was no longer live at the write's own clock.
async fn move_expiry(
    store: &Store,
    reservation: Reservation,
    now: Timestamp,
    until: Timestamp,
    req: &ExtendRequest,
) -> StoreResult<Option<Reservation>> {
    #[derive(QueryableByName)]
    struct Sequence {
        #[diesel(sql_type = BigInt)]
        last_event_sequence: i64,
    }
    let mut extended = reservation;
    extended.expires_at = until;
    let answer = store.render(Answer::Changed(&extended));
    let idempotency = req.idempotency.clone();
    store
        .write("extend the hold", async move |conn| {
            let at = conn.now().await?;
            let asset = sql_query(
                "UPDATE assets SET hold_expires_at = $1, version = version + 1, \
                     last_event_sequence = last_event_sequence + 1, updated_at = $2 \
                 WHERE id = $3 AND status = 'HELD' AND current_reservation_id = $4 \
                   AND hold_expires_at > $2 \
                 RETURNING last_event_sequence",
            )
            .bind::<Instant, _>(until)
            .bind::<Instant, _>(at)
            .bind::<Text, _>(&extended.asset_id)
            .bind::<Text, _>(&extended.reservation_id);
            let Some(sequence) = conn
                .optional::<_, Sequence>(asset)
                .await
                .context("extend the hold")?
            else {
                return Err(Abort::Retry);
            };
            let reservation = sql_query(
                "UPDATE reservations SET expires_at = $1 WHERE id = $2 AND status = 'HELD'",
            )
            .bind::<Instant, _>(until)
            .bind::<Text, _>(&extended.reservation_id);
            if conn
                .execute(reservation)
                .await
                .context("extend the reservation")?
                != 1
            {
                return Err(Abort::Retry);
            }
            let event = about(
                &extended,
                EventType::ReservationExtended,
                answer.body.clone(),
                now,
            );
            let keep = Keep {
                idempotency: &idempotency,
                answer: &answer,
                reservation_id: Some(&extended.reservation_id),
            };
            let asset = extended.asset_id.clone();
            write_after(
                conn,
                &asset,
                Some(sequence.last_event_sequence),
                vec![event],
                Some(keep),
                now,
            )
            .await?;
            Ok(extended)
        })
        .await
}
