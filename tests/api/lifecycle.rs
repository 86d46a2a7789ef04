//! Sale opening, withdrawal and reinstatement, extension, voided sales and
//! late payments.

use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use crate::audit::audit;
use crate::backend_tests;
use crate::helpers::{eventually, new_key, TestApp};

fn later(seconds: i64) -> String {
    (chrono::Utc::now() + chrono::Duration::seconds(seconds))
        .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

async fn patch(app: &TestApp, path: &str, body: &Value) -> reqwest::Response {
    app.request(Method::PATCH, path)
        .await
        .json(body)
        .send()
        .await
        .unwrap()
}

async fn hold_response(app: &TestApp, asset: &str, buyer: &str) -> (u16, Value) {
    let response = app
        .post(
            &format!("/v1/assets/{asset}/reservations"),
            Some(&new_key()),
            &json!({ "buyer_id": buyer }),
        )
        .await;
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

async fn event_types(app: &TestApp, asset: &str) -> Vec<String> {
    app.get_json(&format!("/v1/assets/{asset}/events")).await["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_owned())
        .collect()
}

async fn holds_wait_for_the_sale_to_open(app: TestApp) {
    let opens = later(3600);
    let created = app
        .post(
            "/v1/assets",
            None,
            &json!({"id": "OPEN-1", "name": "lot", "available_from": opens}),
        )
        .await;
    assert_eq!(created.status(), 201);
    let asset: Value = created.json().await.unwrap();
    assert_eq!(asset["status"], "AVAILABLE");
    assert!(asset["available_from"].is_string());

    let (status, body) = hold_response(&app, "OPEN-1", "early").await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error_code"], "SALE_NOT_OPEN");
    assert_eq!(body["available_from"], asset["available_from"]);
    assert_eq!(app.count("SELECT count(*) FROM reservations").await, 0);

    // An opening moments away, by the database clock.
    let soon = patch(
        &app,
        "/v1/assets/OPEN-1",
        &json!({ "available_from": later(2) }),
    )
    .await;
    assert_eq!(soon.status(), 200);
    let (status, body) = hold_response(&app, "OPEN-1", "still-early").await;
    assert_eq!(status, 409);
    assert_eq!(body["error_code"], "SALE_NOT_OPEN", "{body}");
    // The database's clock, not the test's, reaches the opening: until then
    // every hold is SALE_NOT_OPEN, then one is held.
    let mut tries = 0;
    eventually("a hold once the sale opened", || {
        tries += 1;
        let buyer = format!("on-time-{tries}");
        let app = &app;
        async move {
            let (status, body) = hold_response(app, "OPEN-1", &buyer).await;
            assert!(
                status == 201 || body["error_code"] == "SALE_NOT_OPEN",
                "{status} {body}"
            );
            status == 201
        }
    })
    .await;

    // Cleared: on sale now.
    app.create_asset("OPEN-2").await;
    let gated = patch(
        &app,
        "/v1/assets/OPEN-2",
        &json!({ "available_from": opens }),
    )
    .await;
    assert_eq!(gated.status(), 200);
    let cleared = patch(
        &app,
        "/v1/assets/OPEN-2",
        &json!({ "available_from": null }),
    )
    .await;
    let cleared: Value = cleared.json().await.unwrap();
    assert_eq!(cleared["available_from"], Value::Null);
    assert_eq!(hold_response(&app, "OPEN-2", "b").await.0, 201);

    for bad in [json!({"available_from": "tomorrow"}), json!({})] {
        let response = patch(&app, "/v1/assets/OPEN-2", &bad).await;
        assert_eq!(response.status(), 422, "{bad}");
    }
    let missing = patch(&app, "/v1/assets/NOPE", &json!({ "available_from": null })).await;
    assert_eq!(missing.status(), 404);
    assert!(audit(&app).0);
}

async fn withdrawn_assets_refuse_holds_until_reinstated(app: TestApp) {
    app.create_asset("WD-1").await;
    let response = app.post("/v1/assets/WD-1/withdraw", None, &json!({})).await;
    assert_eq!(response.status(), 200);
    let withdrawn: Value = response.json().await.unwrap();
    assert_eq!(withdrawn["status"], "WITHDRAWN");

    let (status, body) = hold_response(&app, "WD-1", "b").await;
    assert_eq!(status, 409);
    assert_eq!(body["error_code"], "ASSET_UNAVAILABLE");
    assert_eq!(body["asset_status"], "WITHDRAWN");

    // Naturally idempotent: nothing changes the second time.
    let again: Value = app
        .post("/v1/assets/WD-1/withdraw", None, &json!({}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(again["version"], withdrawn["version"]);
    let listed = app.get_json("/v1/assets?status=WITHDRAWN").await;
    assert_eq!(listed["items"][0]["id"], "WD-1");

    let back: Value = app
        .post("/v1/assets/WD-1/reinstate", None, &json!({}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(back["status"], "AVAILABLE");
    assert_eq!(hold_response(&app, "WD-1", "b").await.0, 201);
    assert_eq!(
        event_types(&app, "WD-1").await,
        ["asset.withdrawn", "asset.reinstated", "reservation.held"]
    );
    assert!(audit(&app).0);
}

async fn withdrawing_a_held_asset_needs_force(app: TestApp) {
    app.create_asset("WD-2").await;
    let reservation = app.hold("WD-2", "buyer", 300).await;
    let id = reservation["reservation_id"].as_str().unwrap();

    let refused = app.post("/v1/assets/WD-2/withdraw", None, &json!({})).await;
    assert_eq!(refused.status(), 409);
    let refused: Value = refused.json().await.unwrap();
    assert_eq!(refused["error_code"], "ASSET_HELD");
    assert_eq!(app.get_json("/v1/assets/WD-2").await["status"], "HELD");

    let forced = app
        .post("/v1/assets/WD-2/withdraw", None, &json!({"force": true}))
        .await;
    assert_eq!(forced.status(), 200);
    let forced: Value = forced.json().await.unwrap();
    assert_eq!(forced["status"], "WITHDRAWN");
    let ended = app.get_json(&format!("/v1/reservations/{id}")).await;
    assert_eq!(ended["status"], "RELEASED");

    // The payment that arrives afterwards is given back.
    let late = app.commit(id, &new_key(), "pay-wd-2").await;
    assert_eq!(late.status(), 409);
    let late: Value = late.json().await.unwrap();
    assert_eq!(late["error_code"], "RESERVATION_NOT_ACTIVE");
    assert_eq!(late["refund"]["reason"], "RESERVATION_RELEASED");
    assert_eq!(
        event_types(&app, "WD-2").await,
        [
            "reservation.held",
            "reservation.released",
            "asset.withdrawn",
            "refund.requested"
        ]
    );

    // Sold assets stay sold.
    app.create_asset("WD-3").await;
    let sold = app.hold("WD-3", "buyer", 300).await;
    let sold_id = sold["reservation_id"].as_str().unwrap();
    assert_eq!(
        app.commit(sold_id, &new_key(), "pay-wd-3").await.status(),
        200
    );
    let refused = app
        .post("/v1/assets/WD-3/withdraw", None, &json!({"force": true}))
        .await;
    assert_eq!(refused.status(), 409);
    let refused: Value = refused.json().await.unwrap();
    assert_eq!(refused["error_code"], "ASSET_SOLD");
    assert_eq!(
        app.post("/v1/assets/NOPE/withdraw", None, &json!({}))
            .await
            .status(),
        404
    );
    assert!(audit(&app).0);
}

async fn post_json(app: &TestApp, path: &str, key: &str, body: Value) -> (u16, Value, bool) {
    let response = app.post(path, Some(key), &body).await;
    let status = response.status().as_u16();
    let replayed = response.headers().get("idempotent-replayed").is_some();
    (status, response.json().await.unwrap(), replayed)
}

async fn extensions_move_the_expiry_within_the_cap(app: TestApp) {
    app.create_asset("EX-1").await;
    let held = app.hold("EX-1", "slow-payer", 60).await;
    let id = held["reservation_id"].as_str().unwrap();
    let extend = format!("/v1/reservations/{id}/extend");

    let (status, extended, _) =
        post_json(&app, &extend, "ex-1", json!({"hold_seconds": 600})).await;
    assert_eq!(status, 200, "{extended}");
    assert_eq!(extended["status"], "HELD");
    assert!(extended["expires_at"].as_str() > held["expires_at"].as_str());
    let asset = app.get_json("/v1/assets/EX-1").await;
    assert_eq!(asset["hold_expires_at"], extended["expires_at"]);

    let (status, again, replayed) =
        post_json(&app, &extend, "ex-1", json!({"hold_seconds": 600})).await;
    assert_eq!((status, replayed), (200, true));
    assert_eq!(again, extended);
    let (status, reused, _) = post_json(&app, &extend, "ex-1", json!({"hold_seconds": 300})).await;
    assert_eq!(status, 422);
    assert_eq!(reused["error_code"], "IDEMPOTENCY_KEY_REUSED");
    let (status, _, _) = post_json(&app, &extend, &new_key(), json!({"hold_seconds": 0})).await;
    assert_eq!(status, 422);

    // Beyond the cap from creation: refused, nothing changed.
    let (status, refused, _) =
        post_json(&app, &extend, &new_key(), json!({"hold_seconds": 3600})).await;
    assert_eq!(
        status, 200,
        "3600 s from now is within 7200 s of creation: {refused}"
    );
    let capped = TestApp::try_spawn_with(app.backend, |c| {
        c.hold_seconds = 100;
        c.hold_seconds_max = 100;
        c.hold_max_total_seconds = 100;
    })
    .await
    .unwrap();
    capped.create_asset("EX-2").await;
    let short = capped.hold("EX-2", "b", 100).await;
    let short_id = short["reservation_id"].as_str().unwrap();
    // A second after it was taken, 100 s more reach past the cap.
    capped.age_hold(short_id, Duration::from_secs(1)).await;
    let short = capped
        .get_json(&format!("/v1/reservations/{short_id}"))
        .await;
    let (status, refused, _) = post_json(
        &capped,
        &format!("/v1/reservations/{short_id}/extend"),
        &new_key(),
        json!({"hold_seconds": 100}),
    )
    .await;
    assert_eq!(status, 409, "{refused}");
    assert_eq!(refused["error_code"], "HOLD_EXTENSION_LIMIT");
    assert_eq!(refused["reservation"]["expires_at"], short["expires_at"]);

    // Not live: released, or lapsed.
    let release = app.release(id, &new_key()).await;
    assert_eq!(release.status(), 200);
    let (status, late, _) = post_json(&app, &extend, &new_key(), json!({"hold_seconds": 60})).await;
    assert_eq!(status, 409);
    assert_eq!(late["error_code"], "RESERVATION_NOT_ACTIVE");
    app.create_asset("EX-3").await;
    let lapsing = app.hold("EX-3", "b", 60).await;
    app.lapse(lapsing["reservation_id"].as_str().unwrap()).await;
    let (status, lapsed, _) = post_json(
        &app,
        &format!(
            "/v1/reservations/{}/extend",
            lapsing["reservation_id"].as_str().unwrap()
        ),
        &new_key(),
        json!({"hold_seconds": 60}),
    )
    .await;
    assert_eq!(status, 409);
    assert_eq!(lapsed["reservation"]["status"], "EXPIRED");
    assert_eq!(
        event_types(&app, "EX-1").await,
        [
            "reservation.held",
            "reservation.extended",
            "reservation.extended",
            "reservation.released"
        ]
    );
    assert!(audit(&app).0);
    assert!(audit(&capped).0);
}

async fn sold(app: &TestApp, asset: &str, payment: &str) -> String {
    app.create_asset(asset).await;
    let held = app.hold(asset, "buyer", 300).await;
    let id = held["reservation_id"].as_str().unwrap().to_owned();
    assert_eq!(app.commit(&id, &new_key(), payment).await.status(), 200);
    id
}

async fn voided_sales_free_the_asset_and_refund(app: TestApp) {
    let id = sold(&app, "VO-1", "pay-vo-1").await;
    let void = format!("/v1/reservations/{id}/void");
    let (status, voided, _) = post_json(&app, &void, "vo-1", json!({})).await;
    assert_eq!(status, 200, "{voided}");
    assert_eq!(voided["status"], "VOIDED");
    assert!(voided["voided_at"].is_string());
    assert_eq!(voided["payment_reference"], "pay-vo-1");
    assert_eq!(voided["refunds"][0]["reason"], "SALE_VOIDED");
    assert_eq!(voided["refunds"][0]["payment_reference"], "pay-vo-1");
    assert_eq!(app.get_json("/v1/assets/VO-1").await["status"], "AVAILABLE");

    let (status, again, replayed) = post_json(&app, &void, "vo-1", json!({})).await;
    assert_eq!((status, replayed), (200, true));
    assert_eq!(again, voided);
    let (status, unchanged, _) = post_json(&app, &void, &new_key(), json!({})).await;
    assert_eq!(status, 200);
    assert_eq!(unchanged["refunds"].as_array().unwrap().len(), 1);

    // The payment was refunded once; a retried commit gets that refund.
    let late = app.commit(&id, &new_key(), "pay-vo-1").await;
    assert_eq!(late.status(), 409);
    let late: Value = late.json().await.unwrap();
    assert_eq!(late["error_code"], "RESERVATION_NOT_ACTIVE");
    assert_eq!(
        late["refund"]["refund_id"],
        voided["refunds"][0]["refund_id"]
    );
    let other = app.commit(&id, &new_key(), "pay-vo-1-again").await;
    let other: Value = other.json().await.unwrap();
    assert_eq!(other["refund"]["reason"], "SALE_VOIDED");
    assert_eq!(other["refund"]["payment_reference"], "pay-vo-1-again");

    // The asset sells again; the voided payment reference stays used.
    let next = app.hold("VO-1", "next-buyer", 300).await;
    let next_id = next["reservation_id"].as_str().unwrap();
    let reused = app.commit(next_id, &new_key(), "pay-vo-1").await;
    assert_eq!(reused.status(), 409);
    let reused: Value = reused.json().await.unwrap();
    assert_eq!(reused["error_code"], "PAYMENT_REFERENCE_USED");
    assert_eq!(
        app.commit(next_id, &new_key(), "pay-vo-1b").await.status(),
        200
    );
    assert_eq!(
        event_types(&app, "VO-1").await,
        [
            "reservation.held",
            "reservation.committed",
            "reservation.voided",
            "refund.requested",
            "refund.requested",
            "reservation.held",
            "reservation.committed"
        ]
    );

    // A chargeback: no refund now; a payment that arrives later is refunded.
    let id = sold(&app, "VO-2", "pay-vo-2").await;
    let (status, voided, _) = post_json(
        &app,
        &format!("/v1/reservations/{id}/void"),
        &new_key(),
        json!({"refund": false}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(voided["refunds"], json!([]));

    // Only sales can be voided.
    app.create_asset("VO-3").await;
    let held = app.hold("VO-3", "b", 300).await;
    let (status, refused, _) = post_json(
        &app,
        &format!(
            "/v1/reservations/{}/void",
            held["reservation_id"].as_str().unwrap()
        ),
        &new_key(),
        json!({}),
    )
    .await;
    assert_eq!(status, 409);
    assert_eq!(refused["error_code"], "RESERVATION_NOT_ACTIVE");
    assert!(audit(&app).0);
}

async fn reservations_are_listed_newest_first(app: TestApp) {
    for asset in ["LS-1", "LS-2", "LS-3"] {
        app.create_asset(asset).await;
    }
    let first = app.hold("LS-1", "b-1", 300).await;
    let second = app.hold("LS-2", "b-2", 300).await;
    let third = app.hold("LS-3", "b-1", 300).await;
    let first_id = first["reservation_id"].as_str().unwrap();
    assert_eq!(
        app.commit(first_id, &new_key(), "pay-ls-1").await.status(),
        200
    );

    let ids = |page: &Value| -> Vec<String> {
        page["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["reservation_id"].as_str().unwrap().to_owned())
            .collect()
    };
    let mine = app.get_json("/v1/reservations?buyer_id=b-1").await;
    assert_eq!(
        ids(&mine),
        [
            third["reservation_id"].as_str().unwrap(),
            first["reservation_id"].as_str().unwrap()
        ]
    );
    let committed = app.get_json("/v1/reservations?status=COMMITTED").await;
    assert_eq!(ids(&committed), [first_id]);
    let held = app
        .get_json("/v1/reservations?status=HELD&asset_id=LS-2")
        .await;
    assert_eq!(ids(&held), [second["reservation_id"].as_str().unwrap()]);
    let live = app
        .get_json("/v1/reservations?buyer_id=b-1&status=HELD")
        .await;
    assert_eq!(ids(&live), [third["reservation_id"].as_str().unwrap()]);

    let page = app.get_json("/v1/reservations?limit=2").await;
    assert_eq!(ids(&page).len(), 2);
    let cursor = page["next_cursor"].as_str().unwrap();
    let rest = app
        .get_json(&format!("/v1/reservations?limit=2&cursor={cursor}"))
        .await;
    assert_eq!(ids(&rest), [first_id]);
    assert_eq!(rest["next_cursor"], Value::Null);
    assert_eq!(rest["items"][0]["status"], "COMMITTED");

    for bad in ["status=GONE", "limit=0", "cursor=zz", "buyer_id="] {
        let response = app.get(&format!("/v1/reservations?{bad}")).await;
        assert_eq!(response.status(), 422, "{bad}");
    }
}

backend_tests!(
    extensions_move_the_expiry_within_the_cap,
    voided_sales_free_the_asset_and_refund,
    reservations_are_listed_newest_first,
    holds_wait_for_the_sale_to_open,
    withdrawn_assets_refuse_holds_until_reinstated,
    withdrawing_a_held_asset_needs_force;
    backend:
        late_payments_buy_a_free_asset,
);

/// With HOLDFAST_LATE_COMMIT=accept-if-free, a payment after the hold lapsed
/// still buys the asset when nobody held or bought it since.
async fn late_payments_buy_a_free_asset(backend: crate::helpers::Backend) {
    let Some(app) = TestApp::try_spawn_with(backend, |c| {
        c.late_commit = holdfast::config::LateCommit::AcceptIfFree;
    })
    .await
    else {
        return;
    };
    for asset in ["LT-1", "LT-2", "LT-3"] {
        app.create_asset(asset).await;
    }
    let free = app.hold("LT-1", "b", 60).await;
    let taken = app.hold("LT-2", "b", 60).await;
    let passed = app.hold("LT-3", "b", 60).await;
    for lapsing in [&free, &taken, &passed] {
        app.lapse(lapsing["reservation_id"].as_str().unwrap()).await;
    }
    app.hold("LT-2", "other", 300).await;
    let meanwhile = app.hold("LT-3", "other", 300).await;
    let released = app
        .release(meanwhile["reservation_id"].as_str().unwrap(), &new_key())
        .await;
    assert_eq!(released.status(), 200);

    let id = |r: &Value| r["reservation_id"].as_str().unwrap().to_owned();
    let accepted = app.commit(&id(&free), "lt-1", "pay-lt-1").await;
    assert_eq!(accepted.status(), 200);
    let accepted: Value = accepted.json().await.unwrap();
    assert_eq!(accepted["status"], "COMMITTED");
    assert_eq!(app.get_json("/v1/assets/LT-1").await["status"], "SOLD");
    let replay = app.commit(&id(&free), "lt-1", "pay-lt-1").await;
    assert_eq!(replay.status(), 200);

    for (reservation, payment) in [(&taken, "pay-lt-2"), (&passed, "pay-lt-3")] {
        let refused = app.commit(&id(reservation), &new_key(), payment).await;
        assert_eq!(refused.status(), 409);
        let refused: Value = refused.json().await.unwrap();
        assert_eq!(refused["error_code"], "HOLD_EXPIRED");
        assert_eq!(refused["refund"]["payment_reference"], payment);
    }
    assert_eq!(
        event_types(&app, "LT-1").await,
        [
            "reservation.held",
            "reservation.expired",
            "reservation.committed"
        ]
    );
    assert!(audit(&app).0);
}

/// A late payment arriving while a janitor expires that very hold: the
/// commit waits for the janitor and then sells the free asset, rather than
/// missing the expiry and refunding (PostgreSQL; SQLite has one writer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_payment_waits_for_a_concurrent_expiry() {
    let Some(app) = TestApp::try_spawn_with(crate::helpers::Backend::Postgres, |c| {
        c.late_commit = holdfast::config::LateCommit::AcceptIfFree;
    })
    .await
    else {
        return;
    };
    app.create_asset("LR-1").await;
    let held = app.hold("LR-1", "b", 60).await;
    let id = held["reservation_id"].as_str().unwrap().to_owned();
    app.lapse(&id).await;
    // What the janitor's expiry does, left open.
    let janitor = app
        .hold_lock_open(&format!(
            "BEGIN; \
             UPDATE assets SET status = 'AVAILABLE', hold_expires_at = NULL, current_reservation_id = NULL, \
                    version = version + 1, last_event_sequence = last_event_sequence + 1 WHERE id = 'LR-1'; \
             UPDATE reservations SET status = 'EXPIRED' WHERE id = '{id}'; \
             INSERT INTO events (id, asset_id, sequence, type, data, created_at) \
                 VALUES ('evt_lr1', 'LR-1', 2, 'reservation.expired', '{{\"reservation_id\":\"{id}\"}}', now());"
        ))
        .await;
    let commit = {
        let (client, url) = (
            app.client.clone(),
            app.url(&format!("/v1/reservations/{id}/commit")),
        );
        tokio::spawn(async move {
            client
                .post(url)
                .header("Idempotency-Key", "lr-1")
                .json(&json!({"payment_reference": "pay-lr-1"}))
                .send()
                .await
                .unwrap()
        })
    };
    // The commit waits on the janitor's locks.
    app.lock_waiters(1).await;
    janitor.commit().await;
    let response = commit.await.unwrap();
    let status = response.status();
    let body: Value = response.json().await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "COMMITTED");
    assert_eq!(app.get_json("/v1/assets/LR-1").await["status"], "SOLD");
    assert!(audit(&app).0);
}
