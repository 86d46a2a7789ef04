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
use super::State;
use crate::domain::{
    check_metadata, metadata_schema, parse_instant, printable_schema, AssetId, BuyerId, FieldError,
    Metadata, PaymentReference, Price, RefundReason, Reservation, ReservationId, ReservationStatus,
};
use crate::reply::{self, Reply};
use crate::store::{
    Answer, CommitOutcome, CommitRequest, ExtendOutcome, ExtendRequest, HoldOutcome, HoldRequest,
    Idempotency, ReleaseOutcome, ReleaseRequest, ReservationPage, Until, VoidOutcome, VoidRequest,
    PAGE_DEFAULT,
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
    /// The shop's own references, kept with the reservation.
    #[schema(schema_with = metadata_schema)]
    pub metadata: Option<Metadata>,
}

/// The payment system's confirmation.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CommitReservationRequest {
    #[schema(schema_with = payment_reference)]
    pub payment_reference: String,
    /// What the payment took. When the reservation has a price and this is
    /// another currency or less, the commit is refused (409
    /// PAYMENT_AMOUNT_MISMATCH) and the payment refunded; more is accepted.
    pub amount: Option<Price>,
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

/// How much longer a live hold should run: `hold_seconds` or `expires_at`,
/// one of the two.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExtendReservationRequest {
    /// The hold then lapses this many seconds from now (database clock),
    /// within HOLDFAST_HOLD_SECONDS_MIN..=HOLDFAST_HOLD_SECONDS_MAX; the whole
    /// hold may last at most HOLDFAST_HOLD_MAX_TOTAL_SECONDS from its creation
    /// (an offer: HOLDFAST_OFFER_MAX_DAYS).
    #[schema(minimum = 30, maximum = 3600, example = 300)]
    pub hold_seconds: Option<i64>,
    /// The hold then lapses at this instant (RFC 3339), ahead of now and
    /// within the same cap from its creation: how an offer is extended to a
    /// date.
    #[schema(value_type = Option<String>, format = DateTime, example = "2026-12-09T17:00:00Z")]
    pub expires_at: Option<String>,
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

/// Hold an asset for a buyer. One winner per asset; everyone else gets 409 at once.
#[utoipa::path(
    tag = "reservations",
    params(AssetPath),
    request_body = HoldAssetRequest,
    responses(
        (status = 201, description = "Held", body = Reservation,
         headers(("Location" = String, description = "The reservation's URL"))),
        (status = 200, description = "The buyer's own live hold of the asset (the same \
            buyer of the same client, say in a second tab), unchanged; or a replay of an \
            earlier answer with the same key (Idempotent-Replayed: true)", body = Reservation),
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
    if let Some(metadata) = &body.metadata {
        v.fields(|errors| check_metadata(metadata, "metadata", errors));
    }
    let (Some(buyer_id), Some(hold_seconds)) = (buyer_id, hold_seconds) else {
        return Err(v.failed());
    };
    v.finish()?;
    let span = tracing::Span::current();
    span.record("asset_id", asset.0.as_str());
    span.record("idempotency_key", request.idempotency.key.as_str());
    let request = HoldRequest {
        asset_id: asset.0,
        buyer_id,
        hold_seconds,
        client: request.caller.name,
        metadata: request.body.metadata,
        idempotency: request.idempotency,
        arrived: request.arrived,
    };
    let outcome = state.store.hold(&request).await?;
    HOLDS.keyed(outcome, |held| match held {
        HoldOutcome::Created(reservation) => {
            let reply = reply::answer(Answer::Held(&reservation));
            let buyer = request.buyer_id.as_str();
            let location = reply.location.as_deref();
            tracing::info!(location, buyer_id = buyer, "asset held");
            ("created", reply)
        }
        HoldOutcome::Own(reservation) => ("own", reply::answer(Answer::Changed(&reservation))),
        HoldOutcome::Unavailable(seen) => ("conflict", reply::asset_unavailable_reply(seen)),
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
    responses((status = 200, description = "The reservation", body = Reservation))
)]
#[get("/v1/reservations/{reservation_id}")]
pub async fn get_reservation(
    caller: Caller,
    state: State,
    reservation: ReservationPath,
) -> ApiResult {
    // Another storefront's reservation does not exist for this caller: it
    // is answered as a missing one is.
    match state
        .store
        .get_reservation(&reservation.0, &caller.client())
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
    let payment = checked("payment_reference", payment)?;
    if let Some(amount) = &request.body.amount {
        let mut v = Validator::default();
        v.fields(|errors| amount.check("amount", errors));
        v.finish()?;
    }
    let request = CommitRequest {
        payment_reference: payment,
        amount: request.body.amount,
        reservation_id: record_reservation(reservation.0, &request.idempotency),
        client: request.caller.name,
        idempotency: request.idempotency,
    };
    let outcome = state.store.commit(&request).await?;
    COMMITS.keyed(outcome, |committed| match committed {
        CommitOutcome::Committed(r) => {
            tracing::info!("reservation committed; asset sold");
            ("committed", reply::answer(Answer::Changed(&r)))
        }
        CommitOutcome::CommittedLate(r) => {
            tracing::info!("late payment accepted; asset was free and is sold");
            ("committed_late", reply::answer(Answer::Changed(&r)))
        }
        CommitOutcome::Refunded {
            reason,
            reservation,
            refund,
        } => {
            metrics::counter!("holdfast_refunds_requested_total", "reason" => reason.as_str())
                .increment(1);
            tracing::info!(reason = reason.as_str(), "commit refused; refund requested");
            let refused = Answer::Refused {
                reason,
                reservation: &reservation,
                refund: &refund,
            };
            (refusal(reason), reply::answer(refused))
        }
        CommitOutcome::Refused {
            reason,
            reservation,
            refund,
        } => {
            let refused = Answer::Refused {
                reason,
                reservation: &reservation,
                refund: &refund,
            };
            (refusal(reason), reply::answer(refused))
        }
        CommitOutcome::SaleVoided {
            reservation,
            refund,
        } => (
            "not_active",
            reply::sale_voided(&reservation, refund.as_ref()).into_reply(),
        ),
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
        client: request.caller.client(),
        idempotency: request.idempotency,
    };
    let outcome = state.store.release(&request).await?;
    RELEASES.keyed(outcome, |released| match released {
        ReleaseOutcome::Released(r) => {
            tracing::info!("reservation released; asset available");
            ("released", reply::answer(Answer::Changed(&r)))
        }
        ReleaseOutcome::AlreadyReleased(r) => ("unchanged", reply::reservation_ok(&r)),
        ReleaseOutcome::NotActive(r) => {
            ("not_active", reply::reservation_not_active(&r).into_reply())
        }
    })
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
    let body = &request.body;
    let until = match (body.hold_seconds, body.expires_at.as_deref()) {
        (Some(seconds), None) => {
            let seconds = state.api.hold_bounds.hold_seconds(Some(seconds));
            Until::Seconds(checked("hold_seconds", seconds)?)
        }
        (None, Some(at)) => Until::At(checked("expires_at", parse_instant(at))?),
        _ => {
            let one = Err("give hold_seconds or expires_at, one of the two".to_owned());
            return Err(checked::<()>("hold_seconds", one).unwrap_err());
        }
    };
    let request = ExtendRequest {
        reservation_id: record_reservation(reservation.0, &request.idempotency),
        until,
        client: request.caller.client(),
        idempotency: request.idempotency,
    };
    let outcome = state.store.extend(&request).await?;
    EXTENSIONS.keyed(outcome, |extended| match extended {
        ExtendOutcome::Extended(r) => {
            tracing::info!(expires_at = %r.expires_at, "hold extended");
            ("extended", reply::answer(Answer::Changed(&r)))
        }
        ExtendOutcome::NotAhead(_) => (
            "rejected",
            reply::validation_failed(vec![FieldError::new(
                "expires_at",
                "must be ahead of now (the database's clock)",
            )])
            .into_reply(),
        ),
        ExtendOutcome::NotActive(r) => {
            ("not_active", reply::reservation_not_active(&r).into_reply())
        }
        ExtendOutcome::LimitReached {
            reservation,
            max_total_seconds,
        } => (
            "limit_reached",
            reply::hold_extension_limit(&reservation, max_total_seconds).into_reply(),
        ),
    })
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
        client: request.caller.name,
        idempotency: request.idempotency,
    };
    let outcome = state.store.void(&request).await?;
    VOIDS.keyed(outcome, |voided| match voided {
        VoidOutcome::Voided(r) => {
            tracing::info!(refund = request.refund, "sale voided; asset available");
            ("voided", reply::answer(Answer::Changed(&r)))
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
    pub page: PageQuery<PAGE_DEFAULT>,
}

list_page! {
    /// One page of reservations, newest first.
    ReservationList { items: Vec<Reservation> }
}

/// List reservations, newest first (keyset paging), by buyer, asset and
/// effective status. A storefront key sees the reservations it made.
#[utoipa::path(
    tag = "reservations",
    params(ListReservationsQuery, PageQuery<PAGE_DEFAULT>),
    responses((status = 200, description = "One page of reservations", body = ReservationList))
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
            client: caller.client().own_filter().map(str::to_owned),
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
        RefundReason::AmountMismatch => "amount_mismatch",
    }
}
