//! What operators rely on: metrics, request ids, failing closed when the
//! database is cut or stalls, recovery, and graceful shutdown.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::backend_tests;
use crate::helpers::{eventually, new_key, series, Backend, TestApp};
use crate::proxy::{Mode, Proxy};

/// Against a process of its own: its `/metrics` counts this test's requests
/// and nothing else, so every count is exact.
async fn metrics_count_outcomes_and_time_requests_by_route(backend: Backend) {
    let Some(app) = TestApp::try_spawn_process(backend, |_, _| {}).await else {
        return;
    };
    let before = app.get("/metrics").await.text().await.unwrap();
    app.create_asset("M-1").await;
    let r = app.hold("M-1", "b", 300).await;
    let id = r["reservation_id"].as_str().unwrap();
    for _ in 0..3 {
        let response = app
            .post(
                "/v1/assets/M-1/reservations",
                Some(&new_key()),
                &json!({"buyer_id": "x"}),
            )
            .await;
        assert_eq!(response.status(), 409);
    }
    assert_eq!(app.commit(id, "c-1", "pay-m1").await.status(), 200);
    assert_eq!(app.commit(id, "c-1", "pay-m1").await.status(), 200);
    assert_eq!(app.get("/no/such/route").await.status(), 404);

    let response = app.get("/metrics").await;
    assert_eq!(response.status(), 200);
    assert!(response.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    let after = response.text().await.unwrap();
    let grew = |s: &str| series(&after, s) - series(&before, s);
    assert_eq!(grew(r#"holdfast_holds_total{outcome="created"}"#), 1.0);
    assert_eq!(grew(r#"holdfast_holds_total{outcome="conflict"}"#), 3.0);
    assert_eq!(grew(r#"holdfast_commits_total{outcome="committed"}"#), 1.0);
    assert_eq!(grew(r#"holdfast_commits_total{outcome="replayed"}"#), 1.0);
    assert_eq!(grew("holdfast_idempotency_replays_total"), 1.0);
    assert!(grew("holdfast_db_statements_total") >= 6.0);
    // Only this test's requests made these series: before them, none.
    let reservations = r#"route="/v1/assets/{asset_id}/reservations""#;
    assert!(!before.contains(reservations), "{before}");
    assert!(after.contains(reservations), "{after}");
    assert!(!before.contains(r#"route="unmatched""#), "{before}");
    assert!(after.contains(r#"route="unmatched""#));
    assert!(after.contains("holdfast_http_requests_duration_seconds_bucket"));
    assert!(
        !after.contains("/no/such/route"),
        "unmatched paths share one label"
    );
    assert!(after.contains("holdfast_db_pool_size"));
    assert!(after.contains("# HELP holdfast_holds_total"));
}

async fn request_ids_are_echoed_or_generated(app: TestApp) {
    let mine = app
        .client
        .get(app.url("/healthz"))
        .header("X-Request-Id", "req-2026.abc")
        .send()
        .await
        .unwrap();
    assert_eq!(mine.headers()["x-request-id"], "req-2026.abc");
    for hostile in ["bad id with spaces", &"x".repeat(200)] {
        let response = app
            .client
            .get(app.url("/healthz"))
            .header("X-Request-Id", hostile)
            .send()
            .await
            .unwrap();
        let echoed = response.headers()["x-request-id"].to_str().unwrap();
        assert_ne!(echoed, hostile);
        assert_eq!(echoed.len(), 26, "a generated ULID");
    }
    let response = app.get("/v1/assets/none").await;
    assert_eq!(response.headers()["x-request-id"].len(), 26);
}

backend_tests!(
    request_ids_are_echoed_or_generated;
    backend:
        metrics_count_outcomes_and_time_requests_by_route,
);

/// Cut the connections to PostgreSQL, then stall them: every request needing
/// the database answers 503 with Retry-After within the bound, nothing is
/// answered 201 that was not committed, and the service recovers by itself.
/// A process of its own, so that the database errors it counts are its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_or_stalled_database_fails_closed_then_recovers() {
    let upstream = crate::helpers::postgres_address();
    let proxy = Proxy::start(&upstream).await;
    let port = proxy.port;
    let Some(app) = TestApp::try_spawn_process(Backend::Postgres, |command, url| {
        command
            .env(
                "HOLDFAST_DATABASE_URL",
                url.replace(&upstream, &format!("127.0.0.1:{port}")),
            )
            .env("HOLDFAST_DB_ACQUIRE_TIMEOUT_MS", "1000")
            .env("HOLDFAST_DB_TIMEOUT_MS", "2000");
    })
    .await
    else {
        return;
    };
    let started = app.process_output("database: ").await;
    assert!(
        started.contains(&format!("PostgreSQL at 127.0.0.1:{port}/")),
        "the app goes through the proxy: {started}"
    );
    app.create_asset("X-1").await;
    app.create_asset("X-2").await;
    app.hold("X-1", "b", 300).await;

    for mode in [Mode::Cut, Mode::Stall] {
        proxy.set(mode);
        for path in ["/v1/assets/X-1", "/readyz"] {
            let started = Instant::now();
            let response = app.get(path).await;
            let waited = started.elapsed();
            eprintln!("{mode:?} {path}: {} after {waited:?}", response.status());
            assert_eq!(response.status(), 503, "{mode:?} {path}");
            assert_eq!(response.headers()["retry-after"], "1");
            assert!(
                waited < Duration::from_secs(4),
                "{mode:?} {path}: answered after {waited:?}"
            );
        }
        let started = Instant::now();
        let response = app
            .post(
                "/v1/assets/X-2/reservations",
                Some("during-fault"),
                &json!({"buyer_id": "b"}),
            )
            .await;
        assert_eq!(response.status(), 503, "{mode:?}");
        assert!(started.elapsed() < Duration::from_secs(4));
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error_code"], "SERVICE_UNAVAILABLE");

        proxy.set(Mode::Pass);
        // Recovers without a restart: broken connections are replaced.
        let mut recovered = false;
        for _ in 0..50 {
            if app.get("/readyz").await.status() == 200 {
                recovered = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(recovered, "{mode:?}: ready again");
        // A retry with the key used during the fault either runs now or replays.
        let retry = app
            .post(
                "/v1/assets/X-2/reservations",
                Some("during-fault"),
                &json!({"buyer_id": "b"}),
            )
            .await;
        assert!(
            matches!(retry.status().as_u16(), 200 | 201),
            "{mode:?}: {}",
            retry.status()
        );
        let released: Value = retry.json().await.unwrap();
        app.release(released["reservation_id"].as_str().unwrap(), &new_key())
            .await;
    }
    // One hold on X-2 at a time: the retries never made two.
    assert_eq!(
        app.count("SELECT count(*) FROM reservations WHERE asset_id = 'X-2' AND status = 'HELD'")
            .await,
        0
    );
    let metrics = app.get("/metrics").await.text().await.unwrap();
    assert!(
        series(&metrics, r#"holdfast_db_errors_total{kind="timeout"}"#)
            + series(&metrics, r#"holdfast_db_errors_total{kind="unavailable"}"#)
            >= 4.0,
        "{metrics}"
    );
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// SIGTERM: in-flight requests finish, the process exits 0. The JSON log
/// carries the request id on the state-change line and never the secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_in_flight_requests_and_exits_zero() {
    let dir = std::env::temp_dir().join(format!("holdfast-shutdown-{}", ulid::Ulid::new()));
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("holdfast.db");
    let port = free_port();
    let secret = "s3cret-webhook-key-never-logged";
    let mut child = Command::new(env!("CARGO_BIN_EXE_holdfast"))
        .arg("serve")
        .env(
            "HOLDFAST_DATABASE_URL",
            format!("sqlite://{}", db.display()),
        )
        .env("HOLDFAST_BIND", format!("127.0.0.1:{port}"))
        .env("HOLDFAST_LOG_FORMAT", "json")
        .env("HOLDFAST_DB_LOCK_TIMEOUT_MS", "3000")
        .env("HOLDFAST_DB_TIMEOUT_MS", "4000")
        // Nothing but the requests uses the database after the start: a
        // connection in use is the hold's.
        .env("HOLDFAST_JANITOR_INTERVAL_SECONDS", "0")
        .env("HOLDFAST_DISPATCH_INTERVAL_MS", "600000")
        .env(
            "HOLDFAST_WEBHOOK_URL",
            format!("http://127.0.0.1:{}/hook", free_port()),
        )
        .env("HOLDFAST_WEBHOOK_SECRET", secret)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    let mut up = false;
    for _ in 0..100 {
        if client
            .get(format!("{base}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status() == 200)
        {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(up, "holdfast started");
    let created = client
        .post(format!("{base}/v1/assets"))
        .json(&json!({"id": "S-1", "name": "Seat 1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);

    // A hold that waits on a lock taken outside, then SIGTERM while it waits.
    let mut blocker = {
        use diesel::connection::SimpleConnection;
        use diesel::Connection;
        let mut conn = diesel::SqliteConnection::establish(&db.display().to_string()).unwrap();
        conn.batch_execute("BEGIN IMMEDIATE; UPDATE assets SET name = name;")
            .unwrap();
        conn
    };
    let in_flight = tokio::spawn({
        let client = client.clone();
        let base = base.clone();
        async move {
            client
                .post(format!("{base}/v1/assets/S-1/reservations"))
                .header("Idempotency-Key", "k-shutdown")
                .header("X-Request-Id", "req-shutdown-1")
                .json(&json!({"buyer_id": "b"}))
                .send()
                .await
        }
    });
    // The hold is in flight once it has the writer, waiting on the lock.
    eventually("the hold waits on the lock", || async {
        let page = client.get(format!("{base}/metrics")).send().await;
        let page = match page {
            Ok(response) => response.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        series(&page, "holdfast_db_pool_in_use") >= 1.0
    })
    .await;
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    // Shutting down, it takes no new connection.
    eventually("the server stops accepting connections", || async {
        let fresh = reqwest::Client::new();
        fresh.get(format!("{base}/healthz")).send().await.is_err()
    })
    .await;
    {
        use diesel::connection::SimpleConnection;
        blocker.batch_execute("ROLLBACK").unwrap();
    }
    let response = in_flight
        .await
        .unwrap()
        .expect("the in-flight request is answered");
    assert_eq!(response.status(), 201, "the in-flight hold completed");
    assert_eq!(response.headers()["x-request-id"], "req-shutdown-1");

    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "holdfast did not exit"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "exit status {status:?}");

    let mut output = String::new();
    for stream in [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read>),
    ]
    .into_iter()
    .flatten()
    {
        for line in BufReader::new(stream).lines() {
            output.push_str(&line.unwrap());
            output.push('\n');
        }
    }
    assert!(
        !output.contains(secret),
        "the webhook secret reached the log"
    );
    let held = output
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|l| l["message"] == "asset held")
        .unwrap_or_else(|| panic!("no 'asset held' line in:\n{output}"));
    assert_eq!(held["span"]["request_id"], "req-shutdown-1", "{held}");
    assert_eq!(held["span"]["asset_id"], "S-1");
    assert_eq!(held["span"]["idempotency_key"], "k-shutdown");
    let _ = std::fs::remove_dir_all(dir);
}
