//! Liveness and readiness.

use std::time::Duration;

use actix_web::{get, HttpResponse};
use serde::Serialize;
use utoipa::ToSchema;

use super::error::{respond, ApiResult};
use super::State;
use crate::reply::{self, Reply};
use crate::store::WriteOutcome;

/// How long readiness waits for the database.
const READY_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    #[schema(example = "ok")]
    pub status: &'static str,
}

/// The process is alive.
#[utoipa::path(
    tag = "operations",
    responses((status = 200, description = "Alive", body = Health))
)]
#[get("/healthz")]
pub async fn get_health() -> HttpResponse {
    respond(Reply::json(200, &Health { status: "ok" }))
}

/// The database answers: the service can take traffic.
#[utoipa::path(
    tag = "operations",
    responses(
        (status = 200, description = "Ready", body = Health),
    )
)]
#[get("/readyz")]
pub async fn get_readiness(state: State) -> ApiResult {
    match tokio::time::timeout(READY_TIMEOUT, state.store.ping()).await {
        Ok(Ok(())) => Ok(respond(Reply::json(200, &Health { status: "ready" }))),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "not ready");
            Err(reply::service_unavailable(WriteOutcome::NotApplied).into())
        }
        Err(_) => Err(reply::service_unavailable(WriteOutcome::NotApplied).into()),
    }
}
