//! Offers: a hold an admin makes for a named buyer, owned by a named
//! storefront client, until an absolute time up to the policy's
//! `offer_max_seconds` ahead (a runner-up's two business days to pay, an
//! applicant's paperwork). In every other way it is a hold: the same
//! commit, release, extension and expiry, the same refund of a late
//! payment; it does not count toward the buyer's limit of live holds.

use super::expire::{expire_lapsed, Lapsed};
use super::given::{asset_snapshot, give, Claim};
use super::{about, answered, contention, write_after, Keep, MAX_ATTEMPTS};
use crate::domain::{
    hold_decision, AssetStatus, AssetUnavailable, EventType, HoldDecision, Reservation, Timestamp,
    Via,
};
use crate::store::api::{Answer, Keyed, OfferOutcome, OfferRequest};
use crate::store::db::Store;
use crate::store::error::{Abort, StoreResult};

pub(crate) async fn offer(store: &Store, req: &OfferRequest) -> StoreResult<Keyed<OfferOutcome>> {
    let policy = store.policy();
    for _ in 0..MAX_ATTEMPTS {
        let snap = asset_snapshot(
            store,
            "read the asset to offer",
            req.asset_id.as_str(),
            &req.idempotency,
            req.arrived,
        )
        .await?;
        if let Some(stored) = snap.stored {
            return Ok(answered(stored, &req.idempotency));
        }
        let Some(seen) = snap.row else {
            return Ok(Keyed::NotFound);
        };
        // The latest expiry from the arrival: a later attempt judged it
        // from its own, before this read (the earliest from this read is
        // the stricter, and a later attempt's was earlier still).
        let earliest = snap.now + chrono::Duration::seconds(policy.offer_min_seconds);
        let latest = seen.decided + chrono::Duration::seconds(policy.offer_max_seconds);
        if req.expires_at < earliest || req.expires_at > latest {
            return Ok(Keyed::Done(OfferOutcome::OutOfRange { earliest, latest }));
        }
        // Decided on the asset as it stood at the request's arrival, as a
        // hold is: a later attempt of the same request may have been refused
        // meanwhile on a hold that has since ended.
        let unavailable = |status, hold_expires_at| {
            Ok(Keyed::Done(OfferOutcome::Unavailable(AssetUnavailable {
                status,
                hold_expires_at,
                waitlist_length: seen.waitlist_length,
            })))
        };
        match hold_decision(Some(seen.target), seen.decided) {
            HoldDecision::NotFound => return Ok(Keyed::NotFound),
            HoldDecision::Unavailable {
                status,
                hold_expires_at,
            } => return unavailable(status, hold_expires_at),
            // A lapsed hold that buyers wait for is theirs next.
            HoldDecision::Reclaim if seen.waitlist_length > 0 => {
                return unavailable(AssetStatus::Held, None)
            }
            HoldDecision::SaleNotOpen { .. } | HoldDecision::Claim | HoldDecision::Reclaim => {}
        }
        let offered = Reservation {
            metadata: req.metadata.clone(),
            via: Some(Via::Offer),
            ..Reservation::held(
                &req.asset_id,
                &req.buyer_id,
                &req.client,
                snap.now,
                req.expires_at,
            )
        };
        if let Some(offered) = make(store, req, offered, seen.decided).await? {
            return Ok(Keyed::Done(OfferOutcome::Created(Box::new(offered))));
        }
    }
    Err(contention("make the offer"))
}

/// Writes the offer while the asset is AVAILABLE and was free at `decided`
/// (a lapsed hold nobody swept yet is expired first); `None` when it was
/// taken or freed meanwhile, or the key was used concurrently.
async fn make(
    store: &Store,
    req: &OfferRequest,
    offered: Reservation,
    decided: Timestamp,
) -> StoreResult<Option<Reservation>> {
    let (store_, req) = (store.clone(), req.clone());
    store
        .write("make the offer", async move |conn| {
            let mut offered = offered;
            let now = offered.created_at;
            let asset = offered.asset_id.clone();
            expire_lapsed(conn, Lapsed::Of(&asset), now, store_.policy()).await?;
            if !give(conn, &mut offered, now, Claim::FreeAt(decided)).await? {
                return Err(Abort::Retry);
            }
            let answer = store_.render(Answer::Held(&offered));
            let event = about(
                &offered,
                EventType::ReservationHeld,
                answer.body.clone(),
                now,
            )
            .via(Some(Via::Offer))
            .by(&req.by);
            let keep = Keep {
                idempotency: &req.idempotency,
                answer: &answer,
                reservation_id: Some(&offered.reservation_id),
            };
            write_after(conn, &asset, None, vec![event], Some(keep), now).await?;
            Ok(offered)
        })
        .await
}
