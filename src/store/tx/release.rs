//! The release: a buyer (or its storefront, or the payment system) gives a
//! live hold back; the asset is AVAILABLE at once.

use super::end_hold::end_live_hold;
use super::Target;
use crate::domain::{release_decision, ReleaseDecision};
use crate::store::api::{Keyed, ReleaseOutcome, ReleaseRequest};
use crate::store::db::Store;
use crate::store::error::StoreResult;

pub(crate) async fn release(
    store: &Store,
    req: &ReleaseRequest,
) -> StoreResult<Keyed<ReleaseOutcome>> {
    Target::new(
        "release the reservation",
        &req.reservation_id,
        &req.idempotency,
    )
    .seen_by(&req.client)
    .act(store, async |reservation, now, _| {
        Ok(match release_decision(reservation.status) {
            ReleaseDecision::Release => {
                end_live_hold(store, reservation, None, now, &req.idempotency)
                    .await?
                    .map(ReleaseOutcome::Released)
            }
            ReleaseDecision::AlreadyReleased => Some(ReleaseOutcome::AlreadyReleased(reservation)),
            ReleaseDecision::NotActive => Some(ReleaseOutcome::NotActive(reservation)),
        })
    })
    .await
}
