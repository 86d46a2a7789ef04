use serde_json::{json, Value};

use crate::backend_tests;
use crate::helpers::TestApp;

async fn commit_sells_the_asset(app: TestApp) {
    app.create_asset("C-1").await;
    let r = app.hold("C-1", "b", 300).await;
    let id = r["reservation_id"].as_str().unwrap();
    let response = app.commit(id, "c-1", "pay-1").await;
    assert_eq!(response.status(), 200);
    let committed: Value = response.json().await.unwrap();
    assert_eq!(committed["status"], "COMMITTED");
    assert_eq!(committed["payment_reference"], "pay-1");
    assert!(committed["committed_at"].is_string());
    assert_eq!(committed["refunds"], json!([]));

    let asset = app.get_json("/v1/assets/C-1").await;
    assert_eq!(asset["status"], "SOLD");
    assert_eq!(asset["current_reservation_id"], id);
    assert_eq!(asset["hold_expires_at"], Value::Null);
    assert_eq!(asset["version"], 3);
    assert_eq!(
        app.get_json(&format!("/v1/reservations/{id}")).await,
        committed
    );
    let events = app.get_json("/v1/assets/C-1/events").await;
    assert_eq!(events["items"][1]["type"], "reservation.committed");
    assert_eq!(events["items"][1]["sequence"], 2);
}

async fn commit_again_with_the_same_payment_is_200_and_changes_nothing(app: TestApp) {
    app.create_asset("C-2").await;
    let r = app.hold("C-2", "b", 300).await;
    let id = r["reservation_id"].as_str().unwrap();
    let first: Value = app.commit(id, "c-1", "pay-2").await.json().await.unwrap();
    let again = app.commit(id, "c-2", "pay-2").await;
    assert_eq!(again.status(), 200);
    assert!(again.headers().get("idempotent-replayed").is_none());
    assert_eq!(again.json::<Value>().await.unwrap(), first);
    assert_eq!(app.count("SELECT count(*) FROM refunds").await, 0);
    assert_eq!(app.count("SELECT count(*) FROM events").await, 2);
}

async fn commit_with_another_payment_is_409_already_committed_refunded_once(app: TestApp) {
    app.create_asset("C-3").await;
    let r = app.hold("C-3", "b", 300).await;
    let id = r["reservation_id"].as_str().unwrap();
    assert_eq!(app.commit(id, "c-1", "pay-a").await.status(), 200);
    let mut refund_ids = Vec::new();
    for key in ["c-2", "c-3", "c-2"] {
        let response = app.commit(id, key, "pay-b").await;
        assert_eq!(response.status(), 409);
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error_code"], "ALREADY_COMMITTED");
        assert_eq!(body["refund"]["reason"], "ALREADY_COMMITTED");
        assert_eq!(body["refund"]["payment_reference"], "pay-b");
        assert_eq!(body["refund"]["status"], "REQUESTED");
        assert_eq!(body["reservation"]["status"], "COMMITTED");
        assert_eq!(body["reservation"]["payment_reference"], "pay-a");
        refund_ids.push(body["refund"]["refund_id"].as_str().unwrap().to_owned());
    }
    assert!(refund_ids
        .iter()
        .all(|r| r == &refund_ids[0] && r.starts_with("rf_")));
    assert_eq!(app.count("SELECT count(*) FROM refunds").await, 1);
    let reservation = app.get_json(&format!("/v1/reservations/{id}")).await;
    assert_eq!(reservation["refunds"].as_array().unwrap().len(), 1);
    assert_eq!(
        reservation["refunds"][0]["refund_id"],
        refund_ids[0].as_str()
    );
    assert_eq!(app.get_json("/v1/assets/C-3").await["status"], "SOLD");
}

async fn a_payment_reference_commits_one_reservation_only(app: TestApp) {
    app.create_asset("C-4").await;
    app.create_asset("C-5").await;
    let a = app.hold("C-4", "b", 300).await;
    let b = app.hold("C-5", "b", 300).await;
    assert_eq!(
        app.commit(a["reservation_id"].as_str().unwrap(), "c-a", "pay-x")
            .await
            .status(),
        200
    );
    let response = app
        .commit(b["reservation_id"].as_str().unwrap(), "c-b", "pay-x")
        .await;
    assert_eq!(response.status(), 409);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error_code"], "PAYMENT_REFERENCE_USED");
    assert_eq!(body["reservation"]["status"], "HELD");
    assert!(body.get("refund").is_none());
    assert_eq!(app.get_json("/v1/assets/C-5").await["status"], "HELD");
    assert_eq!(app.count("SELECT count(*) FROM refunds").await, 0);
    // Nothing changed, so nothing was stored: the same key runs again.
    let response = app
        .commit(b["reservation_id"].as_str().unwrap(), "c-b", "pay-y")
        .await;
    assert_eq!(response.status(), 200);
    assert!(response.headers().get("idempotent-replayed").is_none());
}

async fn late_commit_refunds_exactly_once_however_often_retried(app: TestApp) {
    app.create_asset("C-6").await;
    let r = app.hold("C-6", "slow-payer", 60).await;
    let id = r["reservation_id"].as_str().unwrap();
    app.lapse(id).await;
    let mut bodies = Vec::new();
    for key in ["late-1", "late-1", "late-2", "late-3"] {
        let response = app.commit(id, key, "pay-late").await;
        assert_eq!(response.status(), 409);
        let replayed = response.headers().get("idempotent-replayed").is_some();
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error_code"], "HOLD_EXPIRED");
        assert_eq!(body["refund"]["reason"], "HOLD_EXPIRED");
        assert_eq!(body["reservation"]["status"], "EXPIRED");
        bodies.push((key, replayed, body));
    }
    assert!(!bodies[0].1);
    assert!(bodies[1].1, "a retry with the same key replays");
    assert_eq!(bodies[0].2, bodies[1].2);
    let refund_id = &bodies[0].2["refund"]["refund_id"];
    assert!(bodies
        .iter()
        .all(|(_, _, b)| &b["refund"]["refund_id"] == refund_id));
    assert_eq!(app.count("SELECT count(*) FROM refunds").await, 1);
    assert_eq!(
        app.count("SELECT count(*) FROM events WHERE type = 'refund.requested'")
            .await,
        1
    );
    // The asset was never sold; the timeline reads held, expired, refund requested.
    assert_eq!(app.get_json("/v1/assets/C-6").await["status"], "AVAILABLE");
    let events = app.get_json("/v1/assets/C-6/events").await;
    let kinds: Vec<&str> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "reservation.held",
            "reservation.expired",
            "refund.requested"
        ]
    );
    assert_eq!(events["items"][2]["data"]["refund_id"], *refund_id);
    // Another payment for the same lapsed hold gets its own refund.
    let response = app.commit(id, "late-4", "pay-other").await;
    assert_eq!(response.status(), 409);
    assert_eq!(app.count("SELECT count(*) FROM refunds").await, 2);
}

async fn commit_of_a_released_reservation_refunds(app: TestApp) {
    app.create_asset("C-7").await;
    let r = app.hold("C-7", "b", 300).await;
    let id = r["reservation_id"].as_str().unwrap();
    assert_eq!(app.release(id, "rel-1").await.status(), 200);
    let response = app.commit(id, "c-1", "pay-r").await;
    assert_eq!(response.status(), 409);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error_code"], "RESERVATION_NOT_ACTIVE");
    assert_eq!(body["refund"]["reason"], "RESERVATION_RELEASED");
    assert_eq!(body["reservation"]["status"], "RELEASED");
    assert_eq!(body["reservation"]["refunds"][0], body["refund"]);
    assert_eq!(app.get_json("/v1/assets/C-7").await["status"], "AVAILABLE");
}

async fn commit_of_an_unknown_reservation_is_404(app: TestApp) {
    for id in ["res_01HZX49R8T39QK6G7Y1W2V3N4P", "res_nope", "anything"] {
        let response = app.commit(id, "c-x", "pay").await;
        assert_eq!(response.status(), 404, "{id}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error_code"], "RESERVATION_NOT_FOUND");
        let response = app.get(&format!("/v1/reservations/{id}")).await;
        assert_eq!(response.status(), 404, "{id}");
    }
}

async fn commit_validates_the_payment_reference(app: TestApp) {
    app.create_asset("C-8").await;
    let r = app.hold("C-8", "b", 300).await;
    let path = format!(
        "/v1/reservations/{}/commit",
        r["reservation_id"].as_str().unwrap()
    );
    let long = "p".repeat(129);
    for body in [
        json!({}),
        json!({"payment_reference": ""}),
        json!({"payment_reference": long}),
        json!({"payment_reference": 5}),
    ] {
        let response = app.post(&path, Some("k"), &body).await;
        assert_eq!(response.status(), 422, "{body}");
    }
    assert_eq!(app.get_json("/v1/assets/C-8").await["status"], "HELD");
}

backend_tests!(
    commit_sells_the_asset,
    commit_again_with_the_same_payment_is_200_and_changes_nothing,
    commit_with_another_payment_is_409_already_committed_refunded_once,
    a_payment_reference_commits_one_reservation_only,
    late_commit_refunds_exactly_once_however_often_retried,
    commit_of_a_released_reservation_refunds,
    commit_of_an_unknown_reservation_is_404,
    commit_validates_the_payment_reference,
);
