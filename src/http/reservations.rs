//! Reservations: hold, read, commit, release. Every POST takes an Idempotency-Key.

use actix_web::{get, post, web, HttpRequest, HttpResponse};
use serde::Deserialize;
use utoipa::ToSchema;

use super::access::Caller;
use super::docs::IdempotencyKeyParam;
use super::error::{respond, ApiError};
use super::extract::{IdempotencyKeyHeader, JsonBody, Validator};
use super::AppState;
use crate::domain::RefundReason;
use crate::domain::{AssetId, BuyerId, PaymentReference, Reservation, ReservationId};
use crate::reply::{self, Reply};
use crate::store::{
    CommitOutcome, CommitRequest, HoldOutcome, HoldRequest, ReleaseOutcome, ReleaseRequest,
};
use crate::telemetry::count;

/// A buyer's request to hold an asset.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HoldAssetRequest {
    /// The buyer, opaque to holdfast: 1 to 64 characters, no control characters.
    #[schema(
        min_length = 1,
        max_length = 64,
        pattern = "^[^\\x00-\\x1F\\x7F-\\x9F]+$",
        example = "buyer-4411"
    )]
    pub buyer_id: String,
    /// Hold length in seconds, default 600 (HOLDFAST_HOLD_SECONDS), within
    /// HOLDFAST_HOLD_SECONDS_MIN..=HOLDFAST_HOLD_SECONDS_MAX (by default 30..=3600,
    /// the bounds shown here).
    #[schema(minimum = 30, maximum = 3600, example = 600)]
    pub hold_seconds: Option<i64>,
}

/// The payment system's confirmation.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CommitReservationRequest {
    /// 1 to 128 characters, no control characters. Commits at most one reservation.
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = "^[^\\x00-\\x1F\\x7F-\\x9F]+$",
        example = "pay_7Hq2x9"
    )]
    pub payment_reference: String,
}

/// Release takes no body, or `{}`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReleaseReservationRequest {}

fn reservation_id(path: &str) -> Result<ReservationId, ApiError> {
    ReservationId::parse(path).ok_or_else(|| reply::reservation_not_found().into())
}

/// Hold an asset for a buyer. One winner per asset; everyone else gets 409 at once.
#[utoipa::path(
    tag = "reservations",
    operation_id = "hold_asset",
    params(
        ("asset_id" = String, Path, description = "The asset to hold", pattern = "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"),
        IdempotencyKeyParam,
    ),
    request_body = HoldAssetRequest,
    responses(
        (status = 201, description = "Held", body = Reservation,
         headers(("Location" = String, description = "The reservation's URL"))),
        (status = 200, description = "Replay of an earlier 201 with the same key", body = Reservation,
         headers(("Idempotent-Replayed" = String, description = "`true`: the stored answer to an earlier request with this key"), ("Location" = String, description = "The reservation's URL"))),
    )
)]
#[post("/v1/assets/{asset_id}/reservations")]
pub async fn hold_asset(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
    key: IdempotencyKeyHeader,
    path: web::Path<String>,
    body: JsonBody<HoldAssetRequest>,
) -> Result<HttpResponse, ApiError> {
    let mut v = Validator::default();
    let buyer_id = v.check("buyer_id", BuyerId::parse(&body.value.buyer_id));
    let hold_seconds = v.check(
        "hold_seconds",
        state
            .config
            .hold_bounds()
            .hold_seconds(body.value.hold_seconds),
    );
    v.finish()?;
    let (Some(buyer_id), Some(hold_seconds)) = (buyer_id, hold_seconds) else {
        return Err(reply::validation_failed(Vec::new()).into());
    };
    let asset_id = AssetId::parse(&path).map_err(|_| reply::asset_not_found())?;
    let span = tracing::Span::current();
    span.record("asset_id", asset_id.as_str());
    span.record("idempotency_key", key.0.as_str());
    let request = HoldRequest {
        asset_id,
        buyer_id,
        hold_seconds,
        owner: caller.name.clone(),
        max_live_holds: state.config.max_live_holds(),
        idempotency: caller.idempotency(key, &req, &body.canonical),
    };
    Ok(match state.store.hold(&request).await? {
        HoldOutcome::Created(reply) => {
            count("holdfast_holds_total", "created");
            tracing::info!(
                location = reply.location.as_deref(),
                buyer_id = request.buyer_id.as_str(),
                "asset held"
            );
            respond(reply)
        }
        HoldOutcome::Replayed(reply) => replayed("holdfast_holds_total", reply),
        HoldOutcome::KeyReused => {
            count("holdfast_holds_total", "rejected");
            return Err(reply::key_reused().into());
        }
        HoldOutcome::NotFound => {
            count("holdfast_holds_total", "not_found");
            return Err(reply::asset_not_found().into());
        }
        HoldOutcome::Unavailable {
            status,
            hold_expires_at,
        } => {
            count("holdfast_holds_total", "conflict");
            return Err(reply::asset_unavailable(status, hold_expires_at).into());
        }
        HoldOutcome::SaleNotOpen { available_from } => {
            count("holdfast_holds_total", "not_open");
            return Err(reply::sale_not_open(available_from).into());
        }
        HoldOutcome::LimitReached { limit } => {
            count("holdfast_holds_total", "limit_reached");
            return Err(reply::hold_limit_reached(limit).into());
        }
    })
}

/// Read a reservation with its effective status and refunds.
#[utoipa::path(
    tag = "reservations",
    operation_id = "get_reservation",
    params(("reservation_id" = String, Path, description = "res_ followed by a ULID", pattern = "^res_[0-9A-HJKMNP-TV-Z]{26}$")),
    responses(
        (status = 200, description = "The reservation", body = Reservation),
    )
)]
#[get("/v1/reservations/{reservation_id}")]
pub async fn get_reservation(
    state: web::Data<AppState>,
    caller: Caller,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let id = reservation_id(&path)?;
    let visible_to = caller.owner_filter();
    match state.store.get_reservation(&id).await? {
        // Another storefront's reservation does not exist for this caller.
        Some(r) if visible_to.as_ref().is_none_or(|o| &r.owner == o) => {
            Ok(respond(Reply::json(200, &r)))
        }
        _ => Err(reply::reservation_not_found().into()),
    }
}

/// Commit a hold once paid: the asset is SOLD. A payment that cannot be
/// honoured is answered 409 with the refund it triggered.
#[utoipa::path(
    tag = "reservations",
    operation_id = "commit_reservation",
    params(
        ("reservation_id" = String, Path, description = "res_ followed by a ULID", pattern = "^res_[0-9A-HJKMNP-TV-Z]{26}$"),
        IdempotencyKeyParam,
    ),
    request_body = CommitReservationRequest,
    responses(
        (status = 200, description = "COMMITTED (or already committed with this payment, or a replay)", body = Reservation,
         headers(("Idempotent-Replayed" = String, description = "`true` when this is the stored answer to an earlier request with this key"))),
    )
)]
#[post("/v1/reservations/{reservation_id}/commit")]
pub async fn commit_reservation(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
    key: IdempotencyKeyHeader,
    path: web::Path<String>,
    body: JsonBody<CommitReservationRequest>,
) -> Result<HttpResponse, ApiError> {
    let mut v = Validator::default();
    let payment = v.check(
        "payment_reference",
        PaymentReference::parse(&body.value.payment_reference),
    );
    v.finish()?;
    let Some(payment_reference) = payment else {
        return Err(reply::validation_failed(Vec::new()).into());
    };
    let request = CommitRequest {
        reservation_id: record_reservation(reservation_id(&path)?, &key),
        payment_reference,
        idempotency: caller.idempotency(key, &req, &body.canonical),
    };
    const COMMITS: &str = "holdfast_commits_total";
    Ok(match state.store.commit(&request).await? {
        CommitOutcome::Committed(reply) => {
            count(COMMITS, "committed");
            tracing::info!("reservation committed; asset sold");
            respond(reply)
        }
        CommitOutcome::Refunded { reply, reason } => {
            count(COMMITS, refusal(reason));
            metrics::counter!("holdfast_refunds_requested_total", "reason" => reason.as_str())
                .increment(1);
            tracing::info!(reason = reason.as_str(), "commit refused; refund requested");
            respond(reply)
        }
        CommitOutcome::Refused { reply, reason } => {
            count(COMMITS, refusal(reason));
            respond(reply)
        }
        CommitOutcome::Replayed(reply) => replayed(COMMITS, reply),
        CommitOutcome::AlreadyCommitted(r) => {
            count(COMMITS, "unchanged");
            respond(reply::reservation_ok(&r))
        }
        CommitOutcome::PaymentReferenceUsed(r) => {
            count(COMMITS, "payment_reference_used");
            respond(reply::payment_reference_used(&r).into_reply())
        }
        CommitOutcome::KeyReused => {
            count(COMMITS, "rejected");
            return Err(reply::key_reused().into());
        }
        CommitOutcome::NotFound => {
            count(COMMITS, "not_found");
            return Err(reply::reservation_not_found().into());
        }
    })
}

/// Release a hold: the asset is AVAILABLE at once.
#[utoipa::path(
    tag = "reservations",
    operation_id = "release_reservation",
    params(
        ("reservation_id" = String, Path, description = "res_ followed by a ULID", pattern = "^res_[0-9A-HJKMNP-TV-Z]{26}$"),
        IdempotencyKeyParam,
    ),
    request_body(content = Option<ReleaseReservationRequest>, description = "No body, or {}"),
    responses(
        (status = 200, description = "RELEASED (or released before, or a replay)", body = Reservation,
         headers(("Idempotent-Replayed" = String, description = "`true` when this is the stored answer to an earlier request with this key"))),
    )
)]
#[post("/v1/reservations/{reservation_id}/release")]
pub async fn release_reservation(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
    key: IdempotencyKeyHeader,
    path: web::Path<String>,
    body: JsonBody<ReleaseReservationRequest, true>,
) -> Result<HttpResponse, ApiError> {
    let request = ReleaseRequest {
        reservation_id: record_reservation(reservation_id(&path)?, &key),
        visible_to: caller.owner_filter(),
        idempotency: caller.idempotency(key, &req, &body.canonical),
    };
    const RELEASES: &str = "holdfast_releases_total";
    Ok(match state.store.release(&request).await? {
        ReleaseOutcome::Released(reply) => {
            count(RELEASES, "released");
            tracing::info!("reservation released; asset available");
            respond(reply)
        }
        ReleaseOutcome::Replayed(reply) => replayed(RELEASES, reply),
        ReleaseOutcome::AlreadyReleased(r) => {
            count(RELEASES, "unchanged");
            respond(reply::reservation_ok(&r))
        }
        ReleaseOutcome::NotActive(r) => {
            count(RELEASES, "not_active");
            respond(reply::reservation_not_active(&r).into_reply())
        }
        ReleaseOutcome::KeyReused => {
            count(RELEASES, "rejected");
            return Err(reply::key_reused().into());
        }
        ReleaseOutcome::NotFound => {
            count(RELEASES, "not_found");
            return Err(reply::reservation_not_found().into());
        }
    })
}

/// Names the reservation and key in the request's span.
fn record_reservation(id: ReservationId, key: &IdempotencyKeyHeader) -> ReservationId {
    let span = tracing::Span::current();
    span.record("reservation_id", id.to_string());
    span.record("idempotency_key", key.0.as_str());
    id
}

fn replayed(metric: &'static str, reply: Reply) -> HttpResponse {
    count(metric, "replayed");
    metrics::counter!("holdfast_idempotency_replays_total").increment(1);
    respond(reply)
}

/// The commit outcome label of a refused payment.
fn refusal(reason: RefundReason) -> &'static str {
    match reason {
        RefundReason::HoldExpired => "hold_expired",
        RefundReason::ReservationReleased | RefundReason::SaleVoided => "not_active",
        RefundReason::AlreadyCommitted => "already_committed",
    }
}
