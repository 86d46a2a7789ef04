//! Payments: what became of a payment reference, for reconciliation and for
//! a payment system whose idempotency key is lost.

use actix_web::{get, web};
use serde::Deserialize;
use utoipa::IntoParams;

use super::access::Caller;
use super::error::{respond, ApiResult};
use super::paths::PaymentPath;
use super::State;
use crate::domain::{FieldError, Payment};
use crate::keys::{self, Role};
use crate::reply::{self, Reply};

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PaymentQuery {
    /// Admins: the payments client (API key name) whose reference this is;
    /// without it, every client's. Others always read their own.
    #[param(pattern = "^[A-Za-z0-9._-]+$")]
    pub client: Option<String>,
}

/// The fate of a payment reference: the reservation it bought, or its one
/// refund.
///
/// References are scoped by the payments client's key name, so a payments
/// key reads its own references. Sales recorded before references were
/// scoped count for every client.
#[utoipa::path(
    tag = "payments",
    params(PaymentPath, PaymentQuery),
    responses((status = 200, description = "The payment and its fate", body = Payment))
)]
#[get("/v1/payments/{payment_reference}")]
pub async fn get_payment(
    caller: Caller,
    state: State,
    payment: PaymentPath,
    query: web::Query<PaymentQuery>,
) -> ApiResult {
    let reference = payment.0;
    if let Some(client) = query.client.as_deref().filter(|c| !keys::is_key_name(c)) {
        return Err(reply::validation_failed(vec![FieldError::new(
            "client",
            format!("{client:?} is not an API key's name (letters, digits, '.', '_', '-')"),
        )])
        .into());
    }
    let scope = match (caller.role, &query.client) {
        // Admins (and open mode) may name any client, or ask across all.
        (Some(Role::Admin) | None, client) => client.as_deref(),
        (_, Some(client)) if *client != caller.name => {
            return Err(reply::payment_not_found().into())
        }
        _ => Some(caller.name.as_str()),
    };
    let mut found = state.store.payments(scope, &reference).await?;
    match found.len() {
        0 => Err(reply::payment_not_found().into()),
        1 => {
            let (_, payment) = found.remove(0);
            Ok(respond(Reply::json(200, &payment)))
        }
        _ => {
            let clients: Vec<String> = found.into_iter().map(|(scope, _)| scope).collect();
            Err(reply::validation_failed(vec![FieldError::new(
                "client",
                format!(
                    "several clients used this reference ({}); name one",
                    clients.join(", ")
                ),
            )])
            .into())
        }
    }
}
