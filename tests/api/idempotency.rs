use std::time::Duration;

use serde_json::{json, Value};

use crate::backend_tests;
use crate::helpers::{patient, Backend, TestApp};

async fn replay_of_a_201_is_a_byte_identical_200(app: TestApp) {
    app.create_asset("I-1").await;
    let body = json!({"buyer_id": "b", "hold_seconds": 300});
    let first = app
        .post("/v1/assets/I-1/reservations", Some("key-1"), &body)
        .await;
    assert_eq!(first.status(), 201);
    let location = first.headers()["location"].clone();
    let first_bytes = first.bytes().await.unwrap();
    for _ in 0..2 {
        let replay = app
            .post("/v1/assets/I-1/reservations", Some("key-1"), &body)
            .await;
        assert_eq!(replay.status(), 200);
        assert_eq!(replay.headers()["idempotent-replayed"], "true");
        assert_eq!(replay.headers()["location"], location);
        assert_eq!(replay.headers()["content-type"], "application/json");
        assert_eq!(replay.bytes().await.unwrap(), first_bytes);
    }
    // Members in another order and other whitespace are the same request.
    let reordered = app
        .client
        .post(app.url("/v1/assets/I-1/reservations"))
        .header("Idempotency-Key", "key-1")
        .header("Content-Type", "application/json")
        .body("{ \"hold_seconds\": 300,\n \"buyer_id\": \"b\" }")
        .send()
        .await
        .unwrap();
    assert_eq!(reordered.status(), 200);
    assert_eq!(app.count("SELECT count(*) FROM reservations").await, 1);
}

async fn the_key_is_required_and_bounded(app: TestApp) {
    app.create_asset("I-2").await;
    let body = json!({"buyer_id": "b"});
    let long = "k".repeat(256);
    for key in [None, Some(""), Some(long.as_str()), Some("tab\tkey")] {
        let response = app.post("/v1/assets/I-2/reservations", key, &body).await;
        assert_eq!(response.status(), 400, "{key:?}");
        let problem: Value = response.json().await.unwrap();
        assert_eq!(problem["error_code"], "IDEMPOTENCY_KEY_INVALID");
    }
    let max = "k".repeat(255);
    assert_eq!(
        app.post("/v1/assets/I-2/reservations", Some(&max), &body)
            .await
            .status(),
        201
    );
    let r = app.get_json("/v1/assets/I-2").await;
    let id = r["current_reservation_id"].as_str().unwrap();
    for path in [
        format!("/v1/reservations/{id}/commit"),
        format!("/v1/reservations/{id}/release"),
    ] {
        let response = app
            .post(&path, None, &json!({"payment_reference": "p"}))
            .await;
        assert_eq!(response.status(), 400, "{path}");
    }
}

async fn same_key_for_another_request_is_422_reused(app: TestApp) {
    app.create_asset("I-3").await;
    app.create_asset("I-4").await;
    let first = app
        .post(
            "/v1/assets/I-3/reservations",
            Some("shared"),
            &json!({"buyer_id": "b"}),
        )
        .await;
    assert_eq!(first.status(), 201);
    let first: Value = first.json().await.unwrap();
    for (path, body) in [
        (
            "/v1/assets/I-3/reservations".to_owned(),
            json!({"buyer_id": "other"}),
        ),
        (
            "/v1/assets/I-4/reservations".to_owned(),
            json!({"buyer_id": "b"}),
        ),
        (
            format!(
                "/v1/reservations/{}/commit",
                first["reservation_id"].as_str().unwrap()
            ),
            json!({"payment_reference": "p"}),
        ),
    ] {
        let response = app.post(&path, Some("shared"), &body).await;
        assert_eq!(response.status(), 422, "{path}");
        let problem: Value = response.json().await.unwrap();
        assert_eq!(problem["error_code"], "IDEMPOTENCY_KEY_REUSED");
    }
    assert_eq!(app.get_json("/v1/assets/I-4").await["status"], "AVAILABLE");
    assert_eq!(app.get_json("/v1/assets/I-3").await["status"], "HELD");
}

async fn rejections_are_not_stored_so_a_retry_runs_again(app: TestApp) {
    app.create_asset("I-5").await;
    let holder = app.hold("I-5", "first", 300).await;
    let body = json!({"buyer_id": "second"});
    let response = app
        .post("/v1/assets/I-5/reservations", Some("retry-me"), &body)
        .await;
    assert_eq!(response.status(), 409);
    assert_eq!(
        app.count("SELECT count(*) FROM idempotency_keys WHERE key = 'retry-me'")
            .await,
        0
    );
    app.release(holder["reservation_id"].as_str().unwrap(), "rel")
        .await;
    let response = app
        .post("/v1/assets/I-5/reservations", Some("retry-me"), &body)
        .await;
    assert_eq!(response.status(), 201);
    assert!(response.headers().get("idempotent-replayed").is_none());
}

async fn stored_409_with_refund_replays_as_409(app: TestApp) {
    app.create_asset("I-6").await;
    let r = app.hold("I-6", "b", 300).await;
    let id = r["reservation_id"].as_str().unwrap();
    app.release(id, "rel").await;
    let first = app.commit(id, "pay-key", "pay-1").await;
    assert_eq!(first.status(), 409);
    let first_bytes = first.bytes().await.unwrap();
    let replay = app.commit(id, "pay-key", "pay-1").await;
    assert_eq!(replay.status(), 409);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.headers()["content-type"], "application/problem+json");
    assert_eq!(replay.bytes().await.unwrap(), first_bytes);
}

/// A retry sent while the first attempt still runs (its client gave up on
/// it) waits for it and replays its answer, on the instance that runs it
/// and on another one: never a refusal decided on a read the first
/// attempt's write had not reached yet.
///
/// The first release decides on a live hold, then waits behind a lock held
/// outside the service while the hold lapses; a retry deciding on its own
/// read would find the hold EXPIRED and answer 409 RESERVATION_NOT_ACTIVE,
/// and the first would release it after all.
async fn a_retry_of_a_running_request_replays_its_answer(backend: Backend) {
    let Some(app) = TestApp::try_spawn_twins(backend, patient).await else {
        return;
    };
    let instances = app.instances();
    let (first, last) = (instances[0], instances[instances.len() - 1]);
    retry_while_running(&app, "I-7", first, first).await;
    if first != last {
        retry_while_running(&app, "I-8", first, last).await;
    }
}

/// Releases a hold on `first` and retries the release on `retry` while the
/// first attempt waits to write.
async fn retry_while_running(app: &TestApp, asset: &str, first: &str, retry: &str) {
    app.create_asset(asset).await;
    let hold = app.hold(asset, "b", 60).await;
    let id = hold["reservation_id"].as_str().expect("an id").to_owned();
    // It lapses in 1.5 s.
    app.age_hold(&id, Duration::from_millis(58_500)).await;
    let blocker = app.lock_asset(asset).await;
    let release = |address: &str| {
        let request = app
            .client
            .post(format!("{address}/v1/reservations/{id}/release"))
            .header("Idempotency-Key", format!("release-{asset}"))
            .json(&json!({}))
            .send();
        async move {
            let response = request.await.expect("sent");
            let replayed = response.headers().contains_key("idempotent-replayed");
            let status = response.status().as_u16();
            (status, replayed, response.text().await.expect("a body"))
        }
    };
    let attempt = tokio::spawn(release(first));
    if app.backend == Backend::Postgres {
        app.lock_waiters(1).await;
    }
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    let retried = tokio::spawn(release(retry));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !retried.is_finished(),
        "the retry answered while the first attempt ran"
    );
    blocker.release().await;
    let (attempt, retried) = (
        attempt.await.expect("joined"),
        retried.await.expect("joined"),
    );
    let body: Value = serde_json::from_str(&attempt.2).expect("JSON");
    if app.backend == Backend::Sqlite && attempt.0 == 409 {
        // SQLite's write checks the hold at its own clock, after the lapse:
        // the first attempt refuses too, and stores nothing.
        assert_eq!(body["error_code"], "RESERVATION_NOT_ACTIVE", "{body}");
        let again: Value = serde_json::from_str(&retried.2).expect("JSON");
        assert_eq!(
            (retried.0, again["error_code"].clone()),
            (409, body["error_code"].clone())
        );
        return;
    }
    assert_eq!((attempt.0, attempt.1), (200, false), "{}", attempt.2);
    assert_eq!(body["status"], "RELEASED");
    assert_eq!((retried.0, retried.1), (200, true), "{}", retried.2);
    assert_eq!(retried.2, attempt.2);
}

/// One database connection per instance, and timeouts long enough to wait
/// for it while [`keep_the_connection`] keeps it busy.
fn one_connection(config: &mut holdfast::Config) {
    patient(config);
    config.db_pool_size = 1;
    config.db_acquire_timeout_ms = 20_000;
}

/// `method path` with `key` and `body`, sent to the instance at `address`:
/// its status and JSON body (null when it has none). Built at once, so that
/// it can be spawned.
fn send_to(
    app: &TestApp,
    method: reqwest::Method,
    address: &str,
    path: &str,
    key: &str,
    body: Value,
) -> impl std::future::Future<Output = (u16, Value)> + Send + 'static {
    let request = app
        .client
        .request(method, format!("{address}{path}"))
        .header("Idempotency-Key", key)
        .json(&body)
        .send();
    async move {
        let response = request.await.expect("sent");
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }
}

/// Keeps the one connection of the instance at `address` busy: the release
/// of a hold on `asset` (made here) waits there behind a lock the test
/// holds, until the blocker is released; the task answers the release.
async fn keep_the_connection(
    app: &TestApp,
    address: &str,
    asset: &str,
) -> (
    crate::helpers::Blocker,
    tokio::task::JoinHandle<(u16, Value)>,
) {
    app.create_asset(asset).await;
    let busy = app.hold(asset, "w", 60).await["reservation_id"].clone();
    let blocker = app.lock_asset(asset).await;
    let path = format!("/v1/reservations/{}/release", busy.as_str().expect("an id"));
    let key = format!("release-{asset}");
    let release = send_to(app, reqwest::Method::POST, address, &path, &key, json!({}));
    let stuck = tokio::spawn(release);
    app.lock_waiters(1).await;
    (blocker, stuck)
}

/// A request's first attempt, sent to the instance whose one connection
/// [`keep_the_connection`] keeps busy: it waits there for that connection.
struct Delayed {
    blocker: crate::helpers::Blocker,
    stuck: tokio::task::JoinHandle<(u16, Value)>,
    attempt: tokio::task::JoinHandle<(u16, Value)>,
}

/// Sends `request` to `first` while its connection is kept busy (on asset
/// `busy`), and checks that it waits.
async fn delay(
    app: &TestApp,
    first: &str,
    busy: &str,
    request: impl std::future::Future<Output = (u16, Value)> + Send + 'static,
) -> Delayed {
    let (blocker, stuck) = keep_the_connection(app, first, busy).await;
    let attempt = tokio::spawn(request);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!attempt.is_finished(), "the first attempt waits");
    Delayed {
        blocker,
        stuck,
        attempt,
    }
}

impl Delayed {
    /// Frees the connection: the first attempt's answer.
    async fn answer(self) -> (u16, Value) {
        self.blocker.release().await;
        assert_eq!(self.stuck.await.expect("joined").0, 200);
        self.attempt.await.expect("joined")
    }
}

/// A hold is decided on the asset as it stood when the request arrived.
/// Its client gave up on a first attempt, still waiting for a connection on
/// one instance, and sent it again to another, which refused it: another
/// buyer held the asset. That hold then ends. The first attempt, reading
/// only now, finds the asset free; it refuses too, as the asset stood at its
/// arrival, instead of holding it under a key whose last answer was the
/// refusal. A retry sent after the release holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_is_decided_on_the_asset_as_it_stood_at_its_arrival_on_postgres() {
    let Some(app) = TestApp::try_spawn_twins(Backend::Postgres, one_connection).await else {
        return;
    };
    let instances = app.instances();
    let (first, other) = (instances[0], instances[instances.len() - 1]);
    assert_ne!(first, other, "two instances");
    app.create_asset("I-9").await;
    let taken = app.hold("I-9", "x", 60).await["reservation_id"].clone();
    let hold = |address: &str| {
        let body = json!({"buyer_id": "b", "hold_seconds": 60});
        let path = "/v1/assets/I-9/reservations";
        send_to(
            &app,
            reqwest::Method::POST,
            address,
            path,
            "late-hold",
            body,
        )
    };
    let attempt = delay(&app, first, "I-10", hold(first)).await;
    let (status, refused) = hold(other).await;
    assert_eq!(
        (status, refused["error_code"].as_str()),
        (409, Some("ASSET_UNAVAILABLE"))
    );
    let path = format!(
        "/v1/reservations/{}/release",
        taken.as_str().expect("an id")
    );
    let release = send_to(
        &app,
        reqwest::Method::POST,
        other,
        &path,
        "release-taken",
        json!({}),
    );
    let (status, released) = release.await;
    assert_eq!(status, 200, "{released}");
    let (status, late) = attempt.answer().await;
    assert_eq!(
        (status, late["error_code"].as_str()),
        (409, Some("ASSET_UNAVAILABLE")),
        "{late}"
    );
    assert_eq!(late["asset_status"], "HELD", "{late}");
    let kept = "SELECT count(*) FROM reservations WHERE asset_id = 'I-9' AND buyer_id = 'b'";
    assert_eq!(
        app.count(kept).await,
        0,
        "nothing held under the refused key"
    );
    let (status, held) = hold(other).await;
    assert_eq!(status, 201, "{held}");
}

/// The same with a sale's opening: the first attempt arrives before the
/// sale opens and waits; its retry is refused (`SALE_NOT_OPEN`); the sale
/// opens by itself, and then an operator removes its opening time. The
/// first attempt still refuses: the asset was not on sale at its arrival.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_that_arrived_before_the_opening_refuses_after_it_is_removed_on_postgres() {
    let Some(app) = TestApp::try_spawn_twins(Backend::Postgres, one_connection).await else {
        return;
    };
    let instances = app.instances();
    let (first, other) = (instances[0], instances[instances.len() - 1]);
    let opens = chrono::Utc::now() + chrono::Duration::milliseconds(1_500);
    let opens_text = opens.to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    let (status, created) = app
        .send(
            reqwest::Method::POST,
            "/v1/assets",
            None,
            Some(json!({"id": "I-15", "name": "later", "available_from": opens_text})),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    let hold = |address: &str| {
        let body = json!({"buyer_id": "b", "hold_seconds": 60});
        let path = "/v1/assets/I-15/reservations";
        send_to(
            &app,
            reqwest::Method::POST,
            address,
            path,
            "opening-hold",
            body,
        )
    };
    let attempt = delay(&app, first, "I-16", hold(first)).await;
    let (status, refused) = hold(other).await;
    assert_eq!(
        (status, refused["error_code"].as_str()),
        (409, Some("SALE_NOT_OPEN")),
        "{refused}"
    );
    let wait = (opens - chrono::Utc::now()).to_std().unwrap_or_default();
    tokio::time::sleep(wait + Duration::from_millis(200)).await;
    let opened = json!({"available_from": null});
    let patch = send_to(
        &app,
        reqwest::Method::PATCH,
        other,
        "/v1/assets/I-15",
        "open-I-15",
        opened,
    );
    let (status, patched) = patch.await;
    assert_eq!(status, 200, "{patched}");
    let (status, late) = attempt.answer().await;
    assert_eq!(status, 409, "{late}");
    let kept = "SELECT count(*) FROM reservations WHERE asset_id = 'I-15'";
    assert_eq!(
        app.count(kept).await,
        0,
        "nothing held under the refused key"
    );
}

/// A buyer's own hold, live when the buyer's next hold of the asset arrived
/// but lapsed by the time that hold is read (it waited for a connection),
/// is the buyer's to take again: 201, not a refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_own_hold_that_lapses_while_the_next_waits_is_taken_again_on_postgres() {
    let Some(app) = TestApp::try_spawn_with(Backend::Postgres, one_connection).await else {
        return;
    };
    // The one instance whose connection waits (behind a pooler, `url`
    // alternates with a second one).
    let first = app.instances()[0].to_owned();
    app.create_asset("I-13").await;
    app.hold("I-13", "b", 1).await;
    let (blocker, stuck) = keep_the_connection(&app, &first, "I-14").await;
    let body = json!({"buyer_id": "b", "hold_seconds": 60});
    let path = "/v1/assets/I-13/reservations";
    let again = send_to(
        &app,
        reqwest::Method::POST,
        &first,
        path,
        "hold-I-13-again",
        body,
    );
    let again = tokio::spawn(again);
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    blocker.release().await;
    assert_eq!(stuck.await.expect("joined").0, 200);
    let (status, held) = again.await.expect("joined");
    assert_eq!(status, 201, "{held}");
}

/// An offer is decided on the asset as it stood at its arrival, as a hold
/// is: its first attempt waits for a connection, its retry on the other
/// instance is refused (another buyer holds the asset), that hold is
/// released, and the first attempt refuses too instead of making the offer
/// under a key whose last answer was the refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offer_is_decided_on_the_asset_as_it_stood_at_its_arrival_on_postgres() {
    let Some(app) = TestApp::try_spawn_twins(Backend::Postgres, one_connection).await else {
        return;
    };
    let instances = app.instances();
    let (first, other) = (instances[0], instances[instances.len() - 1]);
    assert_ne!(first, other, "two instances");
    app.create_asset("I-17").await;
    let taken = app.hold("I-17", "x", 60).await["reservation_id"].clone();
    let expires = (chrono::Utc::now() + chrono::Duration::days(2))
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let offer = |address: &str| {
        let body = json!({"buyer_id": "runner-up", "client": "-", "expires_at": expires});
        let path = "/v1/assets/I-17/offers";
        send_to(
            &app,
            reqwest::Method::POST,
            address,
            path,
            "late-offer",
            body,
        )
    };
    let attempt = delay(&app, first, "I-18", offer(first)).await;
    let (status, refused) = offer(other).await;
    assert_eq!(
        (status, refused["error_code"].as_str()),
        (409, Some("ASSET_UNAVAILABLE")),
        "{refused}"
    );
    let path = format!(
        "/v1/reservations/{}/release",
        taken.as_str().expect("an id")
    );
    let release = send_to(
        &app,
        reqwest::Method::POST,
        other,
        &path,
        "release-I-17",
        json!({}),
    );
    let (status, released) = release.await;
    assert_eq!(status, 200, "{released}");
    let (status, late) = attempt.answer().await;
    assert_eq!(
        (
            status,
            late["error_code"].as_str(),
            late["asset_status"].as_str()
        ),
        (409, Some("ASSET_UNAVAILABLE"), Some("HELD")),
        "{late}"
    );
    let kept =
        "SELECT count(*) FROM reservations WHERE asset_id = 'I-17' AND buyer_id = 'runner-up'";
    assert_eq!(
        app.count(kept).await,
        0,
        "nothing offered under the refused key"
    );
    let (status, offered) = offer(other).await;
    assert_eq!(status, 201, "{offered}");
}

/// A buyer queues only for a hold that began before the request arrived:
/// the first attempt of a join waits for a connection, its retry on the
/// other instance is refused (the asset was free: `WAITLIST_NOT_OPEN`),
/// another buyer then holds the asset, and the first attempt refuses too
/// instead of queueing under a key whose last answer was the refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_is_decided_on_the_hold_as_it_stood_at_its_arrival_on_postgres() {
    let Some(app) = TestApp::try_spawn_twins(Backend::Postgres, one_connection).await else {
        return;
    };
    let instances = app.instances();
    let (first, other) = (instances[0], instances[instances.len() - 1]);
    assert_ne!(first, other, "two instances");
    app.create_asset("I-19").await;
    let join = |address: &str| {
        let body = json!({"buyer_id": "queued"});
        let path = "/v1/assets/I-19/waitlist";
        send_to(
            &app,
            reqwest::Method::POST,
            address,
            path,
            "late-join",
            body,
        )
    };
    let attempt = delay(&app, first, "I-20", join(first)).await;
    let (status, refused) = join(other).await;
    assert_eq!(
        (
            status,
            refused["error_code"].as_str(),
            refused["asset_status"].as_str()
        ),
        (409, Some("WAITLIST_NOT_OPEN"), Some("AVAILABLE")),
        "{refused}"
    );
    let body = json!({"buyer_id": "x", "hold_seconds": 60});
    let path = "/v1/assets/I-19/reservations";
    let hold = send_to(&app, reqwest::Method::POST, other, path, "hold-I-19", body);
    let (status, held) = hold.await;
    assert_eq!(status, 201, "{held}");
    let (status, late) = attempt.answer().await;
    assert_eq!(
        (status, late["error_code"].as_str()),
        (409, Some("WAITLIST_NOT_OPEN")),
        "{late}"
    );
    let queued = "SELECT count(*) FROM waitlist WHERE asset_id = 'I-19'";
    assert_eq!(
        app.count(queued).await,
        0,
        "nobody queued under the refused key"
    );
    let (status, joined) = join(other).await;
    assert_eq!(status, 201, "{joined}");
}

/// Two instances of one connection each, with a waiting list of one:
/// `asset` held by buyer `x` and its queue full with buyer `waiter`. The
/// app, the first instance and the other one, and the hold's id.
async fn a_full_queue(asset: &str) -> Option<(TestApp, String, String, String)> {
    let queue_of_one = |config: &mut holdfast::Config| {
        one_connection(config);
        config.waitlist_max = 1;
    };
    let app = TestApp::try_spawn_twins(Backend::Postgres, queue_of_one).await?;
    let instances = app.instances();
    let (first, other) = (
        instances[0].to_owned(),
        instances[instances.len() - 1].to_owned(),
    );
    assert_ne!(first, other, "two instances");
    app.create_asset(asset).await;
    let held = app.hold(asset, "x", 60).await["reservation_id"]
        .as_str()
        .expect("an id")
        .to_owned();
    let (status, waiting) = join_queue(&app, &other, asset, "waiter", "join-waiter").await;
    assert_eq!(status, 201, "{waiting}");
    Some((app, first, other, held))
}

/// A join of `asset`'s waiting list by `buyer` under `key`, sent to the
/// instance at `address`. Built at once, so that it can be spawned.
fn join_queue(
    app: &TestApp,
    address: &str,
    asset: &str,
    buyer: &str,
    key: &str,
) -> impl std::future::Future<Output = (u16, Value)> + Send + 'static {
    let path = format!("/v1/assets/{asset}/waitlist");
    let body = json!({ "buyer_id": buyer });
    send_to(app, reqwest::Method::POST, address, &path, key, body)
}

/// A buyer queues only where the queue had room at the request's arrival:
/// the first attempt of a join waits for a connection, its retry on the
/// other instance is refused (`WAITLIST_FULL`, a queue of one), the waiter
/// then leaves, and the first attempt is refused too instead of queueing
/// under a key whose last answer was the refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_is_decided_on_the_queue_as_it_stood_at_its_arrival_on_postgres() {
    let Some((app, first, other, _)) = a_full_queue("I-21").await else {
        return;
    };
    let (first, other) = (first.as_str(), other.as_str());
    let join =
        |address: &str, buyer: &str, key: &str| join_queue(&app, address, "I-21", buyer, key);
    let attempt = delay(&app, first, "I-22", join(first, "queued", "full-join")).await;
    let (status, refused) = join(other, "queued", "full-join").await;
    assert_eq!(
        (status, refused["error_code"].as_str()),
        (409, Some("WAITLIST_FULL")),
        "{refused}"
    );
    let path = "/v1/assets/I-21/waitlist/waiter";
    let leave = send_to(
        &app,
        reqwest::Method::DELETE,
        other,
        path,
        "leave",
        Value::Null,
    );
    assert_eq!(leave.await.0, 204);
    let (status, late) = attempt.answer().await;
    assert_eq!(
        (status, late["error_code"].as_str()),
        (409, Some("WAITLIST_FULL")),
        "{late}"
    );
    let queued = "SELECT count(*) FROM waitlist WHERE asset_id = 'I-21'";
    assert_eq!(
        app.count(queued).await,
        0,
        "nobody queued under the refused key"
    );
    let (status, joined) = join(other, "queued", "full-join").await;
    assert_eq!(status, 201, "{joined}");
}

/// A hand-over counts out the waiter it serves, as a leave does: with a
/// queue of one, a release that began before a join arrived waits for the
/// asset's lock, then hands the asset to its waiter, which empties the
/// queue. The join, which reads only after that and finds the waiter's hold
/// begun before its arrival, is refused as the full queue it arrived at
/// instead of queueing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_is_decided_on_the_queue_as_it_stood_before_a_hand_over_on_postgres() {
    let Some((app, first, other, held)) = a_full_queue("I-25").await else {
        return;
    };
    let (blocker, stuck) = keep_the_connection(&app, &first, "I-26").await;
    let lock = app.lock_asset("I-25").await;
    let path = format!("/v1/reservations/{held}/release");
    let release = tokio::spawn(send_to(
        &app,
        reqwest::Method::POST,
        &other,
        &path,
        "release-I-25",
        json!({}),
    ));
    app.lock_waiters(2).await;
    let join = join_queue(&app, &first, "I-25", "queued", "join-before-hand-over");
    let attempt = tokio::spawn(join);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!attempt.is_finished(), "the join waits");
    lock.release().await;
    assert_eq!(release.await.expect("joined").0, 200);
    let handed = "SELECT count(*) FROM reservations \
                  WHERE asset_id = 'I-25' AND buyer_id = 'waiter' AND status = 'HELD'";
    assert_eq!(app.count(handed).await, 1, "the waiter holds the asset");
    blocker.release().await;
    assert_eq!(stuck.await.expect("joined").0, 200);
    let (status, late) = attempt.await.expect("joined");
    assert_eq!(
        (status, late["error_code"].as_str()),
        (409, Some("WAITLIST_FULL")),
        "{late}"
    );
    let queued = "SELECT count(*) FROM waitlist WHERE asset_id = 'I-25'";
    assert_eq!(app.count(queued).await, 0, "nobody queued");
}

/// A hold begins, for a waiting list, when its write claims the asset, not
/// at its first read: a hold that read the asset free, then waited for the
/// asset's lock, was not there when a join arrived during that wait. The
/// join, which reads only after the hold committed, is refused as the asset
/// stood at its arrival (`WAITLIST_NOT_OPEN`, `AVAILABLE`) instead of
/// queueing; a later attempt of it, sent meanwhile, would have been.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_is_decided_on_a_hold_written_after_its_arrival_on_postgres() {
    let Some(app) = TestApp::try_spawn_twins(Backend::Postgres, one_connection).await else {
        return;
    };
    let instances = app.instances();
    let (first, other) = (instances[0], instances[instances.len() - 1]);
    assert_ne!(first, other, "two instances");
    app.create_asset("I-27").await;
    let (blocker, stuck) = keep_the_connection(&app, first, "I-28").await;
    let lock = app.lock_asset("I-27").await;
    let body = json!({"buyer_id": "x", "hold_seconds": 60});
    let path = "/v1/assets/I-27/reservations";
    let hold = send_to(&app, reqwest::Method::POST, other, path, "hold-I-27", body);
    let hold = tokio::spawn(hold);
    app.lock_waiters(2).await;
    let join = join_queue(&app, first, "I-27", "queued", "join-before-the-hold");
    let attempt = tokio::spawn(join);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!attempt.is_finished(), "the join waits");
    lock.release().await;
    let (status, held) = hold.await.expect("joined");
    assert_eq!(status, 201, "{held}");
    blocker.release().await;
    assert_eq!(stuck.await.expect("joined").0, 200);
    let (status, late) = attempt.await.expect("joined");
    assert_eq!(
        (status, late["error_code"].as_str()),
        (409, Some("WAITLIST_NOT_OPEN")),
        "{late}"
    );
    let queued = "SELECT count(*) FROM waitlist WHERE asset_id = 'I-27'";
    assert_eq!(app.count(queued).await, 0, "nobody queued");
    let (status, joined) = join_queue(&app, other, "I-27", "queued", "join-after-the-hold").await;
    assert_eq!(status, 201, "{joined}");
}

/// A hold handed to the head of the queue continues the one before it: a
/// join that arrived after that hold lapsed, while the asset was its
/// waiter's next (HELD, a queue with room), and reads only after a
/// newcomer's hold found the lapse and handed the asset over, queues as it
/// would have at its arrival, instead of finding a hold begun after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_after_a_lapse_is_decided_on_the_hold_before_the_hand_over_on_postgres() {
    let Some(app) = TestApp::try_spawn_twins(Backend::Postgres, one_connection).await else {
        return;
    };
    let instances = app.instances();
    let (first, other) = (instances[0], instances[instances.len() - 1]);
    assert_ne!(first, other, "two instances");
    app.create_asset("I-29").await;
    let lapsed = app.hold("I-29", "x", 60).await["reservation_id"].clone();
    let (status, waiting) = join_queue(&app, other, "I-29", "waiter", "join-waiter").await;
    assert_eq!(status, 201, "{waiting}");
    app.lapse(lapsed.as_str().expect("an id")).await;
    let join = join_queue(&app, first, "I-29", "queued", "join-after-the-lapse");
    let attempt = delay(&app, first, "I-30", join).await;
    let body = json!({"buyer_id": "newcomer", "hold_seconds": 60});
    let path = "/v1/assets/I-29/reservations";
    let newcomer = send_to(&app, reqwest::Method::POST, other, path, "newcomer", body);
    let (status, refused) = newcomer.await;
    assert_eq!(
        (status, refused["error_code"].as_str()),
        (409, Some("ASSET_UNAVAILABLE")),
        "{refused}"
    );
    let handed = "SELECT count(*) FROM reservations \
                  WHERE asset_id = 'I-29' AND buyer_id = 'waiter' AND status = 'HELD'";
    assert_eq!(app.count(handed).await, 1, "the waiter holds the asset");
    let (status, joined) = attempt.answer().await;
    assert_eq!(status, 201, "{joined}");
    assert_eq!(joined["position"], 1, "{joined}");
}

/// The arrival is placed on the database's clock by the hold's first read,
/// not read from the instance's wall clock: with that clock an hour behind
/// (PostgreSQL's right), an asset released a moment ago and one whose hold
/// has just lapsed are held at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_right_after_a_release_or_a_lapse_with_the_instance_clock_behind_on_postgres() {
    let library = crate::helpers::fault_library();
    let Some(app) = TestApp::try_spawn_process(Backend::Postgres, |command, _| {
        command
            .env("LD_PRELOAD", &library)
            .env("FAULT_CLOCK_SHIFT_SECONDS", "-3600");
    })
    .await
    else {
        return;
    };
    for asset in ["I-11", "I-12"] {
        app.create_asset(asset).await;
    }
    let released = app.hold("I-11", "x", 60).await["reservation_id"].clone();
    let id = released.as_str().expect("an id");
    assert_eq!(app.release(id, "release-I-11").await.status(), 200);
    app.hold("I-12", "x", 1).await;
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    for asset in ["I-11", "I-12"] {
        let body = json!({"buyer_id": "b", "hold_seconds": 60});
        let path = format!("/v1/assets/{asset}/reservations");
        let response = app.post(&path, Some(&format!("hold-{asset}")), &body).await;
        assert_eq!(
            response.status(),
            201,
            "{asset}: {}",
            response.text().await.unwrap_or_default()
        );
    }
}

backend_tests!(
    replay_of_a_201_is_a_byte_identical_200,
    the_key_is_required_and_bounded,
    same_key_for_another_request_is_422_reused,
    rejections_are_not_stored_so_a_retry_runs_again,
    stored_409_with_refund_replays_as_409;
    backend: a_retry_of_a_running_request_replays_its_answer,
);
