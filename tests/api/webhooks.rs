//! Delivery of events to a real receiver, the event feed, and refunds.

use std::collections::HashSet;
use std::time::Duration;

use futures_util::future::join_all;
use holdfast::config::Secret;
use holdfast::outbox::{DispatchReport, Dispatcher, Settings};
use serde_json::{json, Value};

use crate::backend_tests;
use crate::helpers::{eventually, fault_library, Backend, TestApp};
use crate::receiver::{Receiver, SECRET};

fn dispatcher(app: &TestApp, url: &str, max_attempts: i32) -> Dispatcher {
    Dispatcher::new(
        app.store.clone(),
        Settings {
            url: url.to_owned(),
            secret: Secret::new(SECRET),
            timeout: Duration::from_secs(2),
            max_attempts,
            // Far longer than any test runs: a retry is due only once the
            // test ages it (`backoff_passes`), never because the host was slow.
            retry_base: Duration::from_secs(600),
            retry_max: Duration::from_secs(3600),
        },
    )
    .unwrap()
}

/// Makes every event waiting for a retry due now, as if its backoff had
/// passed.
async fn backoff_passes(app: &TestApp) {
    app.sql(
        "UPDATE events SET next_attempt_at = '2000-01-01T00:00:00.000000Z' \
         WHERE delivered_at IS NULL AND dead_at IS NULL AND next_attempt_at IS NOT NULL",
    )
    .await;
}

async fn events_reach_the_receiver_signed_once(app: TestApp) {
    let receiver = Receiver::start(0).await;
    app.create_asset("W-1").await;
    let r = app.hold("W-1", "b", 300).await;
    let id = r["reservation_id"].as_str().unwrap();
    assert_eq!(app.commit(id, "c", "pay-w1").await.status(), 200);

    let d = dispatcher(&app, &receiver.url, 5);
    let report = d.run_once().await.unwrap();
    assert_eq!(
        report,
        DispatchReport {
            delivered: 2,
            retrying: 0,
            dead: 0
        }
    );
    let got = receiver.received();
    assert_eq!(got.len(), 2);
    for delivery in &got {
        assert!(delivery.signature_is_valid(), "{delivery:?}");
        let body = delivery.json();
        assert_eq!(body["id"], delivery.event_id.as_str());
        assert_eq!(body["asset_id"], "W-1");
        assert!(body["created_at"].is_string());
    }
    let mut kinds: Vec<(i64, String)> = got
        .iter()
        .map(|d| {
            (
                d.json()["sequence"].as_i64().unwrap(),
                d.json()["type"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    kinds.sort();
    assert_eq!(
        kinds,
        [
            (1, "reservation.held".to_owned()),
            (2, "reservation.committed".to_owned())
        ]
    );
    let committed = got
        .iter()
        .find(|d| d.json()["type"] == "reservation.committed")
        .unwrap();
    assert_eq!(committed.json()["data"]["status"], "COMMITTED");
    assert_eq!(committed.json()["data"]["reservation_id"], id);

    // Delivered events are not sent again.
    assert_eq!(d.run_once().await.unwrap(), DispatchReport::default());
    assert_eq!(receiver.received().len(), 2);
    receiver.stop().await;
}

async fn a_failing_receiver_gets_the_event_once_more_per_failure(app: TestApp) {
    let receiver = Receiver::start(2).await;
    app.create_asset("W-2").await;
    app.hold("W-2", "b", 300).await;
    let d = dispatcher(&app, &receiver.url, 10);
    assert_eq!(d.run_once().await.unwrap().retrying, 1);
    // Not due again before its backoff.
    assert_eq!(d.run_once().await.unwrap(), DispatchReport::default());
    backoff_passes(&app).await;
    assert_eq!(d.run_once().await.unwrap().retrying, 1);
    backoff_passes(&app).await;
    assert_eq!(d.run_once().await.unwrap().delivered, 1);
    backoff_passes(&app).await;
    assert_eq!(d.run_once().await.unwrap(), DispatchReport::default());
    let got = receiver.received();
    assert_eq!(got.len(), 3, "two failures, one success, then nothing");
    assert!(got
        .iter()
        .all(|r| r.event_id == got[0].event_id && r.body == got[0].body));
    receiver.stop().await;
}

/// A redirect is not a delivery: never followed, it counts as a failed
/// attempt (with its Location recorded), retried and finally parked as dead.
async fn a_redirect_is_a_failed_attempt(app: TestApp) {
    let receiver = Receiver::start_redirecting().await;
    app.create_asset("W-R").await;
    app.hold("W-R", "b", 300).await;
    let d = dispatcher(&app, &receiver.url, 2);
    let first = d.run_once().await.unwrap();
    assert_eq!((first.delivered, first.retrying), (0, 1), "{first:?}");
    assert_eq!(
        app.count(
            "SELECT count(*) FROM events WHERE delivered_at IS NULL AND last_error LIKE '%302%Location /landing%'"
        )
        .await,
        1
    );
    backoff_passes(&app).await;
    let second = d.run_once().await.unwrap();
    assert_eq!((second.delivered, second.dead), (0, 1), "{second:?}");
    let got = receiver.received();
    assert_eq!(got.len(), 2, "two POSTs, no redirected request");
    assert!(got
        .iter()
        .all(|r| r.method == "POST" && r.path != "/landing"));
    assert_eq!(
        app.count("SELECT count(*) FROM events WHERE dead_at IS NOT NULL")
            .await,
        1
    );
    receiver.stop().await;
}

async fn a_receiver_down_keeps_events_pending_until_it_returns(app: TestApp) {
    let port = Receiver::vacant_port();
    let url = format!("http://127.0.0.1:{port}/hooks/holdfast");
    app.create_asset("W-3").await;
    app.hold("W-3", "b", 300).await;
    let d = dispatcher(&app, &url, 10);
    assert_eq!(d.run_once().await.unwrap().retrying, 1);
    assert_eq!(
        app.count("SELECT count(*) FROM events WHERE delivered_at IS NULL AND dead_at IS NULL AND last_error IS NOT NULL")
            .await,
        1
    );
    let receiver = Receiver::start_on_port(port).await;
    backoff_passes(&app).await;
    assert_eq!(d.run_once().await.unwrap().delivered, 1);
    assert_eq!(receiver.received().len(), 1);
    assert_eq!(
        app.count("SELECT count(*) FROM events WHERE delivered_at IS NULL")
            .await,
        0
    );
    receiver.stop().await;
}

async fn two_dispatchers_deliver_each_event_once(app: TestApp) {
    let receiver = Receiver::start(0).await;
    for i in 0..40 {
        let asset = format!("W-M{i}");
        app.create_asset(&asset).await;
        app.hold(&asset, &format!("buyer-{asset}"), 300).await;
    }
    let (a, b) = (
        dispatcher(&app, &receiver.url, 5),
        dispatcher(&app, &receiver.url, 5),
    );
    let reports = join_all([a.run_once(), b.run_once(), a.run_once(), b.run_once()]).await;
    let delivered: u64 = reports.into_iter().map(|r| r.unwrap().delivered).sum();
    assert_eq!(delivered, 40);
    let got = receiver.received();
    let ids: HashSet<&str> = got.iter().map(|r| r.event_id.as_str()).collect();
    assert_eq!(got.len(), 40, "no event was sent twice");
    assert_eq!(ids.len(), 40);
    receiver.stop().await;
}

async fn a_late_commit_is_delivered_as_one_refund_request(app: TestApp) {
    let receiver = Receiver::start(0).await;
    app.create_asset("W-4").await;
    let r = app.hold("W-4", "b", 60).await;
    let id = r["reservation_id"].as_str().unwrap();
    app.lapse(id).await;
    for key in ["late-1", "late-1", "late-2"] {
        assert_eq!(app.commit(id, key, "pay-late").await.status(), 409);
    }
    dispatcher(&app, &receiver.url, 5).run_once().await.unwrap();
    let refunds: Vec<Value> = receiver
        .received()
        .iter()
        .map(|r| r.json())
        .filter(|e| e["type"] == "refund.requested")
        .collect();
    assert_eq!(refunds.len(), 1);
    assert_eq!(refunds[0]["data"]["payment_reference"], "pay-late");
    assert_eq!(refunds[0]["data"]["reason"], "HOLD_EXPIRED");
    receiver.stop().await;
}

async fn dead_events_are_listed_and_sent_again(app: TestApp) {
    let receiver = Receiver::start(usize::MAX).await;
    app.create_asset("W-5").await;
    app.hold("W-5", "b", 300).await;
    let d = dispatcher(&app, &receiver.url, 2);
    assert_eq!(d.run_once().await.unwrap().retrying, 1);
    backoff_passes(&app).await;
    assert_eq!(d.run_once().await.unwrap().dead, 1);
    backoff_passes(&app).await;
    assert_eq!(
        d.run_once().await.unwrap(),
        DispatchReport::default(),
        "dead events rest"
    );

    let dead = app.get_json("/v1/events/dead").await;
    assert_eq!(dead["items"].as_array().unwrap().len(), 1);
    let event_id = dead["items"][0]["id"].as_str().unwrap().to_owned();
    let response = app
        .post(
            &format!("/v1/events/{event_id}/redeliver"),
            None,
            &json!({}),
        )
        .await;
    assert_eq!(response.status(), 202);
    assert!(app.get_json("/v1/events/dead").await["items"]
        .as_array()
        .unwrap()
        .is_empty());

    receiver.fail_next(0);
    assert_eq!(d.run_once().await.unwrap().delivered, 1);
    assert_eq!(receiver.received().len(), 3);
    let missing = app
        .post(
            "/v1/events/evt_01HZX4C6W0R1T2Y3U4I5O6P7A8/redeliver",
            None,
            &json!({}),
        )
        .await;
    assert_eq!(missing.status(), 404);
    receiver.stop().await;
}

/// Follows the feed from `cursor` in pages of `limit` until `want` events
/// arrived. An event shows once every transaction that started before it has
/// ended (on PostgreSQL, cluster-wide, and other tests share the cluster), so
/// a reader may have to poll for a while: up to 30 s.
async fn follow_feed(
    app: &TestApp,
    mut cursor: String,
    limit: usize,
    want: usize,
) -> (Vec<Value>, String) {
    let mut items = Vec::new();
    for _ in 0..600 {
        let path = if cursor.is_empty() {
            format!("/v1/events?limit={limit}")
        } else {
            format!("/v1/events?limit={limit}&after={cursor}")
        };
        let page = app.get_json(&path).await;
        let got = page["items"].as_array().unwrap().clone();
        assert!(got.len() <= limit);
        cursor = page["next_cursor"].as_str().unwrap().to_owned();
        items.extend(got);
        if items.len() >= want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (items, cursor)
}

async fn the_feed_pages_oldest_first_and_polls_from_its_cursor(app: TestApp) {
    for i in 0..5 {
        let asset = format!("F-{i}");
        app.create_asset(&asset).await;
        app.hold(&asset, &format!("buyer-{asset}"), 300).await;
    }
    let (items, cursor) = follow_feed(&app, String::new(), 2, 5).await;
    let assets: Vec<&str> = items
        .iter()
        .map(|e| e["asset_id"].as_str().unwrap())
        .collect();
    assert_eq!(assets, ["F-0", "F-1", "F-2", "F-3", "F-4"]);
    // At the end the cursor stays put, and new events appear after it.
    let empty = app.get_json(&format!("/v1/events?after={cursor}")).await;
    assert!(empty["items"].as_array().unwrap().is_empty());
    assert_eq!(empty["next_cursor"], cursor.as_str());
    app.create_asset("F-5").await;
    app.hold("F-5", "b", 300).await;
    let (next, _) = follow_feed(&app, cursor, 10, 1).await;
    assert_eq!(next.len(), 1);
    assert_eq!(next[0]["asset_id"], "F-5");
    for bad in ["after=garbage", "limit=0", "limit=x"] {
        assert_eq!(
            app.get(&format!("/v1/events?{bad}")).await.status(),
            422,
            "{bad}"
        );
    }
}

async fn refunds_are_listed_and_completed_once(app: TestApp) {
    app.create_asset("W-6").await;
    let r = app.hold("W-6", "b", 300).await;
    let id = r["reservation_id"].as_str().unwrap();
    app.release(id, "rel").await;
    let refund: Value = app.commit(id, "c", "pay-6").await.json().await.unwrap();
    let refund_id = refund["refund"]["refund_id"].as_str().unwrap().to_owned();

    let requested = app.get_json("/v1/refunds?status=REQUESTED").await;
    assert_eq!(requested["items"].as_array().unwrap().len(), 1);
    assert_eq!(requested["items"][0]["refund_id"], refund_id.as_str());

    let path = format!("/v1/refunds/{refund_id}/complete");
    let done = app.post(&path, Some("done-1"), &json!({})).await;
    assert_eq!(done.status(), 200);
    let done: Value = done.json().await.unwrap();
    assert_eq!(done["status"], "COMPLETED");
    assert!(done["completed_at"].is_string());
    let replay = app.post(&path, Some("done-1"), &json!({})).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    let again = app.post(&path, Some("done-2"), &json!({})).await;
    assert_eq!(again.status(), 200);
    assert_eq!(
        again.json::<Value>().await.unwrap()["completed_at"],
        done["completed_at"]
    );
    assert_eq!(
        app.count("SELECT count(*) FROM events WHERE type = 'refund.completed'")
            .await,
        1
    );

    assert!(app.get_json("/v1/refunds?status=REQUESTED").await["items"]
        .as_array()
        .unwrap()
        .is_empty());
    assert_eq!(
        app.get_json("/v1/refunds?status=COMPLETED").await["items"][0]["refund_id"],
        refund_id.as_str()
    );
    let reservation = app.get_json(&format!("/v1/reservations/{id}")).await;
    assert_eq!(reservation["refunds"][0]["status"], "COMPLETED");
    let missing = app
        .post(
            "/v1/refunds/rf_01HZX4B2Q7C3M9D8E6F5G4H3J2/complete",
            Some("k"),
            &json!({}),
        )
        .await;
    assert_eq!(missing.status(), 404);
    assert_eq!(app.post(&path, None, &json!({})).await.status(), 400);
}

async fn refunds_page_by_cursor(app: TestApp) {
    for i in 0..3 {
        let asset = format!("W-P{i}");
        app.create_asset(&asset).await;
        let r = app.hold(&asset, &format!("buyer-{asset}"), 300).await;
        let id = r["reservation_id"].as_str().unwrap();
        app.release(id, &format!("rel-{i}")).await;
        app.commit(id, &format!("c-{i}"), &format!("pay-p{i}"))
            .await;
    }
    let first = app.get_json("/v1/refunds?limit=2").await;
    assert_eq!(first["items"].as_array().unwrap().len(), 2);
    let rest = app
        .get_json(&format!(
            "/v1/refunds?limit=2&cursor={}",
            first["next_cursor"].as_str().unwrap()
        ))
        .await;
    assert_eq!(rest["items"].as_array().unwrap().len(), 1);
    assert_eq!(rest["next_cursor"], Value::Null);
    assert_eq!(app.get("/v1/refunds?status=LOST").await.status(), 422);
}

async fn old_delivered_events_are_purged_only_when_configured(app: TestApp) {
    app.create_asset("W-7").await;
    app.hold("W-7", "b", 300).await;
    app.age_delivered_events(None).await;
    assert_eq!(
        holdfast::janitor::run_once(&app.store)
            .await
            .unwrap()
            .purged_events,
        0
    );
    assert_eq!(app.count("SELECT count(*) FROM events").await, 1);
}

backend_tests!(
    events_reach_the_receiver_signed_once,
    a_failing_receiver_gets_the_event_once_more_per_failure,
    a_receiver_down_keeps_events_pending_until_it_returns,
    two_dispatchers_deliver_each_event_once,
    a_late_commit_is_delivered_as_one_refund_request,
    dead_events_are_listed_and_sent_again,
    the_feed_pages_oldest_first_and_polls_from_its_cursor,
    refunds_are_listed_and_completed_once,
    refunds_page_by_cursor,
    old_delivered_events_are_purged_only_when_configured,
    a_redirect_is_a_failed_attempt;
    backend:
        the_feed_never_skips_after_every_event_was_purged,
        delivered_events_past_retention_are_purged,
        serve_runs_the_dispatcher_by_itself,
);

/// The feed's cursor only grows: once retention purged every event, a poller
/// resuming from its old cursor still receives every new event.
async fn the_feed_never_skips_after_every_event_was_purged(backend: Backend) {
    let Some(app) = TestApp::try_spawn_with(backend, |c| c.event_retention_days = Some(30)).await
    else {
        return;
    };
    for i in 0..3 {
        app.create_asset(&format!("FP-{i}")).await;
        app.hold(&format!("FP-{i}"), "b", 300).await;
    }
    let (items, cursor) = follow_feed(&app, String::new(), 500, 3).await;
    assert_eq!(items.len(), 3, "{backend:?}");
    app.age_delivered_events(None).await;
    let report = holdfast::janitor::run_once(&app.store).await.unwrap();
    assert_eq!(report.purged_events, 3, "{backend:?}");
    assert_eq!(app.count("SELECT count(*) FROM events").await, 0);
    // New events after the purge.
    app.create_asset("FP-new").await;
    app.hold("FP-new", "b", 300).await;
    let (resumed, next) = follow_feed(&app, cursor.clone(), 500, 1).await;
    let types: Vec<&str> = resumed
        .iter()
        .map(|e| e["asset_id"].as_str().unwrap())
        .collect();
    assert_eq!(types, ["FP-new"], "{backend:?}: {resumed:?}");
    assert_ne!(next, cursor);
}

/// `holdfast serve` on the SQLite file at `url`, its wall clock shifted by
/// `shift` seconds.
async fn serve_sqlite(url: &str, shift: i64) -> TestApp {
    let library = fault_library();
    TestApp::try_spawn_process(Backend::Sqlite, |command, _| {
        command
            .env("HOLDFAST_DATABASE_URL", url)
            .env("LD_PRELOAD", &library)
            .env("FAULT_CLOCK_SHIFT_SECONDS", shift.to_string());
    })
    .await
    .expect("SQLite needs nothing")
}

/// SQLite's feed positions do not rest on the clock. Events are written
/// while the clock is a year ahead and every one is purged; the service
/// restarts with the clock right again; then a backup from before those
/// events is restored. Each time, a poller resuming from the cursor it
/// holds sees the new events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_feed_positions_outgrow_purges_restarts_restores_and_the_clock() {
    let dir = std::env::temp_dir().join(format!("holdfast-feed-{}", ulid::Ulid::new()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}", dir.join("holdfast.db").display());
    let backup = dir.join("backup.db");
    let holdfast = |args: &[&str]| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_holdfast"))
            .args(args)
            .env("HOLDFAST_DATABASE_URL", &url)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "holdfast {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    let year = 365 * 24 * 3600;

    let ahead = serve_sqlite(&url, year).await;
    ahead.create_asset("FC-1").await;
    ahead.hold("FC-1", "b", 300).await;
    holdfast(&["backup", &backup.display().to_string()]);
    ahead.create_asset("FC-2").await;
    ahead.hold("FC-2", "b", 300).await;
    let (items, cursor) = follow_feed(&ahead, String::new(), 500, 2).await;
    assert_eq!(items.len(), 2);
    drop(ahead);
    {
        use diesel::connection::SimpleConnection;
        use diesel::Connection;
        let path = url.trim_start_matches("sqlite://");
        let mut conn = diesel::SqliteConnection::establish(path).unwrap();
        conn.batch_execute("DELETE FROM events").unwrap();
    }

    let right = serve_sqlite(&url, 0).await;
    right.create_asset("FC-3").await;
    right.hold("FC-3", "b", 300).await;
    let (resumed, cursor) = follow_feed(&right, cursor, 500, 1).await;
    let assets: Vec<&str> = resumed
        .iter()
        .map(|e| e["asset_id"].as_str().unwrap())
        .collect();
    assert_eq!(assets, ["FC-3"], "after the purge and the restart");
    drop(right);

    holdfast(&["restore", &backup.display().to_string()]);
    let restored = serve_sqlite(&url, 0).await;
    restored.create_asset("FC-4").await;
    restored.hold("FC-4", "b", 300).await;
    let (resumed, _) = follow_feed(&restored, cursor, 500, 1).await;
    let assets: Vec<&str> = resumed
        .iter()
        .map(|e| e["asset_id"].as_str().unwrap())
        .collect();
    assert_eq!(assets, ["FC-4"], "after the restore");
    drop(restored);
    let _ = std::fs::remove_dir_all(dir);
}

async fn delivered_events_past_retention_are_purged(backend: Backend) {
    let Some(app) = TestApp::try_spawn_with(backend, |c| c.event_retention_days = Some(30)).await
    else {
        return;
    };
    app.create_asset("W-8").await;
    app.hold("W-8", "b", 300).await;
    app.create_asset("W-9").await;
    app.hold("W-9", "b", 300).await;
    app.age_delivered_events(Some("asset_id = 'W-8'")).await;
    let report = holdfast::janitor::run_once(&app.store).await.unwrap();
    assert_eq!(report.purged_events, 1, "{backend:?}");
    assert_eq!(
        app.count("SELECT count(*) FROM events").await,
        1,
        "{backend:?}"
    );
}

async fn serve_runs_the_dispatcher_by_itself(backend: Backend) {
    let receiver = Receiver::start(0).await;
    let url = receiver.url.clone();
    let Some(app) = TestApp::try_spawn_with(backend, |c| {
        c.webhook_url = Some(url);
        c.webhook_secret = Some(Secret::new(SECRET));
        c.dispatch_interval_ms = 50;
    })
    .await
    else {
        return;
    };
    app.create_asset("W-10").await;
    app.hold("W-10", "b", 300).await;
    eventually("the event reached the receiver", || async {
        receiver.received().len() == 1
    })
    .await;
    assert!(receiver.received()[0].signature_is_valid());
    receiver.stop().await;
}
