//! One span per request with its request id (taken from `X-Request-Id` when
//! sane, else generated, and echoed back), and the duration histogram by
//! route pattern and status class.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Instant;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::http::Method;
use actix_web::middleware::Next;
use actix_web::{HttpMessage, HttpRequest};

use tracing::Instrument;

pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// A client's request id is kept when it is 1 to 128 of `[A-Za-z0-9._:-]`.
fn sane(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

/// The method as a metric label: the methods HTTP defines, else `other`.
fn method_label(method: &Method) -> &'static str {
    const KNOWN: [(Method, &str); 9] = [
        (Method::GET, "GET"),
        (Method::HEAD, "HEAD"),
        (Method::POST, "POST"),
        (Method::PUT, "PUT"),
        (Method::PATCH, "PATCH"),
        (Method::DELETE, "DELETE"),
        (Method::OPTIONS, "OPTIONS"),
        (Method::CONNECT, "CONNECT"),
        (Method::TRACE, "TRACE"),
    ];
    KNOWN
        .iter()
        .find(|(m, _)| m == method)
        .map_or("other", |(_, label)| label)
}

fn status_class(status: u16) -> &'static str {
    match status {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}

/// The pattern of the route actix matched (`None` when none did). Finding
/// it walks the router, so it is found once a request and kept with it.
pub fn route_pattern(req: &HttpRequest) -> Option<Rc<str>> {
    #[derive(Clone)]
    struct Matched(Option<Rc<str>>);
    if let Some(Matched(pattern)) = req.extensions().get::<Matched>() {
        return pattern.clone();
    }
    let pattern: Option<Rc<str>> = req.match_pattern().map(Rc::from);
    req.extensions_mut().insert(Matched(pattern.clone()));
    pattern
}

/// Records one request's duration under its labels.
fn record_duration(route: Rc<str>, method: &'static str, status: u16, seconds: f64) {
    type Histograms = HashMap<(Rc<str>, &'static str, &'static str), metrics::Histogram>;
    thread_local! {
        static HISTOGRAMS: RefCell<Histograms> = RefCell::default();
    }
    let class = status_class(status);
    HISTOGRAMS.with_borrow_mut(|histograms| {
        histograms
            .entry((Rc::clone(&route), method, class))
            .or_insert_with(|| {
                crate::telemetry::registered(|| {
                    metrics::histogram!(
                        "holdfast_http_requests_duration_seconds",
                        "route" => route.to_string(),
                        "method" => method,
                        "status" => class,
                    )
                })
            })
            .record(seconds)
    });
}

pub async fn observe(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let started = Instant::now();
    let request_id = req
        .headers()
        .get(&REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|id| sane(id))
        .map_or_else(|| ulid::Ulid::new().to_string(), str::to_owned);
    let method = method_label(req.method());
    let span = tracing::info_span!(
        "request",
        request_id = %request_id,
        method = %method,
        route = tracing::field::Empty,
        asset_id = tracing::field::Empty,
        reservation_id = tracing::field::Empty,
        idempotency_key = tracing::field::Empty,
    );
    let mut response = next.call(req).instrument(span.clone()).await?;
    // The pattern of the route actix matched; unknown paths share one
    // label, as unknown methods do, so the label set stays bounded.
    let route = route_pattern(response.request()).unwrap_or_else(|| Rc::from("unmatched"));
    let status = response.status().as_u16();
    let elapsed = started.elapsed();
    span.record("route", &*route);
    record_duration(route, method, status, elapsed.as_secs_f64());
    span.in_scope(|| {
        tracing::debug!(
            status,
            elapsed_ms = elapsed.as_secs_f64() * 1000.0,
            "request done"
        )
    });
    if let Ok(value) = HeaderValue::from_str(&request_id) {
        response.headers_mut().insert(REQUEST_ID, value);
    }
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_kept_only_when_sane() {
        let long = "x".repeat(129);
        let cases = [
            ("req-01HZX4C6W0R1", true),
            ("a.b_c:d-e", true),
            ("", false),
            ("has space", false),
            ("newline\n", false),
            (&long, false),
        ];
        for (id, kept) in cases {
            assert_eq!(sane(id), kept, "{id:?}");
        }
    }

    #[test]
    fn unknown_methods_share_one_label() {
        assert_eq!(method_label(&Method::POST), "POST");
        let made_up = Method::from_bytes(b"BREW").unwrap();
        assert_eq!(method_label(&made_up), "other");
    }

    #[test]
    fn status_classes() {
        assert_eq!(status_class(201), "2xx");
        assert_eq!(status_class(409), "4xx");
        assert_eq!(status_class(503), "5xx");
    }
}
