//! Reservations: hold, read, commit, release, extend, void, list. Every POST
//! takes an Idempotency-Key.

use actix_web::{get, post, web};
use serde::Deserialize;
use utoipa::openapi::schema::ObjectBuilder;
use utoipa::{IntoParams, ToSchema};

use super::access::Caller;
use super::error::{respond, Answers, ApiResult};
use super::extract::{checked, cursor_of, list_page, KeyedRequest, PageQuery, Validator};
use super::paths::{AssetPath, ReservationPath};
use super::{LateCommit, State};
use crate::domain::{
    printable_schema, AssetId, BuyerId, PaymentReference, RefundReason, Reservation, ReservationId,
    ReservationStatus,
};
use crate::reply::{self, Reply};
use crate::store::{
    CommitOutcome, CommitRequest, ExtendOutcome, ExtendRequest, HoldOutcome, HoldRequest,
    Idempotency, ReleaseOutcome, ReleaseRequest, ReservationPage, VoidOutcome, VoidRequest,
};

/// A buyer's request to hold an asset.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HoldAssetRequest {
    #[schema(schema_with = buyer_id)]
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
    #[schema(schema_with = payment_reference)]
    pub payment_reference: String,
}

fn buyer_id() -> ObjectBuilder {
    printable_schema(BuyerId::MAX_LEN, "buyer-4411").description(Some(
        "The buyer, opaque to holdfast: 1 to 64 characters, no control characters.",
    ))
}

fn payment_reference() -> ObjectBuilder {
    printable_schema(PaymentReference::MAX_LEN, "pay_7Hq2x9").description(Some(
        "1 to 128 characters, no control characters. Has exactly one fate: it\n\
         buys one reservation, or it is refunded once. Scoped by the payments\n\
         client's API key name.",
    ))
}

/// Release takes no body, or `{}`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReleaseReservationRequest {}

/// Hold an asset for a buyer. One winner per asset; everyone else gets 409 at once.
#[utoipa::path(
    tag = "reservations",
    params(AssetPath),
    request_body = HoldAssetRequest,
    responses(
        (status = 201, description = "Held", body = Reservation,
         headers(("Location" = String, description = "The reservation's URL"))),
        (status = 200, description = "Replay of an earlier 201 with the same \
            key", body = Reservation,
         headers(("Idempotent-Replayed" = String, description = "`true`: the stored answer to an \
             earlier request with this key"), ("Location" = String, description = "The \
                 reservation's URL"))),
    )
)]
#[post("/v1/assets/{asset_id}/reservations")]
pub async fn hold_asset(
    request: KeyedRequest<HoldAssetRequest>,
    state: State,
    asset: AssetPath,
) -> ApiResult {
    let body = &request.body;
    let mut v = Validator::default();
    let buyer_id = v.check("buyer_id", BuyerId::parse(&body.buyer_id));
    let hold_seconds = state.api.hold_bounds.hold_seconds(body.hold_seconds);
    let hold_seconds = v.check("hold_seconds", hold_seconds);
    let (Some(buyer_id), Some(hold_seconds)) = (buyer_id, hold_seconds) else {
        return Err(v.failed());
    };
    let span = tracing::Span::current();
    span.record("asset_id", asset.0.as_str());
    span.record("idempotency_key", request.idempotency.key.as_str());
    let request = HoldRequest {
        asset_id: asset.0,
        buyer_id,
        hold_seconds,
        owner: request.caller.name,
        max_live_holds: state.api.max_live_holds,
        idempotency: request.idempotency,
    };
    let outcome = state.store.hold(&request).await?;
    HOLDS.keyed(outcome, |held| match held {
        HoldOutcome::Created(reply) => {
            let buyer = request.buyer_id.as_str();
            let location = reply.location.as_deref();
            tracing::info!(location, buyer_id = buyer, "asset held");
            ("created", reply)
        }
        HoldOutcome::Unavailable {
            status,
            hold_expires_at,
        } => (
            "conflict",
            reply::asset_unavailable_reply(status, hold_expires_at),
        ),
        HoldOutcome::SaleNotOpen { available_from } => (
            "not_open",
            reply::sale_not_open(available_from).into_reply(),
        ),
        HoldOutcome::LimitReached { limit } => (
            "limit_reached",
            reply::hold_limit_reached(limit).into_reply(),
        ),
    })
}

/// Read a reservation with its effective status and refunds.
#[utoipa::path(
    tag = "reservations",
    params(ReservationPath),
    responses(
        (status = 200, description = "The reservation", body = Reservation),
    )
)]
#[get("/v1/reservations/{reservation_id}")]
pub async fn get_reservation(
    caller: Caller,
    state: State,
    reservation: ReservationPath,
) -> ApiResult {
    // Another storefront's reservation does not exist for this caller: the
    // query itself filters by owner, so it costs what a missing one costs.
    let visible_to = caller.owner_filter();
    match state
        .store
        .get_reservation(&reservation.0, visible_to.as_deref())
        .await?
    {
        Some(r) => Ok(respond(Reply::json(200, &r))),
        None => Err(reply::reservation_not_found().into()),
    }
}

/// Commit a hold once paid: the asset is SOLD. A payment that cannot be
/// honoured is answered 409 with its one refund.
///
/// Each payment reference has exactly one fate, decided first:
///
/// | the payment reference | the reservation | answer | refund |
/// |---|---|---|---|
/// | has a fate through another reservation | any | 409 PAYMENT_REFERENCE_USED | none |
/// | was refunded through this reservation | any | 409 as before | the same one |
/// | bought this reservation | COMMITTED | 200 | none |
/// | bought this reservation | VOIDED | 409 RESERVATION_NOT_ACTIVE | none new |
/// | no fate yet | HELD (live) | 200, COMMITTED, asset SOLD | none |
/// | no fate yet | EXPIRED | 409 HOLD_EXPIRED | HOLD_EXPIRED |
/// | no fate yet | RELEASED | 409 RESERVATION_NOT_ACTIVE | RESERVATION_RELEASED |
/// | no fate yet | COMMITTED | 409 ALREADY_COMMITTED | ALREADY_COMMITTED |
/// | no fate yet | VOIDED | 409 RESERVATION_NOT_ACTIVE | SALE_VOIDED |
///
/// PAYMENT_REFERENCE_USED has no `refund` member; its `payment` says what the
/// payment did. A voided sale's own payment was settled by the void.
/// However often and wherever a payment is sent, it is never both kept and
/// refunded, nor refunded twice. `GET /v1/payments/{payment_reference}`
/// answers its fate.
#[utoipa::path(
    tag = "reservations",
    params(ReservationPath),
    request_body = CommitReservationRequest,
    responses(
        (status = 200, description = "COMMITTED (or already committed with this payment, or a \
            replay)", body = Reservation),
    )
)]
#[post("/v1/reservations/{reservation_id}/commit")]
pub async fn commit_reservation(
    request: KeyedRequest<CommitReservationRequest>,
    state: State,
    reservation: ReservationPath,
) -> ApiResult {
    let payment = PaymentReference::parse(&request.body.payment_reference);
    let request = CommitRequest {
        payment_reference: checked("payment_reference", payment)?,
        reservation_id: record_reservation(reservation.0, &request.idempotency),
        payment_scope: request.caller.name,
        idempotency: request.idempotency,
        accept_late: state.api.late_commit == LateCommit::AcceptIfFree,
    };
    let outcome = state.store.commit(&request).await?;
    COMMITS.keyed(outcome, |committed| match committed {
        CommitOutcome::Committed(reply) => {
            tracing::info!("reservation committed; asset sold");
            ("committed", reply)
        }
        CommitOutcome::CommittedLate(reply) => {
            tracing::info!("late payment accepted; asset was free and is sold");
            ("committed_late", reply)
        }
        CommitOutcome::Refunded { reply, reason } => {
            metrics::counter!("holdfast_refunds_requested_total", "reason" => reason.as_str())
                .increment(1);
            tracing::info!(reason = reason.as_str(), "commit refused; refund requested");
            (refusal(reason), reply)
        }
        CommitOutcome::Refused { reply, reason } => (refusal(reason), reply),
        CommitOutcome::SaleVoided(reply) => ("not_active", reply),
        CommitOutcome::AlreadyCommitted(r) => ("unchanged", reply::reservation_ok(&r)),
        CommitOutcome::PaymentReferenceUsed {
            reservation,
            payment,
        } => (
            "payment_reference_used",
            reply::payment_reference_used(&reservation, &payment).into_reply(),
        ),
    })
}

/// Release a hold: the asset is AVAILABLE at once.
#[utoipa::path(
    tag = "reservations",
    params(ReservationPath),
    request_body(content = Option<ReleaseReservationRequest>, description = "No body, or {}"),
    responses(
        (status = 200, description = "RELEASED (or released before, or a \
            replay)", body = Reservation),
    )
)]
#[post("/v1/reservations/{reservation_id}/release")]
pub async fn release_reservation(
    request: KeyedRequest<ReleaseReservationRequest, true>,
    state: State,
    reservation: ReservationPath,
) -> ApiResult {
    let request = ReleaseRequest {
        reservation_id: record_reservation(reservation.0, &request.idempotency),
        visible_to: request.caller.owner_filter(),
        idempotency: request.idempotency,
    };
    let outcome = state.store.release(&request).await?;
    RELEASES.keyed(outcome, |released| match released {
        ReleaseOutcome::Released(reply) => {
            tracing::info!("reservation released; asset available");
            ("released", reply)
        }
        ReleaseOutcome::AlreadyReleased(r) => ("unchanged", reply::reservation_ok(&r)),
        ReleaseOutcome::NotActive(r) => {
            ("not_active", reply::reservation_not_active(&r).into_reply())
        }
    })
}

/// How much longer a live hold should run.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExtendReservationRequest {
    /// The hold then lapses this many seconds from now (database clock),
    /// within HOLDFAST_HOLD_SECONDS_MIN..=HOLDFAST_HOLD_SECONDS_MAX; the whole
    /// hold may last at most HOLDFAST_HOLD_MAX_TOTAL_SECONDS from its creation.
    #[schema(minimum = 30, maximum = 3600, example = 300)]
    pub hold_seconds: i64,
}

/// Extend a live hold while a slow payment runs.
///
/// One conditional update sets the hold's expiry to now + `hold_seconds`.
/// A hold that is no longer live answers 409 RESERVATION_NOT_ACTIVE; one that
/// would outlive HOLDFAST_HOLD_MAX_TOTAL_SECONDS from its creation, 409
/// HOLD_EXTENSION_LIMIT. Event `reservation.extended`.
#[utoipa::path(
    tag = "reservations",
    params(ReservationPath),
    request_body = ExtendReservationRequest,
    responses(
        (status = 200, description = "The hold with its new expiry (or a \
            replay)", body = Reservation),
    )
)]
#[post("/v1/reservations/{reservation_id}/extend")]
pub async fn extend_reservation(
    request: KeyedRequest<ExtendReservationRequest>,
    state: State,
    reservation: ReservationPath,
) -> ApiResult {
    let hold_seconds = state
        .api
        .hold_bounds
        .hold_seconds(Some(request.body.hold_seconds));
    let hold_seconds = checked("hold_seconds", hold_seconds)?;
    let request = ExtendRequest {
        reservation_id: record_reservation(reservation.0, &request.idempotency),
        hold_seconds,
        max_total_seconds: state.api.hold_max_total_seconds,
        visible_to: request.caller.owner_filter(),
        idempotency: request.idempotency,
    };
    let outcome = state.store.extend(&request).await?;
    EXTENSIONS.keyed(outcome, |extended| match extended {
        ExtendOutcome::Extended(reply) => {
            tracing::info!(hold_seconds, "hold extended");
            ("extended", reply)
        }
        ExtendOutcome::NotActive(r) => {
            ("not_active", reply::reservation_not_active(&r).into_reply())
        }
        ExtendOutcome::LimitReached(r) => (
            "limit_reached",
            reply::hold_extension_limit(&r, request.max_total_seconds).into_reply(),
        ),
    })
}

/// Voiding takes no body, `{}`, or `{"refund": false}`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VoidReservationRequest {
    /// Give the payment back with a SALE_VOIDED refund (default). False when
    /// the money already went back, e.g. by a chargeback.
    #[serde(default = "yes")]
    pub refund: bool,
}

impl Default for VoidReservationRequest {
    fn default() -> Self {
        Self { refund: true }
    }
}

fn yes() -> bool {
    true
}

/// Undo a sale, for a defaulting bidder or a chargeback.
///
/// COMMITTED becomes VOIDED and the asset AVAILABLE again; unless
/// `{"refund": false}` (the money went back outside holdfast, e.g. a
/// chargeback), the payment is given back with a SALE_VOIDED refund. Either
/// way that is part of the payment's one fate: a later commit of this
/// reservation with it answers 409 RESERVATION_NOT_ACTIVE and refunds
/// nothing new (another payment is refunded). Voiding a voided sale changes
/// nothing. Events `reservation.voided` and `refund.requested`, naming the
/// API key that voided it as `actor`.
#[utoipa::path(
    tag = "reservations",
    params(ReservationPath),
    request_body(content = Option<VoidReservationRequest>, description = "Optional"),
    responses(
        (status = 200, description = "VOIDED, with its refund (or voided before, or a \
            replay)", body = Reservation),
    )
)]
#[post("/v1/reservations/{reservation_id}/void")]
pub async fn void_reservation(
    request: KeyedRequest<VoidReservationRequest, true>,
    state: State,
    reservation: ReservationPath,
) -> ApiResult {
    let request = VoidRequest {
        reservation_id: record_reservation(reservation.0, &request.idempotency),
        refund: request.body.refund,
        actor: request.caller.name,
        idempotency: request.idempotency,
    };
    let outcome = state.store.void(&request).await?;
    VOIDS.keyed(outcome, |voided| match voided {
        VoidOutcome::Voided(reply) => {
            tracing::info!(refund = request.refund, "sale voided; asset available");
            ("voided", reply)
        }
        VoidOutcome::AlreadyVoided(r) => ("unchanged", reply::reservation_ok(&r)),
        VoidOutcome::NotActive(r) => ("not_active", reply::reservation_not_active(&r).into_reply()),
    })
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListReservationsQuery {
    /// Only this buyer's reservations.
    pub buyer_id: Option<String>,
    /// Only reservations of this asset.
    pub asset_id: Option<String>,
    /// Only reservations with this effective status.
    #[param(value_type = Option<ReservationStatus>)]
    pub status: Option<String>,
    #[serde(flatten)]
    #[param(ignore)]
    pub page: PageQuery<50>,
}

list_page! {
    /// One page of reservations, newest first.
    ReservationList { items: Vec<Reservation> }
}

/// List reservations, newest first (keyset paging), by buyer, asset and
/// effective status. A storefront key sees the reservations it made.
#[utoipa::path(
    tag = "reservations",
    params(ListReservationsQuery, PageQuery<50>),
    responses(
        (status = 200, description = "One page of reservations", body = ReservationList),
    )
)]
#[get("/v1/reservations")]
pub async fn list_reservations(
    caller: Caller,
    state: State,
    query: web::Query<ListReservationsQuery>,
) -> ApiResult {
    let mut v = Validator::default();
    let buyer_id = v.optional("buyer_id", query.buyer_id.as_deref(), |b| {
        BuyerId::parse(b).map(BuyerId::into_inner)
    });
    let asset_id = v.optional("asset_id", query.asset_id.as_deref(), |a| {
        AssetId::parse(a).map(AssetId::into_inner)
    });
    let status = v.optional(
        "status",
        query.status.as_deref(),
        ReservationStatus::parse_or_list,
    );
    let page = v.page(&query.page, |id| {
        ReservationId::parse(id).map(|_| id.to_owned())
    });
    v.finish()?;
    let items = state
        .store
        .list_reservations(&ReservationPage {
            buyer_id,
            asset_id,
            status,
            owner: caller.owner_filter(),
            before: page.after,
            limit: page.limit + 1,
        })
        .await?;
    ReservationList::page(items, page.limit, |r| cursor_of(&r.reservation_id)).answer()
}

const HOLDS: Answers = Answers::new("holdfast_holds_total", reply::asset_not_found);
const COMMITS: Answers = Answers::new("holdfast_commits_total", reply::reservation_not_found);
const RELEASES: Answers = Answers::new("holdfast_releases_total", reply::reservation_not_found);
const EXTENSIONS: Answers = Answers::new("holdfast_extensions_total", reply::reservation_not_found);
const VOIDS: Answers = Answers::new("holdfast_voids_total", reply::reservation_not_found);

/// Names the reservation and key in the request's span.
fn record_reservation(id: ReservationId, idempotency: &Idempotency) -> ReservationId {
    let span = tracing::Span::current();
    span.record("reservation_id", id.to_string());
    span.record("idempotency_key", idempotency.key.as_str());
    id
}

/// The commit outcome label of a refused payment.
fn refusal(reason: RefundReason) -> &'static str {
    match reason {
        RefundReason::HoldExpired => "hold_expired",
        RefundReason::ReservationReleased | RefundReason::SaleVoided => "not_active",
        RefundReason::AlreadyCommitted => "already_committed",
    }
}
