//! Waiting lists and offers: queue for a held asset and be handed it in
//! turn; or be offered an asset by an admin, for a named buyer.

use actix_web::{delete, get, post, web, HttpResponse};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::access::{Caller, Guard};
use super::error::{respond, Answers, ApiResult};
use super::extract::{KeyedRequest, Validator};
use super::paths::{AssetPath, WaiterPath};
use super::State;
use crate::domain::{
    check_metadata, metadata_schema, parse_instant, BuyerId, FieldError, Metadata, WaitlistEntry,
};
use crate::reply::{self, Reply};
use crate::store::{Answer, JoinOutcome, JoinRequest, LeaveOutcome, OfferOutcome, OfferRequest};

/// A buyer joining an asset's queue.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JoinWaitlistRequest {
    #[schema(min_length = 1, max_length = 64, example = "buyer-4411")]
    pub buyer_id: String,
}

/// An admin's offer of an asset to a named buyer.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MakeOfferRequest {
    #[schema(min_length = 1, max_length = 64, example = "bidder-207")]
    pub buyer_id: String,
    /// The storefront client that owns the reservation (its API key's
    /// name; `-` in open mode): it sees it, releases or extends it.
    #[schema(example = "shop-eu")]
    pub client: String,
    /// When the offer lapses (RFC 3339): at least HOLDFAST_HOLD_SECONDS_MIN
    /// ahead, at most HOLDFAST_OFFER_MAX_DAYS (14 days).
    #[schema(value_type = String, format = DateTime, example = "2026-12-09T17:00:00Z")]
    pub expires_at: String,
    #[schema(schema_with = metadata_schema)]
    pub metadata: Option<Metadata>,
}

/// Queue a buyer for an asset held by someone else.
///
/// When the hold ends without a sale (it lapses or is released), the first
/// waiter gets the asset in the same transaction: a hold of
/// HOLDFAST_WAITLIST_HOLD_SECONDS (900) owned by its client, announced by
/// `reservation.held` with `"via": "waitlist"` (the webhook is how the shop
/// tells the buyer). A waiter that already has its most live holds is passed
/// over (`waitlist.skipped`). A sale or a withdrawal clears the queue
/// (`waitlist.cleared`). The same buyer of the same client again: 200 with
/// its entry. An AVAILABLE asset is simply held instead (409
/// WAITLIST_NOT_OPEN, as for a sold or withdrawn one, and for the buyer
/// who holds it).
#[utoipa::path(
    tag = "waitlists",
    params(AssetPath),
    request_body = JoinWaitlistRequest,
    responses(
        (status = 201, description = "Queued", body = WaitlistEntry),
        (status = 200, description = "Queued before (or a replay): the entry as it is",
         body = WaitlistEntry),
    )
)]
#[post("/v1/assets/{asset_id}/waitlist")]
pub async fn join_waitlist(
    request: KeyedRequest<JoinWaitlistRequest>,
    state: State,
    asset: AssetPath,
) -> ApiResult {
    let buyer_id = super::extract::checked("buyer_id", BuyerId::parse(&request.body.buyer_id))?;
    let join = JoinRequest {
        asset_id: asset.0,
        buyer_id,
        client: request.caller.name,
        idempotency: request.idempotency,
        arrived: request.arrived,
    };
    let outcome = state.store.join_waitlist(&join).await?;
    JOINS.keyed(outcome, |joined| match joined {
        JoinOutcome::Joined(entry) => {
            let answer = reply::answer(Answer::Waiting {
                entry: &entry,
                joined: true,
            });
            ("joined", answer)
        }
        JoinOutcome::Already(entry) => {
            let answer = reply::answer(Answer::Waiting {
                entry: &entry,
                joined: false,
            });
            ("unchanged", answer)
        }
        JoinOutcome::NotOpen(status) => ("not_open", reply::waitlist_not_open(status).into_reply()),
        JoinOutcome::Full { max } => ("full", reply::waitlist_full(max).into_reply()),
    })
}

/// An asset's waiting list.
#[derive(Debug, Serialize, ToSchema)]
pub struct Waitlist {
    /// In queue order. A storefront sees its own entries only (their
    /// positions count every waiter before them).
    pub items: Vec<WaitlistEntry>,
}

/// Read an asset's waiting list: a storefront its own entries, an admin all.
#[utoipa::path(
    tag = "waitlists",
    params(AssetPath),
    responses((status = 200, description = "The waiters, first first", body = Waitlist))
)]
#[get("/v1/assets/{asset_id}/waitlist")]
pub async fn list_waitlist(caller: Caller, state: State, asset: AssetPath) -> ApiResult {
    let items = state.store.waitlist(&asset.0, &caller.client()).await?;
    let list = items.map(|items| Waitlist { items });
    Ok(respond(Reply::json(
        200,
        &list.ok_or_else(reply::asset_not_found)?,
    )))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct LeaveWaitlistQuery {
    /// The client the buyer waits for: required of an admin, ignored for a
    /// storefront (it leaves its own buyers only).
    pub client: Option<String>,
}

/// Take a buyer off an asset's waiting list; those after it move up.
#[utoipa::path(
    tag = "waitlists",
    params(AssetPath, WaiterPath, LeaveWaitlistQuery),
    responses(
        (status = 204, description = "Left the queue"),
    )
)]
#[delete("/v1/assets/{asset_id}/waitlist/{buyer_id}")]
pub async fn leave_waitlist(
    caller: Caller,
    state: State,
    asset: AssetPath,
    buyer: WaiterPath,
    query: web::Query<LeaveWaitlistQuery>,
) -> ApiResult {
    let open = caller.role.is_none();
    let client = caller.client();
    let owner = match (client.own_only, &query.client) {
        (true, _) => client.name,
        (false, Some(named)) => named.clone(),
        // Open mode has one client.
        (false, None) if open => client.name,
        (false, None) => {
            let required = Err("an admin names the client the buyer waits for".to_owned());
            return Err(super::extract::checked::<()>("client", required).unwrap_err());
        }
    };
    let outcome = match state
        .store
        .leave_waitlist(&asset.0, &owner, &buyer.0)
        .await?
    {
        LeaveOutcome::Left => ("left", Ok(HttpResponse::NoContent().finish())),
        LeaveOutcome::NotQueued => ("not_found", Err(reply::waitlist_entry_not_found().into())),
        LeaveOutcome::NoAsset => ("not_found", Err(reply::asset_not_found().into())),
    };
    metrics::counter!("holdfast_waitlist_leaves_total", "outcome" => outcome.0).increment(1);
    outcome.1
}

/// Offer an AVAILABLE asset to a named buyer, until an absolute time.
///
/// A HELD reservation for the buyer, owned by the named storefront client:
/// a hold in every other way (the same commit, release, expiry and refund
/// of a late payment; `reservation.held` with `"via": "offer"`), except
/// that it does not count toward the buyer's limit of live holds, and that
/// `extend` may take it to HOLDFAST_OFFER_MAX_DAYS from its creation.
#[utoipa::path(
    tag = "waitlists",
    params(AssetPath),
    request_body = MakeOfferRequest,
    responses(
        (status = 201, description = "Offered", body = crate::domain::Reservation,
         headers(("Location" = String, description = "The reservation's URL"))),
        (status = 200, description = "Replay of an earlier 201 with the same key",
         body = crate::domain::Reservation),
    )
)]
#[post("/v1/assets/{asset_id}/offers")]
pub async fn make_offer(
    request: KeyedRequest<MakeOfferRequest>,
    state: State,
    guard: web::Data<Guard>,
    asset: AssetPath,
) -> ApiResult {
    let body = &request.body;
    let mut v = Validator::default();
    let buyer_id = v.check("buyer_id", BuyerId::parse(&body.buyer_id));
    let client = match guard.keys().is_storefront(&body.client) {
        true => Some(body.client.clone()),
        false => v.check(
            "client",
            Err("must name a configured storefront key".to_owned()),
        ),
    };
    let expires_at = v.check("expires_at", parse_instant(&body.expires_at));
    if let Some(metadata) = &body.metadata {
        v.fields(|errors| check_metadata(metadata, "metadata", errors));
    }
    let (Some(buyer_id), Some(client), Some(expires_at)) = (buyer_id, client, expires_at) else {
        return Err(v.failed());
    };
    v.finish()?;
    let offer = OfferRequest {
        asset_id: asset.0,
        buyer_id,
        client,
        expires_at,
        metadata: request.body.metadata.clone(),
        by: request.caller.name.clone(),
        idempotency: request.idempotency.clone(),
        arrived: request.arrived,
    };
    let outcome = state.store.offer(&offer).await?;
    OFFERS.keyed(outcome, |offered| match offered {
        OfferOutcome::Created(reservation) => {
            tracing::info!(reservation_id = %reservation.reservation_id, "asset offered");
            ("created", reply::answer(Answer::Held(&reservation)))
        }
        OfferOutcome::Unavailable(seen) => ("conflict", reply::asset_unavailable_reply(seen)),
        OfferOutcome::OutOfRange { earliest, latest } => {
            let message = format!(
                "must lie from {} to {}",
                crate::domain::format_timestamp(&earliest),
                crate::domain::format_timestamp(&latest)
            );
            let problem = reply::validation_failed(vec![FieldError::new("expires_at", message)]);
            ("rejected", problem.into_reply())
        }
    })
}

const JOINS: Answers = Answers::new(
    "holdfast_waitlist_join_requests_total",
    reply::asset_not_found,
);
const OFFERS: Answers = Answers::new("holdfast_offers_total", reply::asset_not_found);
