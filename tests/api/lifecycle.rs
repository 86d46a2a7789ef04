//! Sale opening, withdrawal and reinstatement, extension, voided sales and
//! late payments.

use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use crate::audit::audit;
use crate::backend_tests;
use crate::helpers::{new_key, TestApp};

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
    let (status, _) = hold_response(&app, "OPEN-1", "still-early").await;
    assert_eq!(status, 409);
    tokio::time::sleep(Duration::from_millis(2300)).await;
    let (status, body) = hold_response(&app, "OPEN-1", "on-time").await;
    assert_eq!(status, 201, "{body}");

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

backend_tests!(
    holds_wait_for_the_sale_to_open,
    withdrawn_assets_refuse_holds_until_reinstated,
    withdrawing_a_held_asset_needs_force,
);
