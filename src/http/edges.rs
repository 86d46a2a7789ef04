//! What every answer and every request go through, whatever route they
//! reach: the size of the request head, HEAD served as GET, the headers that
//! keep answers out of caches and away from content sniffing, browser
//! refusals (CORS) answered as problems like every other error, and a 503
//! that may have committed told in the words of its operation.

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{self, HeaderValue};
use actix_web::http::Method;
use actix_web::middleware::Next;

use super::error::{fit_unconfirmed, respond, PROBLEM_JSON};
use crate::reply::{ErrorCode, Problem};

/// The largest request head (request line and headers) accepted.
pub const MAX_HEAD_BYTES: usize = 32 * 1024;

/// The size of the request line and headers as sent.
fn head_bytes(req: &ServiceRequest) -> usize {
    let uri = req.uri();
    let target = uri.scheme_str().map_or(0, |s| s.len() + 3)
        + uri.authority().map_or(0, |a| a.as_str().len())
        + uri.path_and_query().map_or(0, |p| p.as_str().len());
    let line = req.method().as_str().len() + target + 12;
    req.headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum::<usize>()
        + line
}

pub async fn edges(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    // The path as actix routes it (percent-decoded), not as it was spelled:
    // `/%76%31/assets` is `/v1/assets`.
    let path = req.match_info().as_str();
    let api = path == "/v1" || path.starts_with("/v1/");
    let mut response = if head_bytes(&req) > MAX_HEAD_BYTES {
        let problem = Problem::new(
            ErrorCode::RequestHeadersTooLarge,
            format!("The request line and headers are over {MAX_HEAD_BYTES} bytes."),
        );
        req.into_response(respond(problem.into_reply()))
    } else {
        serve(req, next).await?
    };
    let headers = response.headers_mut();
    if !headers.contains_key(header::X_CONTENT_TYPE_OPTIONS) {
        headers.insert(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        );
    }
    // Answers about reservations, payments and refunds are not for caches.
    if api {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    Ok(response)
}

/// HEAD served as GET, a refused preflight answered as a problem, and a 503
/// that may have committed told in the words of its operation.
async fn serve(
    mut req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    // HEAD is answered wherever GET is, as GET without its body: the
    // connection writes a HEAD request's answer without one.
    if req.method() == Method::HEAD {
        req.head_mut().method = Method::GET;
    }
    let preflight = req.method() == Method::OPTIONS
        && req
            .headers()
            .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    let response = fit_unconfirmed(next.call(req).await?.map_into_boxed_body());
    if preflight && response.status().is_client_error() && !is_problem(&response) {
        return Ok(refused_preflight(response).await);
    }
    Ok(response)
}

fn is_problem(response: &ServiceResponse<BoxBody>) -> bool {
    response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(PROBLEM_JSON.as_bytes()))
}

/// A preflight the CORS rules refused, as a problem: which origin, method or
/// header was not allowed, in the CORS layer's own words.
async fn refused_preflight(response: ServiceResponse<BoxBody>) -> ServiceResponse<BoxBody> {
    let (req, answer) = response.into_parts();
    let reason = actix_web::body::to_bytes(answer.into_body())
        .await
        .ok()
        .and_then(|b| String::from_utf8(b.to_vec()).ok())
        .filter(|text| !text.trim().is_empty())
        .unwrap_or_else(|| "the request is not allowed from this origin".to_owned());
    let problem = Problem::new(
        ErrorCode::Forbidden,
        format!(
            "This browser request is not allowed: {}. Allowed origins are set by \
             HOLDFAST_CORS_ORIGINS.",
            reason.trim().trim_end_matches('.')
        ),
    );
    ServiceResponse::new(req, respond(problem.into_reply()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::test::TestRequest;

    #[test]
    fn the_head_counts_line_and_headers() {
        let small = TestRequest::get().uri("/v1/assets").to_srv_request();
        assert!(head_bytes(&small) < 100);
        let big = TestRequest::get()
            .uri("/v1/assets")
            .insert_header(("X-Big", "x".repeat(MAX_HEAD_BYTES)))
            .to_srv_request();
        assert!(head_bytes(&big) > MAX_HEAD_BYTES);
        let target = format!("/v1/assets?cursor={}", "c".repeat(MAX_HEAD_BYTES));
        let long_query = TestRequest::get().uri(&target).to_srv_request();
        assert!(head_bytes(&long_query) > MAX_HEAD_BYTES);
        let absolute = TestRequest::get()
            .uri("http://example.test/v1/assets?status=HELD")
            .to_srv_request();
        let line = "GET http://example.test/v1/assets?status=HELD HTTP/1.1\r\n".len();
        assert_eq!(head_bytes(&absolute), line);
    }
}
