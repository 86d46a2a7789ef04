use reqwest::Method;
use serde_json::{json, Value};

use crate::backend_tests;
use crate::helpers::TestApp;

async fn problem(response: reqwest::Response, status: u16, code: &str) -> Value {
    assert_eq!(response.status(), status);
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error_code"], code);
    assert_eq!(body["status"], status);
    assert_eq!(body["type"], "about:blank");
    assert!(body["title"].is_string());
    assert!(body["message"].is_string());
    body
}

async fn bodies_that_are_not_json_objects_are_400(app: TestApp) {
    for raw in ["{not json", "[1, 2]", "\"text\"", "null", "42"] {
        let response = app
            .client
            .post(app.url("/v1/assets"))
            .header("Content-Type", "application/json")
            .body(raw)
            .send()
            .await
            .unwrap();
        problem(response, 400, "MALFORMED_JSON").await;
    }
    let response = app.client.post(app.url("/v1/assets")).send().await.unwrap();
    problem(response, 400, "MALFORMED_JSON").await;
}

async fn a_body_that_is_not_json_is_415(app: TestApp) {
    for content_type in [
        None,
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
    ] {
        let mut request = app
            .client
            .post(app.url("/v1/assets"))
            .body(r#"{"id":"A","name":"B"}"#);
        if let Some(ct) = content_type {
            request = request.header("Content-Type", ct);
        }
        problem(request.send().await.unwrap(), 415, "UNSUPPORTED_MEDIA_TYPE").await;
    }
    assert_eq!(app.count("SELECT count(*) FROM assets").await, 0);
}

async fn a_body_over_the_limit_is_413(app: TestApp) {
    let name = "x".repeat(20 * 1024);
    let response = app
        .post("/v1/assets", None, &json!({"id": "BIG", "name": name}))
        .await;
    problem(response, 413, "PAYLOAD_TOO_LARGE").await;
    // Also when streamed without a Content-Length.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        (0..40).map(|_| Ok(vec![b' '; 1024])).collect();
    let response = app
        .client
        .post(app.url("/v1/assets"))
        .header("Content-Type", "application/json")
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            chunks,
        )))
        .send()
        .await
        .unwrap();
    problem(response, 413, "PAYLOAD_TOO_LARGE").await;
}

async fn unknown_routes_are_404_and_wrong_methods_405_with_allow(app: TestApp) {
    problem(app.get("/v2/anything").await, 404, "NOT_FOUND").await;
    problem(app.get("/").await, 404, "NOT_FOUND").await;
    for (method, path, allow) in [
        (Method::DELETE, "/v1/assets/A-1", "GET, PATCH, HEAD"),
        (Method::PUT, "/v1/assets", "GET, POST, HEAD"),
        (Method::GET, "/v1/assets/A-1/reservations", "POST"),
        (Method::GET, "/v1/reservations/res_x/commit", "POST"),
        (Method::POST, "/healthz", "GET, HEAD"),
    ] {
        let response = app
            .request(method.clone(), path)
            .await
            .send()
            .await
            .unwrap();
        assert_eq!(response.headers()["allow"], allow, "{method} {path}");
        problem(response, 405, "METHOD_NOT_ALLOWED").await;
    }
}

async fn health_and_readiness(app: TestApp) {
    assert_eq!(app.get_json("/healthz").await["status"], "ok");
    assert_eq!(app.get_json("/readyz").await["status"], "ready");
    let doc = app.get_json("/openapi.json").await;
    assert_eq!(doc["openapi"], "3.1.0");
}

/// A write stuck behind a lock held outside the service fails closed: 503
/// with Retry-After, within the configured bound, and nothing is committed.
async fn a_locked_database_answers_503_with_retry_after(app: TestApp) {
    app.create_asset("E-1").await;
    let blocker = app.lock_asset("E-1").await;
    let started = std::time::Instant::now();
    let response = app
        .post(
            "/v1/assets/E-1/reservations",
            Some("locked"),
            &json!({"buyer_id": "b"}),
        )
        .await;
    let waited = started.elapsed();
    assert_eq!(response.headers()["retry-after"], "1");
    problem(response, 503, "SERVICE_UNAVAILABLE").await;
    assert!(
        waited < std::time::Duration::from_secs(5),
        "waited {waited:?}"
    );
    blocker.release().await;
    assert_eq!(app.get_json("/v1/assets/E-1").await["status"], "AVAILABLE");
    // Once the lock is gone the same request succeeds.
    let response = app
        .post(
            "/v1/assets/E-1/reservations",
            Some("locked"),
            &json!({"buyer_id": "b"}),
        )
        .await;
    assert_eq!(response.status(), 201);
}

backend_tests!(
    bodies_that_are_not_json_objects_are_400,
    a_body_that_is_not_json_is_415,
    a_body_over_the_limit_is_413,
    unknown_routes_are_404_and_wrong_methods_405_with_allow,
    health_and_readiness,
    a_locked_database_answers_503_with_retry_after,
);

#[tokio::test]
async fn an_unreachable_database_answers_503_not_500() {
    let mut config = holdfast::Config::with_database("postgres://postgres@127.0.0.1:1/holdfast");
    config.bind = "127.0.0.1:0".parse().unwrap();
    config.janitor_interval_seconds = 0;
    config.db_acquire_timeout_ms = 500;
    let app = holdfast::Application::build(config, false).await.unwrap();
    let base = format!("http://127.0.0.1:{}", app.port());
    tokio::spawn(app.run_until_stopped());
    let client = reqwest::Client::new();
    let response = client
        .get(format!("{base}/v1/assets/A-1"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["retry-after"], "1");
    let response = client.get(format!("{base}/readyz")).send().await.unwrap();
    assert_eq!(response.status(), 503);
    let response = client.get(format!("{base}/healthz")).send().await.unwrap();
    assert_eq!(response.status(), 200);
}
