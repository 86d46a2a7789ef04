//! Access control: keys and roles on every operation, object-level access,
//! idempotency scopes, the per-buyer hold limit, CORS and the rate limit.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::Duration;

use futures_util::future::join_all;
use holdfast::keys::{new_key, Role};
use reqwest::Method;
use serde_json::{json, Value};

use crate::backend_tests;
use crate::helpers::{new_key as idempotency_key, spawn_with_keys, Backend, Keys, TestApp};

async fn call(
    app: &TestApp,
    method: Method,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> reqwest::Response {
    let mut request = app
        .client
        .request(method, app.url(path))
        .header("Idempotency-Key", idempotency_key());
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    request.send().await.unwrap()
}

/// The contract's roles, stated independently of the code: every operation
/// of the document must be here, so an operation added without a rule fails.
fn expected_roles() -> BTreeMap<&'static str, Option<&'static [&'static str]>> {
    const ALL: &[&str] = &["admin", "storefront", "payments"];
    BTreeMap::from([
        ("get_health", None),
        ("get_readiness", None),
        ("get_metrics", None),
        ("get_openapi", None),
        ("get_docs", None),
        ("create_asset", Some(&["admin"][..])),
        ("create_assets", Some(&["admin"][..])),
        ("join_waitlist", Some(&["admin", "storefront"][..])),
        ("list_waitlist", Some(&["admin", "storefront"][..])),
        ("leave_waitlist", Some(&["admin", "storefront"][..])),
        ("make_offer", Some(&["admin"][..])),
        ("update_asset", Some(&["admin"][..])),
        ("withdraw_asset", Some(&["admin"][..])),
        ("reinstate_asset", Some(&["admin"][..])),
        ("get_asset", Some(ALL)),
        ("list_assets", Some(ALL)),
        ("list_asset_events", Some(ALL)),
        ("list_events", Some(ALL)),
        ("hold_asset", Some(&["admin", "storefront"][..])),
        ("get_reservation", Some(ALL)),
        ("list_reservations", Some(ALL)),
        ("extend_reservation", Some(&["admin", "storefront"][..])),
        ("void_reservation", Some(&["admin"][..])),
        ("release_reservation", Some(ALL)),
        ("commit_reservation", Some(&["admin", "payments"][..])),
        ("get_payment", Some(&["admin", "payments"][..])),
        ("list_refunds", Some(&["admin", "payments"][..])),
        ("complete_refund", Some(&["admin", "payments"][..])),
        ("list_dead_events", Some(&["admin"][..])),
        ("redeliver_event", Some(&["admin"][..])),
        ("count_assets", Some(&["admin"][..])),
        ("get_console", Some(&["admin"][..])),
        ("get_console_css", Some(&["admin"][..])),
        ("get_console_js", Some(&["admin"][..])),
    ])
}

fn concrete(path: &str) -> String {
    path.replace("{asset_id}", "ACL-1")
        .replace("{reservation_id}", "res_01HZX49R8T39QK6G7Y1W2V3N4P")
        .replace("{refund_id}", "rf_01HZX4B2Q7C3M9D8E6F5G4H3J2")
        .replace("{event_id}", "evt_01HZX4C6W0R1T2Y3U4I5O6P7A8")
        .replace("{buyer_id}", "acl-buyer")
}

async fn every_role_against_every_operation(backend: Backend) {
    let Some((app, keys)) = spawn_with_keys(backend, |_| {}).await else {
        return;
    };
    let doc = app.get_json("/openapi.json").await;
    let expected = expected_roles();
    let mut seen = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let id = op["operationId"].as_str().unwrap();
            let roles = expected.get(id).unwrap_or_else(|| {
                panic!("{method} {path} ({id}) has no access rule in this test")
            });
            seen += 1;
            let method = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let path = concrete(path);
            let body = (method == Method::POST).then(|| json!({}));
            let callers = [
                ("nobody", None),
                ("stranger", Some("hf_not-a-key")),
                ("admin", Some(keys.admin.as_str())),
                ("storefront", Some(keys.shop.as_str())),
                ("payments", Some(keys.payments.as_str())),
            ];
            for (who, token) in callers {
                let status = call(&app, method.clone(), &path, token, body.clone())
                    .await
                    .status()
                    .as_u16();
                let want = match roles {
                    None => None,
                    Some(_) if token.is_none() || who == "stranger" => Some(401),
                    Some(allowed) if !allowed.contains(&who) => Some(403),
                    Some(_) => None,
                };
                match want {
                    Some(code) => assert_eq!(status, code, "{who} {method} {path} ({id})"),
                    None => assert!(
                        status != 401 && status != 403,
                        "{who} {method} {path} ({id}) got {status}"
                    ),
                }
            }
            if roles.is_some() {
                let security = &op["security"];
                assert!(security.is_array(), "{id} declares its security");
            }
        }
    }
    assert_eq!(
        seen,
        expected.len(),
        "the document and the rules list the same operations"
    );
    let unauthenticated = call(&app, Method::GET, "/v1/assets", None, None).await;
    assert_eq!(unauthenticated.headers()["www-authenticate"], "Bearer");
    let body: Value = unauthenticated.json().await.unwrap();
    assert_eq!(body["error_code"], "UNAUTHENTICATED");
    let forbidden: Value = call(
        &app,
        Method::POST,
        "/v1/assets",
        Some(&keys.shop),
        Some(json!({"id": "Z", "name": "z"})),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(forbidden["error_code"], "FORBIDDEN");
    assert_eq!(
        app.count("SELECT count(*) FROM assets").await,
        0,
        "a refused request changed nothing"
    );
}

/// The admin adds an asset named by its id.
async fn add_asset(app: &TestApp, keys: &Keys, id: &str) {
    let r = call(
        app,
        Method::POST,
        "/v1/assets",
        Some(&keys.admin),
        Some(json!({"id": id, "name": id})),
    )
    .await;
    assert_eq!(r.status(), 201);
}

/// A hold for `same-buyer` sent with `token` under `key`.
async fn hold_as(app: &TestApp, token: &str, asset: &str, key: &str) -> reqwest::Response {
    app.client
        .post(app.url(&format!("/v1/assets/{asset}/reservations")))
        .bearer_auth(token)
        .header("Idempotency-Key", key)
        .json(&json!({"buyer_id": "same-buyer"}))
        .send()
        .await
        .unwrap()
}

async fn storefronts_see_only_their_own_reservations_and_keys(backend: Backend) {
    let Some((app, keys)) = spawn_with_keys(backend, |_| {}).await else {
        return;
    };
    for id in ["O-1", "O-2"] {
        add_asset(&app, &keys, id).await;
    }
    let hold = |token: String, asset: &'static str, key: &'static str| {
        let app = &app;
        async move { hold_as(app, &token, asset, key).await }
    };
    let mine = hold(keys.shop.clone(), "O-1", "shared-key").await;
    assert_eq!(mine.status(), 201);
    let mine: Value = mine.json().await.unwrap();
    let id = mine["reservation_id"].as_str().unwrap();
    // The same key from another client is another request altogether.
    let theirs = hold(keys.other_shop.clone(), "O-2", "shared-key").await;
    assert_eq!(theirs.status(), 201, "no replay across clients");
    assert!(theirs.headers().get("idempotent-replayed").is_none());
    let theirs_on_mine = hold(keys.other_shop.clone(), "O-1", "shared-key").await;
    assert_eq!(
        theirs_on_mine.status(),
        422,
        "shop-b's own key was used for O-2"
    );
    let fresh = hold(keys.other_shop.clone(), "O-1", "another-key").await;
    assert_eq!(fresh.status(), 409);

    let path = format!("/v1/reservations/{id}");
    assert_eq!(
        call(&app, Method::GET, &path, Some(&keys.shop), None)
            .await
            .status(),
        200
    );
    assert_eq!(
        call(&app, Method::GET, &path, Some(&keys.other_shop), None)
            .await
            .status(),
        404
    );
    assert_eq!(
        call(&app, Method::GET, &path, Some(&keys.admin), None)
            .await
            .status(),
        200
    );
    assert_eq!(
        call(&app, Method::GET, &path, Some(&keys.payments), None)
            .await
            .status(),
        200
    );
    // Lists and extensions stay within the same rights.
    let listed = |token: String| {
        let app = &app;
        async move {
            call(
                app,
                Method::GET,
                "/v1/reservations?buyer_id=same-buyer",
                Some(&token),
                None,
            )
            .await
            .json::<Value>()
            .await
            .unwrap()["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["reservation_id"].as_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        }
    };
    assert!(listed(keys.shop.clone()).await.contains(&id.to_owned()));
    assert!(!listed(keys.other_shop.clone())
        .await
        .contains(&id.to_owned()));
    assert_eq!(listed(keys.admin.clone()).await.len(), 2);
    let extend = format!("{path}/extend");
    let stolen = call(
        &app,
        Method::POST,
        &extend,
        Some(&keys.other_shop),
        Some(json!({"hold_seconds": 300})),
    )
    .await;
    assert_eq!(stolen.status(), 404);
    let own = call(
        &app,
        Method::POST,
        &extend,
        Some(&keys.shop),
        Some(json!({"hold_seconds": 300})),
    )
    .await;
    assert_eq!(own.status(), 200);

    let release = format!("{path}/release");
    let stolen = call(
        &app,
        Method::POST,
        &release,
        Some(&keys.other_shop),
        Some(json!({})),
    )
    .await;
    assert_eq!(stolen.status(), 404);
    let stolen: Value = stolen.json().await.unwrap();
    assert_eq!(stolen["error_code"], "RESERVATION_NOT_FOUND");
    assert_eq!(app.get_json_as(&path, &keys.admin).await["status"], "HELD");
    assert_eq!(
        call(
            &app,
            Method::POST,
            &release,
            Some(&keys.shop),
            Some(json!({}))
        )
        .await
        .status(),
        200
    );
}

async fn a_burst_of_one_buyer_ends_at_the_limit(app: TestApp) {
    for i in 0..50 {
        app.create_asset(&format!("B-{i}")).await;
    }
    app.create_asset("B-other").await;
    let responses = join_all((0..50).map(|i| {
        let app = &app;
        async move {
            let response = app
                .post(
                    &format!("/v1/assets/B-{i}/reservations"),
                    Some(&idempotency_key()),
                    &json!({"buyer_id": "hoarder", "hold_seconds": 60}),
                )
                .await;
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.unwrap())
        }
    }))
    .await;
    let created = responses.iter().filter(|(s, _)| *s == 201).count();
    let limited = responses
        .iter()
        .filter(|(s, b)| *s == 409 && b["error_code"] == "HOLD_LIMIT_REACHED")
        .count();
    assert_eq!(created, 5, "{responses:?}");
    assert_eq!(limited, 45);
    assert_eq!(
        app.count("SELECT count(*) FROM reservations WHERE buyer_id = 'hoarder'")
            .await,
        5,
        "refusals wrote nothing"
    );
    // Other buyers are not affected; lapsed holds stop counting.
    app.hold("B-other", "someone-else", 300).await;
    for (_, held) in responses.iter().filter(|(s, _)| *s == 201) {
        app.lapse(held["reservation_id"].as_str().unwrap()).await;
    }
    let again = app
        .post(
            "/v1/assets/B-10/reservations",
            Some(&idempotency_key()),
            &json!({"buyer_id": "hoarder"}),
        )
        .await;
    assert!(
        matches!(again.status().as_u16(), 201 | 409),
        "{}",
        again.status()
    );
    let body: Value = again.json().await.unwrap();
    assert_ne!(
        body["error_code"], "HOLD_LIMIT_REACHED",
        "lapsed holds do not count: {body}"
    );
}

/// Two clients using the same key at the same moment, in parallel: each
/// request is matched to its own client's stored answer, whatever batch it
/// is read in. A replay never answers with the other client's reservation,
/// and a key one client used says nothing about the other's.
async fn one_key_of_two_clients_at_once_stays_two_keys(backend: Backend) {
    let Some((app, keys)) = spawn_with_keys(backend, |_| {}).await else {
        return;
    };
    for id in ["PAIR-A", "PAIR-B"] {
        add_asset(&app, &keys, id).await;
    }
    let hold = |token: String, asset: &'static str, key: String| {
        let app = &app;
        async move {
            let response = hold_as(app, &token, asset, &key).await;
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.unwrap())
        }
    };
    let (status, mine) = hold(keys.shop.clone(), "PAIR-A", "both".into()).await;
    assert_eq!(status, 201, "{mine}");
    let (status, theirs) = hold(keys.other_shop.clone(), "PAIR-B", "both".into()).await;
    assert_eq!(status, 201, "{theirs}");
    let answers = join_all((0..200).map(|i| {
        let (token, asset, key) = match i % 5 {
            0 => (keys.shop.clone(), "PAIR-A", "both".to_owned()),
            1 => (keys.other_shop.clone(), "PAIR-B", "both".to_owned()),
            2 => (keys.shop.clone(), "PAIR-B", "both".to_owned()),
            3 => (keys.other_shop.clone(), "PAIR-A", "both".to_owned()),
            _ => (keys.other_shop.clone(), "PAIR-A", idempotency_key()),
        };
        let hold = &hold;
        async move { (i, hold(token, asset, key).await) }
    }))
    .await;
    for (i, (status, body)) in &answers {
        match i % 5 {
            0 => {
                assert_eq!(*status, 200, "shop-a's replay {i}: {body}");
                assert_eq!(body["reservation_id"], mine["reservation_id"]);
            }
            1 => {
                assert_eq!(*status, 200, "shop-b's replay {i}: {body}");
                assert_eq!(body["reservation_id"], theirs["reservation_id"]);
            }
            2 | 3 => {
                assert_eq!(*status, 422, "{i}: {body}");
                assert_eq!(body["error_code"], "IDEMPOTENCY_KEY_REUSED", "{i}: {body}");
            }
            _ => {
                assert_eq!(*status, 409, "{i}: {body}");
                assert_eq!(body["error_code"], "ASSET_UNAVAILABLE", "{i}: {body}");
            }
        }
    }
    assert_eq!(app.count("SELECT count(*) FROM reservations").await, 2);
}

/// The same for requests about reservations, whose first reads are read
/// together too: each storefront releases its own hold under the key
/// `both`, then, all at once, replays it, sends the key with the other's
/// reservation (a reused key), and asks to release the other's reservation
/// under new keys (not found: it is not theirs).
async fn one_key_of_two_clients_on_their_reservations_at_once_stays_two_keys(backend: Backend) {
    let Some((app, keys)) = spawn_with_keys(backend, |_| {}).await else {
        return;
    };
    let mut held = Vec::new();
    for (token, asset) in [(&keys.shop, "REL-A"), (&keys.other_shop, "REL-B")] {
        add_asset(&app, &keys, asset).await;
        let response = hold_as(&app, token, asset, &idempotency_key()).await;
        assert_eq!(response.status(), 201);
        let body: Value = response.json().await.unwrap();
        held.push(body["reservation_id"].as_str().unwrap().to_owned());
    }
    let release = |token: String, reservation: String, key: String| {
        let app = &app;
        async move {
            let response = app
                .client
                .post(app.url(&format!("/v1/reservations/{reservation}/release")))
                .bearer_auth(&token)
                .header("Idempotency-Key", &key)
                .json(&json!({}))
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.unwrap())
        }
    };
    let (mine, theirs) = (held[0].clone(), held[1].clone());
    let (status, body) = release(keys.shop.clone(), mine.clone(), "both".into()).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = release(keys.other_shop.clone(), theirs.clone(), "both".into()).await;
    assert_eq!(status, 200, "{body}");
    let answers = join_all((0..200).map(|i| {
        let (token, reservation, key) = match i % 5 {
            0 => (keys.shop.clone(), &mine, "both".to_owned()),
            1 => (keys.other_shop.clone(), &theirs, "both".to_owned()),
            2 => (keys.shop.clone(), &theirs, "both".to_owned()),
            3 => (keys.other_shop.clone(), &mine, "both".to_owned()),
            _ => (keys.other_shop.clone(), &mine, idempotency_key()),
        };
        let release = &release;
        async move { (i, release(token, reservation.clone(), key).await) }
    }))
    .await;
    for (i, (status, body)) in &answers {
        match i % 5 {
            0 | 1 => {
                let own = if i % 5 == 0 { &mine } else { &theirs };
                assert_eq!(*status, 200, "replay {i}: {body}");
                assert_eq!(body["reservation_id"], own.as_str(), "{i}");
            }
            2 | 3 => {
                assert_eq!(*status, 422, "{i}: {body}");
                assert_eq!(body["error_code"], "IDEMPOTENCY_KEY_REUSED", "{i}: {body}");
            }
            _ => {
                assert_eq!(*status, 404, "{i}: {body}");
                assert_eq!(body["error_code"], "RESERVATION_NOT_FOUND", "{i}: {body}");
            }
        }
    }
}

backend_tests!(
    a_burst_of_one_buyer_ends_at_the_limit;
    backend:
        every_role_against_every_operation,
        storefronts_see_only_their_own_reservations_and_keys,
        one_key_of_two_clients_at_once_stays_two_keys,
        one_key_of_two_clients_on_their_reservations_at_once_stays_two_keys,
        preflights_need_no_key,
        no_spelling_skips_the_keys,
        form_posts_are_refused_for_every_caller,
        basic_changes_come_only_from_this_site,
        storefronts_never_read_other_clients_buyers_or_payments,
        forced_withdrawal_names_its_actor,
);

/// A browser sends a preflight without credentials: with keys configured it
/// is still answered, and the request it clears then needs its key.
async fn preflights_need_no_key(backend: Backend) {
    let Some((app, keys)) = spawn_with_keys(backend, |c| {
        c.cors_origins = Some("https://shop.example".into());
    })
    .await
    else {
        return;
    };
    let preflight = app
        .raw(
            "OPTIONS",
            "/v1/assets/A-1/reservations",
            &[
                ("Origin", "https://shop.example"),
                ("Access-Control-Request-Method", "POST"),
                (
                    "Access-Control-Request-Headers",
                    "authorization, content-type, idempotency-key",
                ),
            ],
            "",
        )
        .await;
    assert_eq!(preflight.status, 200, "{}", preflight.body);
    assert_eq!(
        preflight.header("access-control-allow-origin"),
        Some("https://shop.example")
    );
    let get = |token: Option<String>| {
        let mut request = app
            .client
            .get(app.url("/v1/assets"))
            .header("Origin", "https://shop.example");
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        request.send()
    };
    assert_eq!(get(None).await.unwrap().status(), 401);
    assert_eq!(get(Some(keys.shop.clone())).await.unwrap().status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_is_answered_for_configured_origins_only() {
    let Some(app) = TestApp::try_spawn_with(Backend::Sqlite, |c| {
        c.cors_origins = Some("https://shop.example".into());
    })
    .await
    else {
        return;
    };
    let preflight = app
        .client
        .request(Method::OPTIONS, app.url("/v1/assets/A/reservations"))
        .header("Origin", "https://shop.example")
        .header("Access-Control-Request-Method", "POST")
        .header(
            "Access-Control-Request-Headers",
            "idempotency-key, content-type, authorization",
        )
        .send()
        .await
        .unwrap();
    assert_eq!(preflight.status(), 200);
    assert_eq!(
        preflight.headers()["access-control-allow-origin"],
        "https://shop.example"
    );
    let allowed = preflight.headers()["access-control-allow-headers"]
        .to_str()
        .unwrap()
        .to_lowercase();
    assert!(allowed.contains("idempotency-key"), "{allowed}");
    app.create_asset("C-1").await;
    let actual = app
        .client
        .post(app.url("/v1/assets/C-1/reservations"))
        .header("Origin", "https://shop.example")
        .header("Idempotency-Key", "cors-1")
        .json(&json!({"buyer_id": "b"}))
        .send()
        .await
        .unwrap();
    assert_eq!(actual.status(), 201);
    let exposed = actual.headers()["access-control-expose-headers"]
        .to_str()
        .unwrap()
        .to_lowercase();
    for header in ["location", "idempotent-replayed", "retry-after", "date"] {
        assert!(exposed.contains(header), "{exposed}");
    }
    let foreign = app
        .client
        .get(app.url("/v1/assets"))
        .header("Origin", "https://evil.example")
        .send()
        .await
        .unwrap();
    assert!(foreign
        .headers()
        .get("access-control-allow-origin")
        .is_none());

    let plain = TestApp::try_spawn(Backend::Sqlite).await.unwrap();
    let response = plain
        .client
        .get(plain.url("/v1/assets"))
        .header("Origin", "https://shop.example")
        .send()
        .await
        .unwrap();
    assert!(
        response
            .headers()
            .get("access-control-allow-origin")
            .is_none(),
        "CORS is off when unset"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rate_limit_answers_429_with_retry_after() {
    let Some((app, keys)) = spawn_with_keys(Backend::Sqlite, |c| {
        c.rate_limit_per_second = Some(2);
        c.rate_limit_burst = Some(3);
    })
    .await
    else {
        return;
    };
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(call(&app, Method::GET, "/v1/assets", Some(&keys.shop), None).await);
    }
    let codes: Vec<u16> = statuses.iter().map(|r| r.status().as_u16()).collect();
    assert_eq!(codes, [200, 200, 200, 429]);
    let limited = statuses.pop().unwrap();
    assert!(
        limited.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            >= 1
    );
    let body: Value = limited.json().await.unwrap();
    assert_eq!(body["error_code"], "RATE_LIMITED");
    // Per key: another client is not limited by this one.
    assert_eq!(
        call(&app, Method::GET, "/v1/assets", Some(&keys.payments), None)
            .await
            .status(),
        200
    );
    // Health stays reachable.
    assert_eq!(app.get("/healthz").await.status(), 200);
}

#[test]
fn open_mode_refuses_to_start_on_a_public_address() {
    let output = Command::new(env!("CARGO_BIN_EXE_holdfast"))
        .arg("serve")
        .env(
            "HOLDFAST_DATABASE_URL",
            "sqlite:///tmp/holdfast-never-created.db",
        )
        .env("HOLDFAST_BIND", "0.0.0.0:0")
        .env_remove("HOLDFAST_API_KEYS")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("HOLDFAST_API_KEYS") && stderr.contains("loopback"),
        "{stderr}"
    );
}

#[test]
fn keys_new_prints_a_token_and_its_entry() {
    let output = Command::new(env!("CARGO_BIN_EXE_holdfast"))
        .args(["keys", "new", "--name", "shop-9", "--role", "storefront"])
        .output()
        .unwrap();
    assert!(output.status.success());
    let text = String::from_utf8_lossy(&output.stdout);
    let token = text
        .lines()
        .find(|l| l.trim().starts_with("hf_"))
        .unwrap()
        .trim();
    let entry = text
        .lines()
        .find(|l| l.trim().starts_with("shop-9:storefront:"))
        .unwrap()
        .trim();
    let ring = holdfast::keys::KeyRing::parse(entry).unwrap();
    assert_eq!(ring.authenticate(token).unwrap().name, "shop-9");
}

/// Tokens, secrets and Authorization headers never reach the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_never_reach_the_log() {
    let (token, entry) = new_key("shop-log", Role::Storefront).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = std::env::temp_dir().join(format!("holdfast-log-{}", ulid::Ulid::new()));
    let mut child = Command::new(env!("CARGO_BIN_EXE_holdfast"))
        .arg("serve")
        .env(
            "HOLDFAST_DATABASE_URL",
            format!("sqlite://{}/h.db", dir.display()),
        )
        .env("HOLDFAST_BIND", format!("127.0.0.1:{port}"))
        .env("HOLDFAST_API_KEYS", &entry)
        .env("HOLDFAST_LOG_FORMAT", "json")
        .env("RUST_LOG", "debug")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let client = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    for _ in 0..100 {
        if client.get(format!("{base}/healthz")).send().await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for bearer in [token.as_str(), "hf_wrong-token-xyz"] {
        let response = client
            .post(format!("{base}/v1/assets/NONE/reservations"))
            .bearer_auth(bearer)
            .header("Idempotency-Key", "k")
            .json(&json!({"buyer_id": "b"}))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let body = response.text().await.unwrap();
        assert!(!body.contains(bearer), "the token came back in a body");
        assert!(matches!(status, 404 | 401), "{status}");
    }
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let output = tokio::task::spawn_blocking(move || {
        let _ = child.wait();
        let mut text = String::new();
        use std::io::Read;
        if let Some(mut out) = child.stdout.take() {
            out.read_to_string(&mut text).unwrap();
        }
        if let Some(mut err) = child.stderr.take() {
            err.read_to_string(&mut text).unwrap();
        }
        text
    })
    .await
    .unwrap();
    assert!(
        output.contains("\"request\""),
        "debug request lines were logged:\n{output}"
    );
    assert!(!output.contains(&token), "the token reached the log");
    assert!(
        !output.contains("hf_wrong-token-xyz"),
        "a presented token reached the log"
    );
    assert!(
        !output.to_lowercase().contains("bearer "),
        "an Authorization header reached the log"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Spellings of one path that reach the server as written: each letter or
/// digit percent-encoded in turn per segment, doubled and trailing slashes,
/// `.` and `..` segments, upper case. Whatever route actix finds for each,
/// that route's own rules apply.
fn spellings(path: &str) -> Vec<String> {
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    let join = |parts: &[String]| format!("/{}", parts.join("/"));
    let mut out = vec![path.to_owned()];
    for (i, segment) in segments.iter().enumerate() {
        let mut parts: Vec<String> = segments.iter().map(|s| s.to_string()).collect();
        // The first letter or digit, then every character, percent-encoded.
        if let Some(pos) = segment.find(|c: char| c.is_ascii_alphanumeric()) {
            let c = segment.as_bytes()[pos];
            parts[i] = format!("{}%{:02X}{}", &segment[..pos], c, &segment[pos + 1..]);
            out.push(join(&parts));
            parts[i] = format!("{}%{:02x}{}", &segment[..pos], c, &segment[pos + 1..]);
            out.push(join(&parts));
        }
        parts[i] = segment.bytes().map(|b| format!("%{b:02X}")).collect();
        out.push(join(&parts));
        // A doubled slash before this segment, and `.`/`..` around it.
        let mut doubled: Vec<String> = segments.iter().map(|s| s.to_string()).collect();
        doubled.insert(i, String::new());
        out.push(join(&doubled));
        let mut dot: Vec<String> = segments.iter().map(|s| s.to_string()).collect();
        dot.insert(i, ".".into());
        out.push(join(&dot));
        let mut dotdot: Vec<String> = segments.iter().map(|s| s.to_string()).collect();
        dotdot.insert(i, "..".into());
        dotdot.insert(i, "x".into());
        out.push(join(&dotdot));
        let mut upper: Vec<String> = segments.iter().map(|s| s.to_string()).collect();
        upper[i] = segment.to_uppercase();
        out.push(join(&upper));
    }
    out.push(format!("{path}/"));
    out.push(format!("/{path}"));
    out.push(path.to_uppercase());
    out.sort();
    out.dedup();
    out
}

/// What the matrix acts on: an available asset, a live hold, a refund and an
/// event, so that a request let through by mistake would succeed.
struct Fixture {
    asset: String,
    reservation: String,
    refund: String,
    event: String,
    payment: String,
}

async fn fixture(app: &TestApp, keys: &Keys) -> Fixture {
    let admin = Some(keys.admin.as_str());
    for id in ["ACL-A", "ACL-B", "ACL-C"] {
        let created = call(
            app,
            Method::POST,
            "/v1/assets",
            admin,
            Some(json!({"id": id, "name": id})),
        )
        .await;
        assert_eq!(created.status(), 201);
    }
    let hold = |asset: &'static str| async move {
        let r = call(
            app,
            Method::POST,
            &format!("/v1/assets/{asset}/reservations"),
            admin,
            Some(json!({"buyer_id": "acl-buyer", "hold_seconds": 3600})),
        )
        .await;
        assert_eq!(r.status(), 201);
        r.json::<Value>().await.unwrap()["reservation_id"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let reservation = hold("ACL-B").await;
    let released = hold("ACL-C").await;
    let path = format!("/v1/reservations/{released}");
    assert_eq!(
        call(
            app,
            Method::POST,
            &format!("{path}/release"),
            admin,
            Some(json!({}))
        )
        .await
        .status(),
        200
    );
    let refused: Value = call(
        app,
        Method::POST,
        &format!("{path}/commit"),
        admin,
        Some(json!({"payment_reference": "acl-refunded"})),
    )
    .await
    .json()
    .await
    .unwrap();
    let refund = refused["refund"]["refund_id"].as_str().unwrap().to_owned();
    let events: Value = call(app, Method::GET, "/v1/assets/ACL-B/events", admin, None)
        .await
        .json()
        .await
        .unwrap();
    let event = events["items"][0]["id"].as_str().unwrap().to_owned();
    Fixture {
        asset: "ACL-A".into(),
        reservation,
        refund,
        event,
        payment: "acl-refunded".into(),
    }
}

impl Fixture {
    fn path(&self, template: &str) -> String {
        template
            .replace("{asset_id}", &self.asset)
            .replace("{reservation_id}", &self.reservation)
            .replace("{refund_id}", &self.refund)
            .replace("{event_id}", &self.event)
            .replace("{payment_reference}", &self.payment)
    }

    /// A body the operation would accept, so that only the guard stands
    /// between a request and its effect.
    fn body(&self, operation: &str, who: &str) -> Value {
        match operation {
            "create_asset" => {
                json!({"id": format!("ACL-{who}-{}", ulid::Ulid::new()), "name": "x"})
            }
            "hold_asset" => json!({"buyer_id": "intruder"}),
            "commit_reservation" => json!({"payment_reference": "intruder-pay"}),
            "extend_reservation" => json!({"hold_seconds": 60}),
            "update_asset" => json!({"available_from": null}),
            _ => json!({}),
        }
    }
}

/// Every operation of the document, every caller, every spelling of its
/// path: nobody without a key gets past 401, and no role outside an
/// operation's rule gets a 2xx or a 409, however the path is written.
async fn no_spelling_skips_the_keys(backend: Backend) {
    let Some((app, keys)) = spawn_with_keys(backend, |_| {}).await else {
        return;
    };
    let fixture = fixture(&app, &keys).await;
    let doc = app.get_json("/openapi.json").await;
    let expected = expected_roles();
    let public_paths: Vec<String> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, item)| {
            item.as_object()
                .unwrap()
                .values()
                .any(|op| expected[op["operationId"].as_str().unwrap()].is_none())
        })
        .map(|(path, _)| path.clone())
        .collect();
    let mut sent = 0;
    for (template, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let id = op["operationId"].as_str().unwrap();
            let roles = expected
                .get(id)
                .unwrap_or_else(|| panic!("{method} {template} ({id}) is not in the matrix"));
            let Some(allowed) = roles else { continue };
            let method = method.to_uppercase();
            let canonical = fixture.path(template);
            for path in spellings(&canonical) {
                let callers = [
                    ("nobody", None),
                    ("stranger", Some("hf_not-a-key")),
                    ("storefront", Some(keys.shop.as_str())),
                    ("payments", Some(keys.payments.as_str())),
                    ("admin", Some(keys.admin.as_str())),
                ];
                for (who, token) in callers {
                    let bearer = token.map(|t| format!("Bearer {t}"));
                    let mut headers = vec![
                        ("Content-Type", "application/json"),
                        ("Idempotency-Key", "matrix-key"),
                    ];
                    if let Some(bearer) = &bearer {
                        headers.push(("Authorization", bearer.as_str()));
                    }
                    let body = fixture.body(id, who).to_string();
                    let answer = app.raw(&method, &path, &headers, &body).await;
                    sent += 1;
                    let status = answer.status;
                    let what = format!("{who} {method} {path} ({id}): {status} {}", answer.body);
                    assert!(status < 500, "{what}");
                    let public = public_paths.contains(&path);
                    match who {
                        "nobody" | "stranger" if !public => assert_eq!(status, 401, "{what}"),
                        "nobody" | "stranger" => {}
                        role if !allowed.contains(&role) => {
                            assert!(!(200..300).contains(&status) && status != 409, "{what}");
                            if path == canonical {
                                assert_eq!(status, 403, "{what}");
                            }
                        }
                        _ if path == canonical => {
                            assert!(status != 401 && status != 403, "{what}")
                        }
                        _ => {}
                    }
                }
            }
        }
    }
    assert!(sent > 1000, "{sent} requests");
    // Refusals changed nothing: the hold is live and unpaid, one refund.
    let held = app
        .get_json_as(
            &format!("/v1/reservations/{}", fixture.reservation),
            &keys.admin,
        )
        .await;
    assert_eq!(held["buyer_id"], "acl-buyer");
    assert_eq!(
        app.count(
            "SELECT count(*) FROM assets WHERE id LIKE 'ACL-%-%' AND id NOT LIKE 'ACL-admin-%'"
        )
        .await,
        0,
        "no asset was created by a refused request"
    );
    assert!(
        app.count("SELECT count(*) FROM assets WHERE id LIKE 'ACL-admin-%'")
            .await
            > 0
    );
}

#[test]
fn spellings_cover_the_ways_to_write_a_path() {
    let all = spellings("/v1/assets");
    for expected in [
        "/v1/assets",
        "/v1/%61ssets",
        "/%76%31/assets",
        "/v1//assets",
        "//v1/assets",
        "/v1/./assets",
        "/v1/x/../assets",
        "/v1/assets/",
        "/V1/ASSETS",
    ] {
        assert!(all.contains(&expected.to_owned()), "{expected} in {all:?}");
    }
}

/// A form post is the one request any page may send cross-site without a
/// preflight: it is never an API call, whoever sends it.
async fn form_posts_are_refused_for_every_caller(backend: Backend) {
    let Some((app, keys)) = spawn_with_keys(backend, |_| {}).await else {
        return;
    };
    let bearer = format!("Bearer {}", keys.admin);
    let basic = basic_auth(&keys.admin);
    for content_type in [
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "text/plain",
        "Text/Plain; charset=utf-8",
    ] {
        for auth in [None, Some(bearer.as_str()), Some(basic.as_str())] {
            for (method, path, body) in [
                ("POST", "/v1/assets", r#"{"id":"FORM-1","name":"x"}"#),
                ("POST", "/v1/assets", ""),
                ("PATCH", "/v1/assets/FORM-1", ""),
                ("DELETE", "/v1/assets/FORM-1", ""),
                (
                    "POST",
                    "/v1/events/evt_01HZX4B2Q7C3M9D8E6F5G4H3JB/redeliver",
                    "",
                ),
                ("POST", "/no/such/route", ""),
            ] {
                let mut headers = vec![("Content-Type", content_type)];
                if let Some(auth) = auth {
                    headers.push(("Authorization", auth));
                }
                let answer = app.raw(method, path, &headers, body).await;
                assert_eq!(
                    answer.status, 415,
                    "{method} {path} {content_type} {auth:?}"
                );
                assert_eq!(
                    answer.header("content-type"),
                    Some("application/problem+json")
                );
                assert!(answer.body.contains("UNSUPPORTED_MEDIA_TYPE"));
            }
        }
    }
    assert_eq!(app.count("SELECT count(*) FROM assets").await, 0);
}

fn basic_auth(token: &str) -> String {
    use base64::Engine;
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("ops:{token}"))
    )
}

/// A browser sends Basic credentials by itself, also with a request another
/// site made it send: a change signed in with Basic must come from this site.
async fn basic_changes_come_only_from_this_site(backend: Backend) {
    let Some((app, keys)) = spawn_with_keys(backend, |_| {}).await else {
        return;
    };
    let basic = basic_auth(&keys.admin);
    let bearer = format!("Bearer {}", keys.admin);
    let host = app.address.trim_start_matches("http://").to_owned();
    let same_origin = format!("http://{host}");
    type Headers<'a> = Vec<(&'a str, &'a str)>;
    let cases: Vec<(&str, Headers, u16)> = vec![
        ("cross-site", vec![("Sec-Fetch-Site", "cross-site")], 403),
        ("same-site", vec![("Sec-Fetch-Site", "same-site")], 403),
        (
            "foreign origin",
            vec![("Origin", "https://evil.example")],
            403,
        ),
        ("null origin", vec![("Origin", "null")], 403),
        ("same-origin", vec![("Sec-Fetch-Site", "same-origin")], 201),
        ("typed by hand", vec![("Sec-Fetch-Site", "none")], 201),
        ("own origin", vec![("Origin", same_origin.as_str())], 201),
        ("no browser headers", vec![], 201),
    ];
    for (i, (what, extra, want)) in cases.into_iter().enumerate() {
        let mut headers = vec![
            ("Content-Type", "application/json"),
            ("Authorization", basic.as_str()),
        ];
        headers.extend(extra);
        let body = format!(r#"{{"id":"CSRF-{i}","name":"x"}}"#);
        let answer = app.raw("POST", "/v1/assets", &headers, &body).await;
        assert_eq!(answer.status, want, "{what}: {}", answer.body);
        let exists = app
            .count(&format!(
                "SELECT count(*) FROM assets WHERE id = 'CSRF-{i}'"
            ))
            .await;
        assert_eq!(exists, i64::from(want == 201), "{what}");
    }
    // Reading with Basic from anywhere is fine; Bearer is never at risk.
    let read = app
        .raw(
            "GET",
            "/v1/assets",
            &[("Authorization", &basic), ("Sec-Fetch-Site", "cross-site")],
            "",
        )
        .await;
    assert_eq!(read.status, 200);
    let bearer_cross = app
        .raw(
            "POST",
            "/v1/assets",
            &[
                ("Content-Type", "application/json"),
                ("Authorization", &bearer),
                ("Sec-Fetch-Site", "cross-site"),
                ("Origin", "https://shop.example"),
            ],
            r#"{"id":"CSRF-bearer","name":"x"}"#,
        )
        .await;
    assert_eq!(bearer_cross.status, 201, "{}", bearer_cross.body);
}

/// Made-up methods and unknown paths share the `other` and `unmatched`
/// labels: three hundred of them add no series to /metrics. A process of
/// its own, so that every series on its /metrics is this test's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_labels_stay_bounded() {
    let Some(app) = TestApp::try_spawn_process(Backend::Sqlite, |_, _| {}).await else {
        return;
    };
    let series = |text: &str| {
        text.lines()
            .filter(|l| l.starts_with("holdfast_http_requests_duration_seconds"))
            .count()
    };
    let first = app.get("/metrics").await.text().await.unwrap();
    assert!(!first.contains(r#"method="other""#), "{first}");
    assert!(!first.contains(r#"route="unmatched""#), "{first}");
    // One of each kind first, so that their series exist.
    app.raw("BREW", "/v1/assets", &[], "").await;
    app.raw("BREW", "/no/such/route", &[], "").await;
    app.get("/metrics").await;
    let before = series(&app.get("/metrics").await.text().await.unwrap());
    for i in 0..300 {
        let method = format!("X{i}METHOD");
        app.raw(&method, &format!("/no/such/route-{i}"), &[], "")
            .await;
        app.raw(&method, "/v1/assets", &[], "").await;
    }
    let text = app.get("/metrics").await.text().await.unwrap();
    assert_eq!(series(&text), before, "no new series");
    assert!(text.contains(r#"method="other""#), "{text}");
    assert!(text.contains(r#"route="unmatched""#), "{text}");
    assert!(!text.contains("X7METHOD"));
    assert!(!text.contains("/no/such/route-7"));
}

#[test]
fn a_key_named_like_open_mode_or_with_two_roles_refuses_to_start() {
    let zeros = "0".repeat(64);
    for (keys, named) in [
        (format!("-:admin:{zeros}"), "\"-\""),
        (
            format!("ops:admin:{zeros},ops:payments:{}", "1".repeat(64)),
            "key ops",
        ),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_holdfast"))
            .arg("serve")
            .env(
                "HOLDFAST_DATABASE_URL",
                "sqlite:///tmp/holdfast-never-created.db",
            )
            .env("HOLDFAST_BIND", "127.0.0.1:0")
            .env("HOLDFAST_API_KEYS", &keys)
            .output()
            .unwrap();
        assert!(!output.status.success());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("HOLDFAST_API_KEYS") && stderr.contains(named),
            "{stderr}"
        );
    }
}

/// A storefront reads assets and events, but another client's buyers,
/// payments and refunds never reach it: its events are summaries, an asset
/// names only the storefront's own current reservation.
async fn storefronts_never_read_other_clients_buyers_or_payments(backend: Backend) {
    let Some((app, keys)) = spawn_with_keys(backend, |_| {}).await else {
        return;
    };
    let send = |method: Method, path: String, token: String, body: Option<Value>| {
        let app = &app;
        async move {
            let response = call(app, method, &path, Some(&token), body).await;
            let status = response.status().as_u16();
            (status, response.text().await.unwrap())
        }
    };
    for id in ["P-1", "P-2"] {
        let body = json!({"id": id, "name": id});
        let (status, _) = send(
            Method::POST,
            "/v1/assets".into(),
            keys.admin.clone(),
            Some(body),
        )
        .await;
        assert_eq!(status, 201);
    }
    // shop-b holds P-1 and pays; the sale is voided with a refund. shop-a holds P-2.
    let hold = |token: String, asset: &str| {
        let path = format!("/v1/assets/{asset}/reservations");
        send(
            Method::POST,
            path,
            token,
            Some(json!({"buyer_id": "secret-buyer-b"})),
        )
    };
    let (_, theirs) = hold(keys.other_shop.clone(), "P-1").await;
    let theirs: Value = serde_json::from_str(&theirs).unwrap();
    let theirs_id = theirs["reservation_id"].as_str().unwrap().to_owned();
    let (status, _) = send(
        Method::POST,
        format!("/v1/reservations/{theirs_id}/commit"),
        keys.payments.clone(),
        Some(json!({"payment_reference": "secret-payment-b"})),
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = send(
        Method::POST,
        format!("/v1/reservations/{theirs_id}/void"),
        keys.admin.clone(),
        Some(json!({})),
    )
    .await;
    assert_eq!(status, 200);
    let (status, again) = hold(keys.other_shop.clone(), "P-1").await;
    assert_eq!(status, 201);
    let again: Value = serde_json::from_str(&again).unwrap();
    let again_id = again["reservation_id"].as_str().unwrap().to_owned();
    let (status, mine) = send(
        Method::POST,
        "/v1/assets/P-2/reservations".into(),
        keys.shop.clone(),
        Some(json!({"buyer_id": "my-buyer"})),
    )
    .await;
    assert_eq!(status, 201);
    let mine: Value = serde_json::from_str(&mine).unwrap();
    let mine_id = mine["reservation_id"].as_str().unwrap();

    let secrets = [
        theirs_id.as_str(),
        again_id.as_str(),
        "secret-buyer-b",
        "secret-payment-b",
        "rf_",
    ];
    for path in [
        "/v1/events",
        "/v1/events?limit=500",
        "/v1/assets/P-1/events",
        "/v1/assets/P-1",
        "/v1/assets",
        "/v1/assets?status=HELD",
        "/v1/reservations",
        "/v1/reservations?asset_id=P-1",
        "/v1/reservations?buyer_id=secret-buyer-b",
    ] {
        let (status, text) = send(Method::GET, path.into(), keys.shop.clone(), None).await;
        assert_eq!(status, 200, "{path}");
        for secret in secrets {
            assert!(!text.contains(secret), "{path} shows {secret}: {text}");
        }
    }
    // Their events keep type, asset, sequence and times; data is a summary.
    let (_, text) = send(
        Method::GET,
        "/v1/assets/P-1/events".into(),
        keys.shop.clone(),
        None,
    )
    .await;
    let events: Value = serde_json::from_str(&text).unwrap();
    let items = events["items"].as_array().unwrap();
    let types: Vec<&str> = items.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        types,
        [
            "reservation.held",
            "reservation.committed",
            "reservation.voided",
            "refund.requested",
            "reservation.held"
        ]
    );
    for (i, event) in items.iter().enumerate() {
        assert_eq!(event["sequence"], i + 1);
        assert!(event["created_at"].is_string());
        assert_eq!(event["data"]["redacted"], true, "{event}");
        assert_eq!(event["data_kind"], "summary", "{event}");
        assert_eq!(event["data"]["asset_id"], "P-1");
        assert!(event["actor"].is_null(), "{event}");
    }
    assert!(items[0]["data"]["hold_expires_at"].is_string());
    // The asset shows its own current reservation only to its owner.
    let asset = |token: String| {
        let send = &send;
        async move {
            let (_, text) = send(Method::GET, "/v1/assets/P-1".into(), token, None).await;
            serde_json::from_str::<Value>(&text).unwrap()
        }
    };
    let seen = asset(keys.shop.clone()).await;
    assert_eq!(seen["status"], "HELD");
    assert!(seen["hold_expires_at"].is_string());
    assert_eq!(seen["current_reservation_id"], Value::Null);
    assert!(asset(keys.other_shop.clone()).await["current_reservation_id"].is_string());
    assert!(asset(keys.admin.clone()).await["current_reservation_id"].is_string());
    let (_, own) = send(
        Method::GET,
        "/v1/assets/P-2".into(),
        keys.shop.clone(),
        None,
    )
    .await;
    assert!(own.contains(mine_id));
    // Their owner, the admin and payments see everything, and who voided.
    let (_, text) = send(
        Method::GET,
        "/v1/assets/P-1/events".into(),
        keys.other_shop.clone(),
        None,
    )
    .await;
    assert!(text.contains("secret-payment-b"));
    let (_, text) = send(
        Method::GET,
        "/v1/assets/P-1/events".into(),
        keys.admin.clone(),
        None,
    )
    .await;
    let events: Value = serde_json::from_str(&text).unwrap();
    let kinds: Vec<&str> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["data_kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "reservation",
            "reservation",
            "reservation",
            "refund",
            "reservation"
        ]
    );
    assert_eq!(events["items"][2]["type"], "reservation.voided");
    assert_eq!(events["items"][2]["actor"], "ops");
    assert_eq!(events["items"][3]["actor"], "ops");
    assert_eq!(events["items"][0]["actor"], Value::Null);
}

/// Forced withdrawal names who did it.
async fn forced_withdrawal_names_its_actor(backend: Backend) {
    let Some((app, keys)) = spawn_with_keys(backend, |_| {}).await else {
        return;
    };
    let body = json!({"id": "W-1", "name": "w"});
    assert_eq!(
        call(
            &app,
            Method::POST,
            "/v1/assets",
            Some(&keys.admin),
            Some(body)
        )
        .await
        .status(),
        201
    );
    let held = call(
        &app,
        Method::POST,
        "/v1/assets/W-1/reservations",
        Some(&keys.shop),
        Some(json!({"buyer_id": "b"})),
    )
    .await;
    assert_eq!(held.status(), 201);
    let forced = call(
        &app,
        Method::POST,
        "/v1/assets/W-1/withdraw",
        Some(&keys.admin),
        Some(json!({"force": true})),
    )
    .await;
    assert_eq!(forced.status(), 200);
    let events = app.get_json_as("/v1/assets/W-1/events", &keys.admin).await;
    let items = events["items"].as_array().unwrap();
    let by_type = |t: &str| items.iter().find(|e| e["type"] == t).unwrap().clone();
    assert_eq!(by_type("reservation.released")["actor"], "ops");
    assert_eq!(by_type("asset.withdrawn")["actor"], "ops");
    assert_eq!(by_type("reservation.held")["actor"], Value::Null);
    // The shop still sees its own released hold in full.
    let own = app.get_json_as("/v1/assets/W-1/events", &keys.shop).await;
    assert_eq!(own["items"][1]["data"]["buyer_id"], "b");
}
