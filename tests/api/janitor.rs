use std::time::Duration;

use serde_json::Value;

use crate::backend_tests;
use crate::helpers::{Backend, TestApp};

async fn run_once_sweeps_lapsed_holds_without_traffic(app: TestApp) {
    for id in ["J-1", "J-2", "J-3"] {
        app.create_asset(id).await;
    }
    let a = app.hold("J-1", "b", 60).await;
    let b = app.hold("J-2", "b", 60).await;
    let live = app.hold("J-3", "b", 300).await;
    for lapsing in [&a, &b] {
        app.lapse(lapsing["reservation_id"].as_str().unwrap()).await;
    }
    // Before the sweep, the rows still say HELD.
    assert_eq!(
        app.count("SELECT count(*) FROM assets WHERE status = 'HELD'")
            .await,
        3
    );

    let report = holdfast::janitor::run_once(&app.store).await.unwrap();
    assert_eq!(report.expired, 2);
    assert_eq!(
        app.count("SELECT count(*) FROM assets WHERE status = 'HELD'")
            .await,
        1
    );
    assert_eq!(
        app.count("SELECT count(*) FROM reservations WHERE status = 'EXPIRED'")
            .await,
        2
    );
    for r in [&a, &b] {
        let id = r["reservation_id"].as_str().unwrap();
        assert_eq!(
            app.get_json(&format!("/v1/reservations/{id}")).await["status"],
            "EXPIRED"
        );
    }
    let asset = app.get_json("/v1/assets/J-1").await;
    assert_eq!(asset["status"], "AVAILABLE");
    assert_eq!(asset["version"], 3, "the sweep is a state change");
    let events = app.get_json("/v1/assets/J-1/events").await;
    assert_eq!(events["items"][1]["type"], "reservation.expired");
    assert_eq!(events["items"][1]["sequence"], 2);
    assert_eq!(
        app.get_json("/v1/assets/J-3").await["current_reservation_id"],
        live["reservation_id"]
    );

    // A second pass finds nothing; a late commit still refunds once.
    assert_eq!(
        holdfast::janitor::run_once(&app.store)
            .await
            .unwrap()
            .expired,
        0
    );
    let response = app
        .commit(a["reservation_id"].as_str().unwrap(), "late", "pay-j")
        .await;
    assert_eq!(response.status(), 409);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error_code"], "HOLD_EXPIRED");
    assert_eq!(
        app.count("SELECT count(*) FROM events WHERE asset_id = 'J-1'")
            .await,
        3
    );
}

async fn run_once_purges_answers_past_retention(app: TestApp) {
    app.create_asset("J-4").await;
    app.create_asset("J-5").await;
    app.hold("J-4", "b", 300).await;
    app.hold("J-5", "b", 300).await;
    let backdate = match app.backend {
        Backend::Postgres => {
            "UPDATE idempotency_keys SET created_at = created_at - interval '25 hours' \
             WHERE reservation_id IN (SELECT id FROM reservations WHERE asset_id = 'J-4')"
        }
        Backend::Sqlite => {
            "UPDATE idempotency_keys SET created_at = '2000-01-01T00:00:00.000000Z' \
             WHERE reservation_id IN (SELECT id FROM reservations WHERE asset_id = 'J-4')"
        }
    };
    app.sql(backdate).await;
    let report = holdfast::janitor::run_once(&app.store).await.unwrap();
    assert_eq!(report.purged_keys, 1);
    assert_eq!(app.count("SELECT count(*) FROM idempotency_keys").await, 1);
}

backend_tests!(
    run_once_sweeps_lapsed_holds_without_traffic,
    run_once_purges_answers_past_retention,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_janitor_task_sweeps_on_its_interval() {
    for backend in [Backend::Postgres, Backend::Sqlite] {
        let Some(app) = TestApp::try_spawn_with(backend, |c| c.janitor_interval_seconds = 1).await
        else {
            continue;
        };
        app.create_asset("J-6").await;
        // Real time: the janitor's own interval and a hold lapsing by itself.
        app.hold("J-6", "b", 1).await;
        let mut swept = false;
        for _ in 0..40 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if app
                .count("SELECT count(*) FROM reservations WHERE status = 'EXPIRED'")
                .await
                == 1
            {
                swept = true;
                break;
            }
        }
        assert!(
            swept,
            "{backend:?}: the janitor expired the lapsed hold by itself"
        );
    }
}
