//! Problem+json answers (RFC 9457) and the one place where failures become statuses.

use actix_web::body::BoxBody;
use actix_web::dev::ServiceResponse;
use actix_web::http::header::{self, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};

use super::operations;
use crate::reply::{self, ErrorCode, Problem, Reply};
use crate::store::{Keyed, StoreError, WriteOutcome};
use crate::telemetry::count;

pub const PROBLEM_JSON: &str = "application/problem+json";

/// The header that marks an answer stored under an `Idempotency-Key` and
/// sent again.
pub const REPLAYED: &str = "Idempotent-Replayed";

/// What a handler answers.
pub type ApiResult = Result<HttpResponse, ApiError>;

/// Seconds a client should wait before retrying a 503.
const RETRY_AFTER_SECONDS: &str = "1";

/// Everything a handler can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{}: {}", .0.code.as_str(), .0.message)]
    Problem(Problem),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("rate limited for {retry_after} s")]
    Limited { retry_after: u64 },
    /// No valid API key; `page` when a browser opened a console page, whose
    /// challenge invites HTTP Basic.
    #[error("unauthenticated")]
    Unauthenticated { page: bool },
}

impl From<Problem> for ApiError {
    fn from(p: Problem) -> Self {
        ApiError::Problem(p)
    }
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError::Problem(Problem::new(code, message))
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::Problem(p) => {
                StatusCode::from_u16(p.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
            }
            ApiError::Store(e) if e.is_unavailable() => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::Limited { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Unauthenticated { .. } => StatusCode::UNAUTHORIZED,
        }
    }

    fn error_response(&self) -> HttpResponse {
        match self {
            ApiError::Problem(p) => respond(p.clone().into_reply()),
            ApiError::Store(e) if e.is_unavailable() => {
                metrics::counter!("holdfast_db_errors_total", "kind" => e.kind()).increment(1);
                tracing::warn!(error = %e, "database unavailable");
                respond(reply::service_unavailable(e.write_outcome()).into_reply())
            }
            ApiError::Store(e) => {
                metrics::counter!("holdfast_db_errors_total", "kind" => e.kind()).increment(1);
                tracing::error!(error = %error_chain(e), "request failed");
                let problem = Problem::new(
                    ErrorCode::Internal,
                    "An internal error occurred; nothing about it is shown here.",
                );
                respond(problem.into_reply())
            }
            ApiError::Limited { retry_after } => {
                let mut response = respond(
                    Problem::new(
                        ErrorCode::RateLimited,
                        "Too many requests from this client; see Retry-After.",
                    )
                    .into_reply(),
                );
                if let Ok(value) = HeaderValue::from_str(&retry_after.to_string()) {
                    response.headers_mut().insert(header::RETRY_AFTER, value);
                }
                response
            }
            ApiError::Unauthenticated { page } => {
                let message = if *page {
                    "Sign in with an API key as the password (any user name), \
                     or send Authorization: Bearer <token>."
                } else {
                    "Send a valid API key as Authorization: Bearer <token>."
                };
                let reply = Problem::new(ErrorCode::Unauthenticated, message).into_reply();
                challenged(respond(reply), *page)
            }
        }
    }
}

/// The challenge of a 401: pages a person opens in a browser invite HTTP
/// Basic, so that the browser asks for the key.
fn challenge(page: bool) -> &'static str {
    if page {
        r#"Basic realm="holdfast console", charset="UTF-8""#
    } else {
        "Bearer"
    }
}

/// Adds the challenge to a 401.
pub fn challenged(mut response: actix_web::HttpResponse, page: bool) -> actix_web::HttpResponse {
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static(challenge(page)),
    );
    response
}

/// A 503 whose COMMIT may have been sent, told in the words of the operation
/// that answered it: one without an Idempotency-Key has no stored answer to
/// replay, so its client reads the resource back instead.
pub fn fit_unconfirmed(response: ServiceResponse<BoxBody>) -> ServiceResponse<BoxBody> {
    let unconfirmed = response
        .response()
        .error()
        .and_then(|e| e.as_error::<ApiError>())
        .is_some_and(|e| {
            matches!(e, ApiError::Store(s)
                if s.is_unavailable() && s.write_outcome() == WriteOutcome::Unknown)
        });
    let keyed = response
        .request()
        .match_name()
        .and_then(operations::find)
        .is_some_and(|op| op.keyed());
    if !unconfirmed || keyed {
        return response;
    }
    let (req, _) = response.into_parts();
    ServiceResponse::new(req, respond(reply::unconfirmed_without_key().into_reply()))
}

/// The error and its causes, for the log only.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// Sends a reply: its status, its exact body, Location, and the replay mark.
pub fn respond(reply: Reply) -> HttpResponse {
    let status = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = HttpResponse::build(status);
    response.content_type(if reply.problem {
        PROBLEM_JSON
    } else {
        "application/json"
    });
    if let Some(location) = reply
        .location
        .as_deref()
        .and_then(|l| HeaderValue::from_str(l).ok())
    {
        response.insert_header((header::LOCATION, location));
    }
    if reply.replayed {
        response.insert_header((REPLAYED, "true"));
    }
    if reply.status == 503 {
        response.insert_header((header::RETRY_AFTER, RETRY_AFTER_SECONDS));
    }
    response.body(reply.body)
}

/// How one operation's answers are counted: the metric of its outcomes,
/// and the problem it answers when its target does not exist.
#[derive(Debug, Clone, Copy)]
pub struct Answers {
    pub metric: &'static str,
    pub missing: fn() -> Problem,
}

impl Answers {
    pub const fn new(metric: &'static str, missing: fn() -> Problem) -> Self {
        Self { metric, missing }
    }

    /// Sends `reply`, counted under `label`.
    pub fn send(&self, (label, reply): (&'static str, Reply)) -> ApiResult {
        count(self.metric, label);
        Ok(respond(reply))
    }

    /// The answer about a target that does not exist.
    pub fn not_found(&self) -> (&'static str, Reply) {
        ("not_found", (self.missing)().into_reply())
    }

    /// The answer to a request with an `Idempotency-Key`: a stored answer
    /// sent again (`replayed`), a key used for another request (`rejected`,
    /// 422), a target that does not exist (`not_found`), or the request's
    /// own outcome as `own` answers and labels it.
    pub fn keyed<T>(
        &self,
        outcome: Keyed<T>,
        own: impl FnOnce(T) -> (&'static str, Reply),
    ) -> ApiResult {
        self.send(match outcome {
            Keyed::Done(done) => own(done),
            Keyed::Replayed(stored) => {
                metrics::counter!("holdfast_idempotency_replays_total").increment(1);
                ("replayed", Reply::from(stored))
            }
            Keyed::KeyReused => ("rejected", reply::key_reused().into_reply()),
            Keyed::InUse => ("in_use", reply::key_in_use().into_reply()),
            Keyed::NotFound => self.not_found(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn console_pages_challenge_for_basic() {
        assert!(challenge(true).starts_with("Basic realm="));
        assert_eq!(challenge(false), "Bearer");
    }
}
