//! Refunds: the reconciliation list, and completion by the payment system.

use actix_web::{get, post, web, HttpResponse};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::access::Caller;
use super::docs::IdempotencyKeyParam;
use super::error::{keyed, respond, ApiError};
use super::extract::{page_limit, page_of, KeyedRequest, Validator};
use super::paths::RefundPath;
use super::AppState;
use crate::domain::{Refund, RefundId, RefundStatus};
use crate::reply::{self, Reply};
use crate::store::{CompleteRefundOutcome, CompleteRefundRequest, RefundPage};

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListRefundsQuery {
    /// Only refunds with this status, e.g. REQUESTED for those still to pay back.
    #[param(value_type = Option<RefundStatus>)]
    pub status: Option<String>,
    /// Page size, 1 to 500 (default 50).
    #[param(value_type = Option<i64>, minimum = 1, maximum = 500)]
    pub limit: Option<String>,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

/// One page of refunds, oldest first.
#[derive(Debug, Serialize, ToSchema)]
pub struct RefundList {
    pub items: Vec<Refund>,
    /// Pass as `cursor` for the next page; null on the last page.
    pub next_cursor: Option<String>,
}

/// Completion takes no body, or `{}`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CompleteRefundBody {}

const LIMIT_DEFAULT: i64 = 50;

/// Refunds in creation order (keyset paged), for reconciliation.
#[utoipa::path(
    tag = "refunds",
    params(ListRefundsQuery),
    responses((status = 200, description = "One page of refunds", body = RefundList))
)]
#[get("/v1/refunds")]
pub async fn list_refunds(
    _caller: Caller,
    state: web::Data<AppState>,
    query: web::Query<ListRefundsQuery>,
) -> Result<HttpResponse, ApiError> {
    let mut v = Validator::default();
    let status = v.optional("status", query.status.as_deref(), |s| {
        RefundStatus::parse(s).ok_or_else(|| "must be REQUESTED or COMPLETED".to_owned())
    });
    // The cursor of this list is the last refund's id as it is.
    let limit = v
        .check("limit", page_limit(query.limit.as_deref(), LIMIT_DEFAULT))
        .unwrap_or(LIMIT_DEFAULT);
    let after = v.optional("cursor", query.cursor.as_deref(), |c| {
        RefundId::parse(c)
            .map(|id| id.to_string())
            .ok_or_else(|| "is not a cursor this service issued".to_owned())
    });
    v.finish()?;
    let items = state
        .store
        .list_refunds(&RefundPage {
            status,
            after,
            limit: limit + 1,
        })
        .await?;
    let (items, next_cursor) = page_of(items, limit, |r| r.refund_id.clone());
    Ok(respond(Reply::json(
        200,
        &RefundList { items, next_cursor },
    )))
}

/// The payment system reports a refund paid back: REQUESTED becomes COMPLETED.
#[utoipa::path(
    tag = "refunds",
    params(RefundPath, IdempotencyKeyParam),
    request_body(content = Option<CompleteRefundBody>, description = "No body, or {}"),
    responses(
        (status = 200, description = "COMPLETED (now, before, or a replay)", body = Refund,
         headers(("Idempotent-Replayed" = String, description = "`true` when this is the stored \
             answer to an earlier request with this key"))),
    )
)]
#[post("/v1/refunds/{refund_id}/complete")]
pub async fn complete_refund(
    request: KeyedRequest<CompleteRefundBody, true>,
    state: web::Data<AppState>,
    refund: RefundPath,
) -> Result<HttpResponse, ApiError> {
    let request = CompleteRefundRequest {
        refund_id: refund.0,
        idempotency: request.idempotency,
    };
    let outcome = state.store.complete_refund(&request).await?;
    let metric = "holdfast_refund_completions_total";
    keyed(
        metric,
        outcome,
        reply::refund_not_found,
        |completed| match completed {
            CompleteRefundOutcome::Completed(reply) => {
                metrics::counter!("holdfast_refunds_completed_total").increment(1);
                tracing::info!(refund_id = %request.refund_id, "refund completed");
                ("completed", reply)
            }
            CompleteRefundOutcome::AlreadyCompleted(refund) => {
                ("unchanged", Reply::json(200, &refund))
            }
        },
    )
}
