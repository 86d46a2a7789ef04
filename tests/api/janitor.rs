use serde_json::Value;

use crate::backend_tests;
use crate::helpers::{eventually, Backend, TestApp};

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

/// A long purge does not hold up expiry: holds that lapse while it runs
/// are expired between its batches, in the same pass; and a pass asked to
/// stop ends after the batch under way.
async fn a_purge_lets_expiry_through_and_stops_when_asked(backend: Backend) {
    let Some(app) = TestApp::try_spawn_with(backend, |c| {
        c.event_retention_days = Some(30);
        c.janitor_batch = 10;
    })
    .await
    else {
        return;
    };
    for i in 0..30 {
        app.create_asset(&format!("JP-{i}")).await;
    }
    // Thirty old events; a hold that lapses once the purge has begun.
    app.create_asset("JP-hold").await;
    let held = app.hold("JP-hold", "b", 300).await;
    let id = held["reservation_id"].as_str().unwrap().to_owned();
    app.age_delivered_events(None).await;
    let due = app.count("SELECT count(*) FROM events").await;
    app.lapse(&id).await;
    let report = holdfast::janitor::run_once(&app.store).await.unwrap();
    assert_eq!(report.purged_events, due as u64, "{report:?}");
    assert_eq!(report.expired, 1, "{report:?}");
    // Asked to stop after its first steps: the rest waits for the next pass.
    for i in 0..30 {
        app.hold(&format!("JP-{i}"), &format!("b{i}"), 300).await;
    }
    app.age_delivered_events(None).await;
    let steps = std::sync::atomic::AtomicUsize::new(0);
    let stop_soon = || steps.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < 3;
    let report = holdfast::janitor::run_while(&app.store, &stop_soon)
        .await
        .unwrap();
    assert!(report.purged_events <= 10, "{report:?}");
    assert!(app.count("SELECT count(*) FROM events").await >= 20);
    let report = holdfast::janitor::run_once(&app.store).await.unwrap();
    assert_eq!(
        app.count("SELECT count(*) FROM events").await,
        0,
        "{report:?}"
    );
}

/// With the planner's statistics of empty tables (taken before the load,
/// autovacuum off), 50,000 lapsed holds among 1,000,000 reservations are
/// all expired in one pass: every batch reaches its reservations by id,
/// within the statement timeout whatever plan the statistics suggest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_janitor_expires_fifty_thousand_holds_whatever_the_statistics() {
    let Some(app) = TestApp::try_spawn(Backend::Postgres).await else {
        return;
    };
    for table in ["assets", "reservations", "events"] {
        app.sql(&format!(
            "ALTER TABLE {table} SET (autovacuum_enabled = off); ANALYZE {table}"
        ))
        .await;
    }
    app.sql(
        "INSERT INTO assets (id, name, status, hold_expires_at, current_reservation_id, \
                             created_at, updated_at) \
         SELECT 'JS-' || i, 'lot', 'HELD', now() - interval '1 minute', \
                'res_' || lpad(i::text, 26, '0'), now(), now() \
           FROM generate_series(1, 50000) i; \
         INSERT INTO reservations (id, asset_id, buyer_id, status, expires_at, created_at) \
         SELECT 'res_' || lpad(i::text, 26, '0'), 'JS-' || (1 + i % 50000), 'b' || i, \
                CASE WHEN i <= 50000 THEN 'HELD' ELSE 'EXPIRED' END, \
                now() - interval '1 minute' - make_interval(secs => i), \
                now() - interval '6 minutes' - make_interval(secs => i) \
           FROM generate_series(1, 1000000) i",
    )
    .await;
    // Each lapsed hold is its asset's current reservation (its own number).
    app.sql(
        "UPDATE assets SET current_reservation_id = r.id FROM reservations r \
          WHERE r.asset_id = assets.id AND r.status = 'HELD'",
    )
    .await;
    let report = holdfast::janitor::run_once(&app.store).await.unwrap();
    assert_eq!(report.expired, 50_000, "{report:?}");
    assert_eq!(
        app.count("SELECT count(*) FROM reservations WHERE status = 'HELD'")
            .await,
        0
    );
}

backend_tests!(
    run_once_sweeps_lapsed_holds_without_traffic,
    run_once_purges_answers_past_retention;
    backend:
        the_janitor_task_sweeps_on_its_interval,
        a_purge_lets_expiry_through_and_stops_when_asked,
);

/// The janitor's own task, on its interval, expires a hold that lapsed
/// without any request to find it.
async fn the_janitor_task_sweeps_on_its_interval(backend: Backend) {
    let Some(app) = TestApp::try_spawn_with(backend, |c| c.janitor_interval_seconds = 1).await
    else {
        return;
    };
    app.create_asset("J-6").await;
    let held = app.hold("J-6", "b", 60).await;
    app.lapse(held["reservation_id"].as_str().unwrap()).await;
    let expired = "SELECT count(*) FROM reservations WHERE status = 'EXPIRED'";
    eventually("the janitor expired the lapsed hold by itself", || async {
        app.count(expired).await == 1
    })
    .await;
}
