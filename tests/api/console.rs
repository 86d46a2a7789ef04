//! The operator console: its files, how a browser signs in to them (the API
//! key as the Basic password), and the counts per status it shows.

use reqwest::header::{CACHE_CONTROL, CONTENT_TYPE, WWW_AUTHENTICATE};
use serde_json::{json, Value};

use crate::backend_tests;
use crate::helpers::{new_key as idempotency_key, spawn_with_keys, Backend, TestApp};

const FILES: [(&str, &str); 3] = [
    ("/console", "text/html"),
    ("/console/console.css", "text/css"),
    ("/console/console.js", "text/javascript"),
];

fn header(response: &reqwest::Response, name: impl reqwest::header::AsHeaderName) -> &str {
    response
        .headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
}

fn assert_served(response: &reqwest::Response, path: &str, content_type: &str) {
    assert_eq!(response.status(), 200, "GET {path}");
    assert!(
        header(response, CONTENT_TYPE).starts_with(content_type),
        "GET {path}: {}",
        header(response, CONTENT_TYPE)
    );
    assert_eq!(header(response, CACHE_CONTROL), "no-cache", "GET {path}");
    assert_eq!(header(response, "x-content-type-options"), "nosniff");
    let csp = header(response, "content-security-policy");
    for part in [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "frame-ancestors 'none'",
    ] {
        assert!(csp.contains(part), "GET {path}: {csp:?} lacks {part}");
    }
    assert!(!csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"));
}

/// Signing in to the console: an admin key as Bearer or as the Basic
/// password; a 401 asks a browser for Basic; other roles are refused.
async fn the_console_asks_for_an_admin_key(backend: Backend) {
    let Some((app, keys)) = spawn_with_keys(backend, |_| {}).await else {
        return;
    };
    for (path, content_type) in FILES {
        let bearer = app
            .client
            .get(app.url(path))
            .bearer_auth(&keys.admin)
            .send()
            .await
            .unwrap();
        assert_served(&bearer, path, content_type);
        let basic = app
            .client
            .get(app.url(path))
            .basic_auth("anyone", Some(&keys.admin))
            .send()
            .await
            .unwrap();
        assert_served(&basic, path, content_type);

        let anonymous = app.get(path).await;
        assert_eq!(anonymous.status(), 401, "GET {path} without a key");
        assert_eq!(
            header(&anonymous, WWW_AUTHENTICATE),
            r#"Basic realm="holdfast console", charset="UTF-8""#
        );
        let body: Value = anonymous.json().await.unwrap();
        assert_eq!(body["error_code"], "UNAUTHENTICATED");

        let wrong = app
            .client
            .get(app.url(path))
            .basic_auth("ops", Some("hf_not-the-key"))
            .send()
            .await
            .unwrap();
        assert_eq!(wrong.status(), 401, "a wrong Basic password");
        assert!(header(&wrong, WWW_AUTHENTICATE).starts_with("Basic "));

        let shop = app
            .client
            .get(app.url(path))
            .basic_auth("shop", Some(&keys.shop))
            .send()
            .await
            .unwrap();
        assert_eq!(shop.status(), 403, "a storefront key on {path}");
    }
    let page = app
        .client
        .get(app.url("/console"))
        .bearer_auth(&keys.admin)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("<html lang=\"en\">"));
    assert!(page.contains("src=\"/console/console.js\""));
}

/// The browser sends the signed-in credentials with the page's requests:
/// Basic works on every API route, with the key's role and scope.
async fn basic_credentials_work_on_the_api(backend: Backend) {
    let Some((app, keys)) = spawn_with_keys(backend, |_| {}).await else {
        return;
    };
    let created = app
        .client
        .post(app.url("/v1/assets"))
        .basic_auth("operator", Some(&keys.admin))
        .json(&json!({"id": "BASIC-1", "name": "Lot 1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let held = app
        .client
        .post(app.url("/v1/assets/BASIC-1/reservations"))
        .basic_auth("", Some(&keys.shop))
        .header("Idempotency-Key", idempotency_key())
        .json(&json!({"buyer_id": "b-1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(held.status(), 201, "a storefront may hold, with Basic too");
    let listed = app
        .client
        .get(app.url("/v1/assets"))
        .basic_auth("operator", Some(&keys.admin))
        .send()
        .await
        .unwrap();
    assert_eq!(listed.status(), 200);

    let wrong = app
        .client
        .get(app.url("/v1/assets"))
        .basic_auth("operator", Some("hf_wrong"))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401, "a wrong Basic password");
    assert_eq!(
        header(&wrong, WWW_AUTHENTICATE),
        "Bearer",
        "API routes keep the Bearer challenge"
    );
    let forbidden = app
        .client
        .post(app.url("/v1/assets"))
        .basic_auth("shop", Some(&keys.shop))
        .json(&json!({"id": "BASIC-2", "name": "Lot 2"}))
        .send()
        .await
        .unwrap();
    assert_eq!(forbidden.status(), 403, "Basic carries the key's role");
    for malformed in ["Basic", "Basic !!!", "Basic b3BzOg==", "Basic bm8tY29sb24="] {
        let response = app
            .client
            .get(app.url("/v1/assets"))
            .header("Authorization", malformed)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 401, "{malformed}");
    }
    let counts = app
        .client
        .get(app.url("/v1/asset-counts"))
        .basic_auth("shop", Some(&keys.shop))
        .send()
        .await
        .unwrap();
    assert_eq!(counts.status(), 403, "counts are for admins");
}

/// Without keys (open mode, loopback only) the console needs no sign-in.
async fn the_console_is_open_in_open_mode(app: TestApp) {
    for (path, content_type) in FILES {
        let response = app.get(path).await;
        assert_served(&response, path, content_type);
    }
    let post = app.client.post(app.url("/console")).send().await.unwrap();
    assert_eq!(post.status(), 405);
    assert_eq!(header(&post, "allow"), "GET, HEAD");
}

/// Counts by effective status: a lapsed hold counts as AVAILABLE before any
/// sweep, every status is present, and the counts agree with the list.
async fn counts_follow_the_effective_status(app: TestApp) {
    let empty = app.get_json("/v1/asset-counts").await;
    assert_eq!(
        empty,
        json!({"counts": {"AVAILABLE": 0, "HELD": 0, "SOLD": 0, "WITHDRAWN": 0}})
    );
    for id in ["C-1", "C-2", "C-3", "C-4", "C-5"] {
        app.create_asset(id).await;
    }
    app.hold("C-1", "buyer-1", 600).await;
    let sold = app.hold("C-2", "buyer-2", 600).await;
    let commit = app
        .commit(
            sold["reservation_id"].as_str().unwrap(),
            &idempotency_key(),
            "pay-c2",
        )
        .await;
    assert_eq!(commit.status(), 200);
    // A hold on C-3 lapses; no janitor runs in tests.
    let lapsed = app.hold("C-3", "buyer-3", 60).await;
    app.lapse(lapsed["reservation_id"].as_str().unwrap()).await;
    let withdrawn = app.post("/v1/assets/C-4/withdraw", None, &json!({})).await;
    assert_eq!(withdrawn.status(), 200);
    let counts = app.get_json("/v1/asset-counts").await;
    assert_eq!(
        counts,
        json!({"counts": {"AVAILABLE": 2, "HELD": 1, "SOLD": 1, "WITHDRAWN": 1}})
    );
    for status in ["AVAILABLE", "HELD", "SOLD", "WITHDRAWN"] {
        let page = app
            .get_json(&format!("/v1/assets?status={status}&limit=500"))
            .await;
        assert_eq!(
            page["items"].as_array().unwrap().len() as i64,
            counts["counts"][status].as_i64().unwrap(),
            "{status}: the count agrees with the list"
        );
    }
}

backend_tests!(
    the_console_is_open_in_open_mode,
    counts_follow_the_effective_status;
    backend:
        the_console_asks_for_an_admin_key,
        basic_credentials_work_on_the_api,
);
