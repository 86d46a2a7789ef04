//! Refunds: the reconciliation list, and completion by the payment system.

use actix_web::{get, post, web};
use serde::Deserialize;
use utoipa::{IntoParams, ToSchema};

use super::access::Caller;
use super::error::{Answers, ApiResult};
use super::extract::{list_page, KeyedRequest, PageQuery, Validator};
use super::paths::RefundPath;
use super::State;
use crate::domain::{Refund, RefundId, RefundStatus};
use crate::reply::{self, Reply};
use crate::store::{
    Answer, CompleteRefundOutcome, CompleteRefundRequest, RefundPage, PAGE_DEFAULT,
};

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListRefundsQuery {
    /// Only refunds with this status, e.g. REQUESTED for those still to pay back.
    #[param(value_type = Option<RefundStatus>)]
    pub status: Option<String>,
    #[serde(flatten)]
    #[param(ignore)]
    pub page: PageQuery<PAGE_DEFAULT>,
}

list_page! {
    /// One page of refunds, oldest first.
    RefundList { items: Vec<Refund> }
}

/// Completion takes no body, or `{}`. Named `CompleteRefundRequest` in the
/// document, as every request schema is (the store has its own).
#[derive(Debug, Deserialize, ToSchema)]
#[schema(as = CompleteRefundRequest)]
#[serde(deny_unknown_fields)]
pub struct CompleteRefundBody {}

/// Refunds in creation order (keyset paged), for reconciliation.
#[utoipa::path(
    tag = "refunds",
    params(ListRefundsQuery, PageQuery<PAGE_DEFAULT>),
    responses(
        (status = 200, description = "One page of refunds", body = RefundList),
    )
)]
#[get("/v1/refunds")]
pub async fn list_refunds(
    _caller: Caller,
    state: State,
    query: web::Query<ListRefundsQuery>,
) -> ApiResult {
    let mut v = Validator::default();
    let status = v.optional("status", query.status.as_deref(), |s| {
        RefundStatus::parse(s).ok_or_else(|| "must be REQUESTED or COMPLETED".to_owned())
    });
    // The cursor of this list is the last refund's id as it is.
    let limit = v.limit(query.page.limit.as_deref(), 50);
    let after = v.optional("cursor", query.page.cursor.as_deref(), |c| {
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
    RefundList::page(items, limit, |r| r.refund_id.clone()).answer()
}

const COMPLETIONS: Answers =
    Answers::new("holdfast_refund_completions_total", reply::refund_not_found);

/// The payment system reports a refund paid back: REQUESTED becomes COMPLETED.
#[utoipa::path(
    tag = "refunds",
    params(RefundPath),
    request_body(content = Option<CompleteRefundBody>, description = "No body, or {}"),
    responses(
        (status = 200, description = "COMPLETED (now, before, or a replay)", body = Refund),
    )
)]
#[post("/v1/refunds/{refund_id}/complete")]
pub async fn complete_refund(
    request: KeyedRequest<CompleteRefundBody, true>,
    state: State,
    refund: RefundPath,
) -> ApiResult {
    let request = CompleteRefundRequest {
        refund_id: refund.0,
        idempotency: request.idempotency,
    };
    let outcome = state.store.complete_refund(&request).await?;
    COMPLETIONS.keyed(outcome, |completed| match completed {
        CompleteRefundOutcome::Completed(refund) => {
            metrics::counter!("holdfast_refunds_completed_total").increment(1);
            tracing::info!(refund_id = %request.refund_id, "refund completed");
            ("completed", reply::answer(Answer::RefundCompleted(&refund)))
        }
        CompleteRefundOutcome::AlreadyCompleted(refund) => ("unchanged", Reply::json(200, &refund)),
    })
}
