//! HTTP as a careful client expects it: no hint of another client's
//! reservation, answers kept out of caches, one key per request, CORS for
//! every method, the documented header limit, HEAD wherever GET is served.

use holdfast::keys::{new_key, Role};
use serde_json::{json, Value};

use crate::backend_tests;
use crate::helpers::{new_key as idempotency_key, Backend, TestApp};

/// Another storefront's reservation answers exactly as an id that does not
/// exist: the same 404, the same bytes, the same number of statements.
async fn another_clients_reservation_is_indistinguishable_from_none(backend: Backend) {
    let (shop_a, a) = new_key("shop-a", Role::Storefront).unwrap();
    let (shop_b, b) = new_key("shop-b", Role::Storefront).unwrap();
    let (admin, o) = new_key("ops", Role::Admin).unwrap();
    let keys = format!("{a},{b},{o}");
    // A process of its own, so that its statement count is this test's.
    let Some(app) = TestApp::try_spawn_process(backend, |command, _| {
        command.env("HOLDFAST_API_KEYS", &keys);
    })
    .await
    else {
        return;
    };
    let send = |method: reqwest::Method, path: String, token: &str, body: Option<Value>| {
        let mut request = app
            .client
            .request(method, app.url(&path))
            .bearer_auth(token)
            .header("Idempotency-Key", idempotency_key());
        if let Some(body) = body {
            request = request.json(&body);
        }
        request.send()
    };
    let created = send(
        reqwest::Method::POST,
        "/v1/assets".into(),
        &admin,
        Some(json!({"id": "E-1", "name": "e"})),
    )
    .await
    .unwrap();
    assert_eq!(created.status(), 201);
    let held: Value = send(
        reqwest::Method::POST,
        "/v1/assets/E-1/reservations".into(),
        &shop_b,
        Some(json!({"buyer_id": "b"})),
    )
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    let theirs = held["reservation_id"].as_str().unwrap().to_owned();
    let nobody = "res_01HZX49R8T39QK6G7Y1W2V3N4P".to_owned();
    // Each read three times, the two interleaved: the same answer every
    // time, and the same least number of statements (a read that met a busy
    // database and tried again sends more, whichever reservation it asked for).
    let mut answers: Vec<(u16, String, Vec<f64>)> = Vec::new();
    for round in 0..6 {
        let id = if round % 2 == 0 { &theirs } else { &nobody };
        let before = app.metric("holdfast_db_statements_total ").await;
        let response = send(
            reqwest::Method::GET,
            format!("/v1/reservations/{id}"),
            &shop_a,
            None,
        )
        .await
        .unwrap();
        let status = response.status().as_u16();
        let body = response.text().await.unwrap();
        let statements = app.metric("holdfast_db_statements_total ").await - before;
        assert!(statements > 0.0, "each read reached the database");
        match answers.iter_mut().find(|a| a.0 == status && a.1 == body) {
            Some(same) => same.2.push(statements),
            None => answers.push((status, body, vec![statements])),
        }
    }
    assert_eq!(answers.len(), 1, "one answer for both: {answers:?}");
    assert_eq!(answers[0].0, 404);
    let least = |parity: usize| {
        answers[0]
            .2
            .iter()
            .skip(parity)
            .step_by(2)
            .fold(f64::MAX, |a, b| a.min(*b))
    };
    assert_eq!(least(0), least(1), "the same work for both: {answers:?}");
    // Its asset shows shop-a no reservation id; shop-b sees its own.
    for (token, visible) in [(&shop_a, false), (&shop_b, true)] {
        let asset: Value = send(reqwest::Method::GET, "/v1/assets/E-1".into(), token, None)
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(asset["status"], "HELD");
        assert_eq!(
            asset["current_reservation_id"].is_string(),
            visible,
            "{asset}"
        );
    }
}

/// Every /v1 answer, success or problem, is kept out of caches and sniffing.
async fn api_answers_are_not_cached_or_sniffed(app: TestApp) {
    app.create_asset("NC-1").await;
    let held = app.hold("NC-1", "b", 300).await;
    let id = held["reservation_id"].as_str().unwrap();
    let answers = [
        app.get("/v1/assets/NC-1").await,
        app.get(&format!("/v1/reservations/{id}")).await,
        app.get("/v1/assets/NOPE").await,
        app.get("/v1/events").await,
        app.get("/v1/refunds").await,
        app.post("/v1/assets", None, &json!({"id": "NC-2", "name": "x"}))
            .await,
        app.post(
            "/v1/assets/NC-1/reservations",
            None,
            &json!({"buyer_id": "b"}),
        )
        .await,
    ];
    for response in answers {
        let what = format!("{} {}", response.url(), response.status());
        assert_eq!(response.headers()["cache-control"], "no-store", "{what}");
        assert_eq!(
            response.headers()["x-content-type-options"],
            "nosniff",
            "{what}"
        );
    }
    // Whatever the spelling of a /v1 path: actix routes the decoded one.
    for path in ["/%76%31/assets", "/v1/%61ssets/NC-1", "/v1//assets"] {
        let answer = app.raw("GET", path, &[], "").await;
        assert_eq!(
            answer.header("cache-control"),
            Some("no-store"),
            "{path}: {answer:?}"
        );
        assert_eq!(
            answer.header("x-content-type-options"),
            Some("nosniff"),
            "{path}"
        );
    }
    assert_eq!(app.raw("GET", "/%76%31/assets", &[], "").await.status, 200);
    assert_eq!(
        app.get("/healthz").await.headers()["x-content-type-options"],
        "nosniff"
    );
}

/// Two Idempotency-Key headers on one request: 400, and nothing changes.
async fn one_key_per_request(app: TestApp) {
    app.create_asset("K2-1").await;
    let answer = app
        .raw(
            "POST",
            "/v1/assets/K2-1/reservations",
            &[
                ("Content-Type", "application/json"),
                ("Idempotency-Key", "first"),
                ("Idempotency-Key", "second"),
            ],
            r#"{"buyer_id":"b"}"#,
        )
        .await;
    assert_eq!(answer.status, 400, "{}", answer.body);
    assert!(answer.body.contains("IDEMPOTENCY_KEY_INVALID"));
    assert_eq!(
        answer.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(app.count("SELECT count(*) FROM reservations").await, 0);
    // One of them alone works, as the other would.
    let single = app
        .raw(
            "POST",
            "/v1/assets/K2-1/reservations",
            &[
                ("Content-Type", "application/json"),
                ("Idempotency-Key", "second"),
            ],
            r#"{"buyer_id":"b"}"#,
        )
        .await;
    assert_eq!(single.status, 201);
}

/// Request heads over the documented 32 KiB are refused with 431, as a
/// problem; below it they are served.
async fn heads_over_32_kib_are_431(app: TestApp) {
    let under = "x".repeat(30 * 1024);
    let over = "x".repeat(40 * 1024);
    let ok = app
        .raw("GET", "/v1/assets", &[("X-Padding", &under)], "")
        .await;
    assert_eq!(ok.status, 200);
    let refused = app
        .raw("GET", "/v1/assets", &[("X-Padding", &over)], "")
        .await;
    assert_eq!(refused.status, 431, "{}", refused.body);
    assert!(refused.body.contains("REQUEST_HEADERS_TOO_LARGE"));
    assert_eq!(
        refused.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(refused.header("cache-control"), Some("no-store"));
    assert_eq!(refused.header("x-content-type-options"), Some("nosniff"));
    let spread: Vec<(String, String)> = (0..10)
        .map(|i| (format!("X-Part-{i}"), "y".repeat(4 * 1024)))
        .collect();
    let headers: Vec<(&str, &str)> = spread
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    let refused = app.raw("GET", "/v1/assets", &headers, "").await;
    assert_eq!(refused.status, 431, "many headers add up");
    // More than 96 headers are refused by actix-http itself, before the
    // service sees the request: a bare 431 without a body. `raw` adds Host,
    // Content-Length and Connection to the ones given here.
    let many: Vec<(String, String)> = (0..94).map(|i| (format!("X-N-{i}"), "1".into())).collect();
    let headers: Vec<(&str, &str)> = many.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
    let served = app.raw("GET", "/v1/assets", &headers[..93], "").await;
    assert_eq!(served.status, 200, "96 headers are served");
    let refused = app.raw("GET", "/v1/assets", &headers, "").await;
    assert_eq!(refused.status, 431, "97 headers");
    assert!(refused.body.is_empty(), "{}", refused.body);
}

/// HEAD is served wherever GET is: the same status and headers, no body.
async fn head_where_get_is_served(app: TestApp) {
    app.create_asset("HD-1").await;
    for path in [
        "/v1/assets",
        "/v1/assets/HD-1",
        "/v1/assets/HD-1/events",
        "/healthz",
    ] {
        let get = app.raw("GET", path, &[], "").await;
        let head = app.raw("HEAD", path, &[], "").await;
        assert_eq!(head.status, get.status, "{path}");
        assert!(head.body.is_empty(), "{path}: {}", head.body);
        assert_eq!(
            head.header("content-type"),
            get.header("content-type"),
            "{path}"
        );
        assert_eq!(
            head.header("content-length"),
            get.header("content-length"),
            "{path}"
        );
    }
    assert_eq!(
        app.raw("HEAD", "/v1/assets/NOPE", &[], "").await.status,
        404
    );
    let wrong = app.raw("DELETE", "/v1/assets", &[], "").await;
    assert_eq!(wrong.status, 405);
    let allow = wrong.header("allow").unwrap().to_owned();
    assert!(
        allow.contains("GET") && allow.contains("HEAD") && allow.contains("POST"),
        "{allow}"
    );
}

backend_tests!(
    api_answers_are_not_cached_or_sniffed,
    one_key_per_request,
    heads_over_32_kib_are_431,
    head_where_get_is_served;
    backend:
        another_clients_reservation_is_indistinguishable_from_none,
        cors_serves_every_method_and_refuses_as_a_problem,
);

/// A browser front end may call every method the API has, PATCH included;
/// a refused preflight is a problem like any other error.
async fn cors_serves_every_method_and_refuses_as_a_problem(backend: Backend) {
    let Some(app) = TestApp::try_spawn_with(backend, |c| {
        c.cors_origins = Some("https://shop.example".into());
    })
    .await
    else {
        return;
    };
    for method in ["GET", "POST", "PATCH", "HEAD"] {
        let preflight = app
            .raw(
                "OPTIONS",
                "/v1/assets/A-1",
                &[
                    ("Origin", "https://shop.example"),
                    ("Access-Control-Request-Method", method),
                    (
                        "Access-Control-Request-Headers",
                        "content-type, authorization",
                    ),
                ],
                "",
            )
            .await;
        assert_eq!(preflight.status, 200, "{method}: {}", preflight.body);
        let allowed = preflight
            .header("access-control-allow-methods")
            .unwrap_or_default()
            .to_owned();
        assert!(allowed.contains(method), "{method} in {allowed}");
    }
    app.create_asset("CP-1").await;
    let patch = app
        .raw(
            "PATCH",
            "/v1/assets/CP-1",
            &[
                ("Origin", "https://shop.example"),
                ("Content-Type", "application/json"),
            ],
            r#"{"available_from":null}"#,
        )
        .await;
    assert_eq!(patch.status, 200, "{}", patch.body);
    assert_eq!(
        patch.header("access-control-allow-origin"),
        Some("https://shop.example")
    );
    for (origin, method) in [
        ("https://evil.example", "POST"),
        ("https://shop.example", "TRACE"),
    ] {
        let refused = app
            .raw(
                "OPTIONS",
                "/v1/assets",
                &[
                    ("Origin", origin),
                    ("Access-Control-Request-Method", method),
                ],
                "",
            )
            .await;
        assert_eq!(refused.status, 403, "{origin} {method}: {}", refused.body);
        assert_eq!(
            refused.header("content-type"),
            Some("application/problem+json")
        );
        let body: Value = serde_json::from_str(&refused.body).unwrap();
        assert_eq!(body["error_code"], "FORBIDDEN");
    }
}
