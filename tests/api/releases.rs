use serde_json::{json, Value};

use crate::backend_tests;
use crate::helpers::TestApp;

async fn release_makes_the_asset_available_at_once(app: TestApp) {
    app.create_asset("R-1").await;
    let r = app.hold("R-1", "b", 300).await;
    let id = r["reservation_id"].as_str().unwrap();
    let response = app.release(id, "rel-1").await;
    assert_eq!(response.status(), 200);
    let released: Value = response.json().await.unwrap();
    assert_eq!(released["status"], "RELEASED");
    assert!(released["released_at"].is_string());
    assert_eq!(
        app.get_json(&format!("/v1/reservations/{id}")).await,
        released
    );
    let asset = app.get_json("/v1/assets/R-1").await;
    assert_eq!(asset["status"], "AVAILABLE");
    assert_eq!(asset["current_reservation_id"], Value::Null);
    assert_eq!(asset["version"], 3);
    // Someone else can hold it right away.
    app.hold("R-1", "c", 300).await;
    let events = app.get_json("/v1/assets/R-1/events").await;
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
            "reservation.released",
            "reservation.held"
        ]
    );
}

async fn releasing_twice_is_200_and_changes_nothing(app: TestApp) {
    app.create_asset("R-2").await;
    let r = app.hold("R-2", "b", 300).await;
    let id = r["reservation_id"].as_str().unwrap();
    let first: Value = app.release(id, "rel-1").await.json().await.unwrap();
    let replay = app.release(id, "rel-1").await;
    assert_eq!(replay.status(), 200);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    let again = app.release(id, "rel-2").await;
    assert_eq!(again.status(), 200);
    assert!(again.headers().get("idempotent-replayed").is_none());
    assert_eq!(again.json::<Value>().await.unwrap(), first);
    assert_eq!(app.count("SELECT count(*) FROM events").await, 2);
}

async fn release_of_committed_or_expired_is_409_not_active(app: TestApp) {
    app.create_asset("R-3").await;
    app.create_asset("R-4").await;
    let sold = app.hold("R-3", "b", 300).await;
    let sold_id = sold["reservation_id"].as_str().unwrap();
    assert_eq!(app.commit(sold_id, "c", "pay-r3").await.status(), 200);
    let lapsed = app.hold("R-4", "b", 60).await;
    app.lapse(lapsed["reservation_id"].as_str().unwrap()).await;
    for (id, status) in [
        (sold_id, "COMMITTED"),
        (lapsed["reservation_id"].as_str().unwrap(), "EXPIRED"),
    ] {
        let response = app.release(id, &format!("rel-{id}")).await;
        assert_eq!(response.status(), 409);
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error_code"], "RESERVATION_NOT_ACTIVE");
        assert_eq!(body["reservation"]["status"], status);
    }
    assert_eq!(app.get_json("/v1/assets/R-3").await["status"], "SOLD");
}

async fn release_takes_no_body_or_an_empty_object(app: TestApp) {
    app.create_asset("R-5").await;
    let r = app.hold("R-5", "b", 300).await;
    let path = format!(
        "/v1/reservations/{}/release",
        r["reservation_id"].as_str().unwrap()
    );
    let response = app.post(&path, Some("k-1"), &json!({"why": "x"})).await;
    assert_eq!(response.status(), 422);
    let response = app
        .client
        .post(app.url(&path))
        .header("Idempotency-Key", "k-2")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    // `{}` and JSON null are the same request as no body: replays.
    for same in [json!({}), Value::Null] {
        let response = app.post(&path, Some("k-2"), &same).await;
        assert_eq!(response.status(), 200, "{same}");
        assert_eq!(response.headers()["idempotent-replayed"], "true");
    }
}

backend_tests!(
    release_makes_the_asset_available_at_once,
    releasing_twice_is_200_and_changes_nothing,
    release_of_committed_or_expired_is_409_not_active,
    release_takes_no_body_or_an_empty_object,
);
