//! A 503 says what is known: `write_outcome` is NOT_APPLIED when nothing can
//! have been written, UNKNOWN only when a COMMIT may have been sent; and a
//! retry with the same Idempotency-Key then answers the truth.

use std::time::Duration;

use serde_json::{json, Value};

use crate::backend_tests;
use crate::helpers::{eventually, fault_library, new_key, unique, Backend, TestApp};
use crate::proxy::{Mode, Proxy};

async fn unavailable(response: reqwest::Response) -> Value {
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["retry-after"], "1");
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error_code"], "SERVICE_UNAVAILABLE", "{body}");
    body
}

async fn held(app: &TestApp, asset: &str) -> String {
    app.create_asset(asset).await;
    app.hold(asset, "b", 300).await["reservation_id"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// A PostgreSQL-backed app that reaches its database through a proxy the
/// test can cut and stall, and gives up on a connection after `acquire_ms`
/// and on a request's database work after a second; `adjust` sets the rest.
async fn behind_a_proxy(
    acquire_ms: u64,
    adjust: impl FnOnce(&mut holdfast::config::Config),
) -> Option<(Proxy, TestApp)> {
    let upstream = crate::helpers::postgres_address();
    let proxy = Proxy::start(&upstream).await;
    let port = proxy.port;
    let app = TestApp::try_spawn_with(Backend::Postgres, |c| {
        c.database_url = c
            .database_url
            .replace(&upstream, &format!("127.0.0.1:{port}"));
        c.db_acquire_timeout_ms = acquire_ms;
        c.db_timeout_ms = 1000;
        adjust(c);
    })
    .await?;
    Some((proxy, app))
}

/// An SQLite-backed app whose writes wait up to `lock_ms` for SQLite's lock
/// and whose requests' database work may take `timeout_ms`.
async fn sqlite_app(lock_ms: u64, timeout_ms: u64) -> Option<TestApp> {
    TestApp::try_spawn_with(Backend::Sqlite, |c| {
        c.db_lock_timeout_ms = lock_ms;
        c.db_timeout_ms = timeout_ms;
    })
    .await
}

/// PostgreSQL cut off or stalled: nothing written, and the retry with the
/// same Idempotency-Key runs for the first time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_connection_is_not_applied() {
    let Some((proxy, app)) = behind_a_proxy(500, |_| {}).await else {
        return;
    };
    for (mode, asset) in [(Mode::Cut, "WO-1"), (Mode::Stall, "WO-2")] {
        let id = held(&app, asset).await;
        let payment = format!("pay-{asset}");
        proxy.set(mode);
        let key = new_key();
        let body = unavailable(app.commit(&id, &key, &payment).await).await;
        assert_eq!(body["write_outcome"], "NOT_APPLIED", "{mode:?}: {body}");
        assert!(body["message"]
            .as_str()
            .unwrap()
            .contains("nothing was changed"));
        proxy.set(Mode::Pass);
        // The retry with the same key, once the database is back, tells the
        // truth: nothing was stored, so it runs for the first time and sells.
        let mut retried = None;
        for _ in 0..30 {
            let response = app.commit(&id, &key, &payment).await;
            if response.status() != 503 {
                retried = Some(response);
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let retried = retried.expect("an answer once the database is back");
        assert_eq!(retried.status(), 200, "{mode:?}");
        assert!(
            retried.headers().get("idempotent-replayed").is_none(),
            "{mode:?}: nothing was stored by the first attempt"
        );
        let sold: Value = retried.json().await.unwrap();
        assert_eq!(sold["status"], "COMMITTED", "{mode:?}");
        // From now on the same key replays that sale.
        let again = app.commit(&id, &key, &payment).await;
        assert_eq!(again.headers()["idempotent-replayed"], "true", "{mode:?}");
    }
}

/// A database that accepts connections and never answers (a black-holed
/// address) leaves the service with no more connections open than its pool
/// holds: each connect the pool stops waiting for is dropped with its
/// socket, not left running until the operating system gives up on it,
/// minutes later, one more for every request meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connects_to_a_database_that_never_answers_do_not_pile_up() {
    let Some((proxy, app)) = behind_a_proxy(200, |c| c.db_pool_size = 2).await else {
        return;
    };
    app.create_asset("BH-1").await;
    proxy.set(Mode::Stall);
    for _ in 0..4 {
        let reads = (0..10).map(|_| app.get("/v1/assets/BH-1"));
        for response in futures_util::future::join_all(reads).await {
            unavailable(response).await;
        }
    }
    // The last connects given up on close within moments.
    let mut open = proxy.open();
    for _ in 0..20 {
        if open <= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        open = proxy.open();
    }
    assert!(
        open <= 2,
        "{open} connections open to a database that never answers, pool of 2"
    );
    proxy.set(Mode::Pass);
    eventually("the database is back", || async {
        app.get("/v1/assets/BH-1").await.status() == 200
    })
    .await;
}

/// A statement stuck behind another transaction's lock is cancelled by the
/// lock timeout and rolled back: not applied, on both backends, for a write
/// in a transaction (commit) and for a single-statement write (hold).
async fn a_statement_stuck_behind_a_lock_is_not_applied(backend: Backend) {
    let Some(app) = TestApp::try_spawn_with(backend, |c| {
        c.db_lock_timeout_ms = 300;
        c.db_timeout_ms = 2000;
    })
    .await
    else {
        return;
    };
    let id = held(&app, "WO-L1").await;
    app.create_asset("WO-L2").await;
    let lock = match backend {
        Backend::Postgres => {
            "BEGIN; SELECT 1 FROM assets WHERE id IN ('WO-L1', 'WO-L2') FOR UPDATE"
        }
        Backend::Sqlite => "BEGIN IMMEDIATE; UPDATE assets SET name = name WHERE id = 'WO-L1'",
    };
    let blocker = app.hold_lock_open(lock).await;
    let commit_key = new_key();
    let body = unavailable(app.commit(&id, &commit_key, "pay-lock").await).await;
    assert_eq!(body["write_outcome"], "NOT_APPLIED", "{body}");
    let hold_key = new_key();
    let hold = json!({"buyer_id": "b2"});
    let path = "/v1/assets/WO-L2/reservations";
    let body = unavailable(app.post(path, Some(&hold_key), &hold).await).await;
    assert_eq!(body["write_outcome"], "NOT_APPLIED", "{body}");
    blocker.release().await;
    // The same keys now run for the first time: no stored answer existed.
    let commit = app.commit(&id, &commit_key, "pay-lock").await;
    assert_eq!(commit.status(), 200);
    assert!(commit.headers().get("idempotent-replayed").is_none());
    let hold = app.post(path, Some(&hold_key), &hold).await;
    assert_eq!(hold.status(), 201);
}

/// Every transaction that inserts into `table` makes its COMMIT wait 1.5 s:
/// a deferred trigger runs at COMMIT time, as a synchronous standby's wait
/// does. Dropped with `DROP TRIGGER slow_commit ON table`.
async fn slow_commits(app: &TestApp, table: &str) {
    app.sql(&format!(
        "CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS \
           $$ BEGIN PERFORM pg_sleep(1.5); RETURN NULL; END $$; \
         CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON {table} \
           DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit();"
    ))
    .await;
}

/// A write that takes no Idempotency-Key (creating an asset) whose COMMIT
/// may have happened: UNKNOWN, and the message says to read the resource
/// back, not to retry with a key the operation does not take.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unkeyed_write_that_may_have_committed_says_to_read_back() {
    let Some(app) = TestApp::try_spawn_with(Backend::Postgres, |c| {
        c.db_timeout_ms = 700;
    })
    .await
    else {
        return;
    };
    slow_commits(&app, "assets").await;
    let created = app
        .post("/v1/assets", None, &json!({"id": "WO-U1", "name": "u"}))
        .await;
    let body = unavailable(created).await;
    assert_eq!(body["write_outcome"], "UNKNOWN", "{body}");
    let message = body["message"].as_str().unwrap();
    assert!(message.contains("Read the resource back"), "{body}");
    assert!(!message.contains("Idempotency-Key"), "{body}");
    app.sql("DROP TRIGGER slow_commit ON assets").await;
    // Reading back tells what happened: the asset was created, once the
    // slow COMMIT ends.
    eventually("the slow COMMIT of the asset landed", || async {
        app.get("/v1/assets/WO-U1").await.status() == 200
    })
    .await;
}

/// A COMMIT that waits past the request's time (as with a synchronous
/// standby gone): the change may commit, so the answer says UNKNOWN; once it
/// committed, the retry with the same key returns the stored answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_that_waits_is_unknown_and_the_retry_answers_the_truth() {
    let Some(app) = TestApp::try_spawn_with(Backend::Postgres, |c| {
        c.db_timeout_ms = 700;
    })
    .await
    else {
        return;
    };
    let id = held(&app, "WO-C1").await;
    slow_commits(&app, "idempotency_keys").await;
    let key = new_key();
    let body = unavailable(app.commit(&id, &key, "pay-slow").await).await;
    assert_eq!(body["write_outcome"], "UNKNOWN", "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("same Idempotency-Key"),
        "{body}"
    );
    app.sql("DROP TRIGGER slow_commit ON idempotency_keys")
        .await;
    let stored = format!("SELECT count(*) FROM idempotency_keys WHERE key = '{key}'");
    eventually("the slow COMMIT of the sale landed", || async {
        app.count(&stored).await == 1
    })
    .await;
    let retry = app.commit(&id, &key, "pay-slow").await;
    assert_eq!(retry.status(), 200);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    let sold: Value = retry.json().await.unwrap();
    assert_eq!(sold["status"], "COMMITTED");
}

/// A hold is answered only once its transaction committed: the statement's
/// rows come before its COMMIT when it runs on its own, and a COMMIT that
/// fails (here a deferred trigger that raises, as a synchronous standby's
/// wait can end the session) must not leave a 201 behind for a hold that
/// is not there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_is_answered_only_after_its_commit() {
    // No per-buyer limit: the hold is its single statement, committed on its own.
    let Some(app) = TestApp::try_spawn_with(Backend::Postgres, |c| {
        c.max_holds_per_buyer = 0;
    })
    .await
    else {
        return;
    };
    app.create_asset("WO-H1").await;
    app.sql(
        "CREATE FUNCTION failing_commit() RETURNS trigger LANGUAGE plpgsql AS \
           $$ BEGIN PERFORM pg_sleep(0.2); RAISE EXCEPTION 'the commit failed'; END $$; \
         CREATE CONSTRAINT TRIGGER failing_commit AFTER INSERT ON reservations \
           DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION failing_commit();",
    )
    .await;
    let response = app
        .post(
            "/v1/assets/WO-H1/reservations",
            Some(&new_key()),
            &json!({"buyer_id": "b-1", "hold_seconds": 60}),
        )
        .await;
    let status = response.status();
    let body = response.text().await.unwrap();
    assert_eq!(app.count("SELECT count(*) FROM reservations").await, 0);
    assert!(
        !status.is_success(),
        "a hold that did not commit answered {status}: {body}"
    );
}

/// SQLite's write runs on a blocking thread that outlives the request's
/// time: past the deadline it must roll back, not commit behind a 503 that
/// said nothing was written. The writer is held by another process longer
/// than the request may wait; when it frees up, the abandoned write finds
/// its gate closed and commits nothing, so the retry runs for the first time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_checks_the_deadline_before_committing() {
    let Some(app) = sqlite_app(5000, 400).await else {
        return;
    };
    app.create_asset("WO-S1").await;
    let blocker = app.lock_asset("WO-S1").await;
    let key = new_key();
    let hold = json!({"buyer_id": "b"});
    let path = "/v1/assets/WO-S1/reservations";
    let body = unavailable(app.post(path, Some(&key), &hold).await).await;
    assert_eq!(body["write_outcome"], "NOT_APPLIED", "{body}");
    // The write goes on waiting for the lock; freed, it runs to its end
    // before the one writer takes the next write.
    blocker.release().await;
    app.create_asset("WO-S2").await;
    assert_eq!(
        app.count("SELECT count(*) FROM reservations").await,
        0,
        "the abandoned write rolled back"
    );
    let retry = app.post(path, Some(&key), &hold).await;
    assert_eq!(retry.status(), 201, "runs for the first time");
}

/// SQLite's COMMIT is as slow as its disk: when the request's time runs out
/// while the COMMIT (the log's write and sync) is under way, the change may
/// still land, so the answer is UNKNOWN; once it landed, the retry with the
/// same key replays the stored answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_commit_slower_than_the_deadline_is_unknown() {
    let library = fault_library();
    let slow_disk = std::env::temp_dir().join(unique("holdfast-slow-disk"));
    let Some(app) = TestApp::try_spawn_process(Backend::Sqlite, |command, _| {
        command
            .env("LD_PRELOAD", &library)
            .env("FAULT_SLOW_SYNC_FILE", &slow_disk)
            .env("HOLDFAST_DB_TIMEOUT_MS", "700");
    })
    .await
    else {
        return;
    };
    app.create_asset("WO-D1").await;
    let key = new_key();
    let hold = json!({"buyer_id": "b"});
    let path = "/v1/assets/WO-D1/reservations";
    std::fs::write(&slow_disk, "").unwrap();
    let body = unavailable(app.post(path, Some(&key), &hold).await).await;
    std::fs::remove_file(&slow_disk).unwrap();
    assert_eq!(body["write_outcome"], "UNKNOWN", "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("same Idempotency-Key"),
        "{body}"
    );
    // The COMMIT goes on on the writer's thread and lands.
    eventually("the slow COMMIT landed", || async {
        app.count("SELECT count(*) FROM reservations").await == 1
    })
    .await;
    let retry = app.post(path, Some(&key), &hold).await;
    assert_eq!(retry.status(), 200);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(app.count("SELECT count(*) FROM reservations").await, 1);
}

/// A forced withdrawal decided while a hold was live, but written after the
/// hold lapsed (it waited for SQLite's writer meanwhile), expires the hold
/// instead of releasing it: no reservation is released after its expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_withdrawal_written_after_the_expiry_expires_the_hold() {
    let Some(app) = sqlite_app(5000, 6000).await else {
        return;
    };
    app.create_asset("WX-2").await;
    app.create_asset("WX-1").await;
    let hold = app.hold("WX-1", "b", 1).await;
    let id = hold["reservation_id"].as_str().unwrap().to_owned();
    let blocker = app.lock_asset("WX-2").await;
    // The withdrawal reads the live hold at once, then waits for the writer
    // until after the hold's expiry.
    let expires = chrono::DateTime::parse_from_rfc3339(hold["expires_at"].as_str().unwrap())
        .unwrap()
        .with_timezone(&chrono::Utc);
    let free_later = async {
        eventually("the hold lapsed while the withdrawal waited", || async {
            chrono::Utc::now() > expires + chrono::Duration::milliseconds(100)
        })
        .await;
        blocker.release().await;
    };
    let force = json!({"force": true});
    let (forced, ()) = tokio::join!(
        app.post("/v1/assets/WX-1/withdraw", None, &force),
        free_later
    );
    assert_eq!(forced.status(), 200);
    let forced: Value = forced.json().await.unwrap();
    assert_eq!(forced["status"], "WITHDRAWN", "{forced}");
    let ended = app.get_json(&format!("/v1/reservations/{id}")).await;
    assert_eq!(ended["status"], "EXPIRED", "{ended}");
    assert_eq!(ended["released_at"], Value::Null, "{ended}");
    let types: Vec<Value> = app.get_json("/v1/assets/WX-1/events").await["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].clone())
        .collect();
    assert_eq!(
        types,
        ["reservation.held", "reservation.expired", "asset.withdrawn"]
    );
}

/// A hold abandoned at the request's deadline while its statement waits for
/// a lock longer than the request may: the statement is still running and
/// commits when the lock is released, so the answer is 503 UNKNOWN, never
/// NOT_APPLIED; the pool's only connection then serves the next request, and
/// the retry with the same key answers what happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_hold_is_unknown_and_its_retry_tells() {
    let Some(app) = TestApp::try_spawn_with(Backend::Postgres, |c| {
        c.db_pool_size = 1;
        c.db_timeout_ms = 500;
        c.db_lock_timeout_ms = 5000;
        c.db_statement_timeout_ms = 8000;
    })
    .await
    else {
        return;
    };
    app.create_asset("AB-1").await;
    app.create_asset("AB-2").await;
    let blocker = app
        .hold_lock_open("BEGIN; SELECT 1 FROM assets WHERE id = 'AB-1' FOR UPDATE")
        .await;
    let key = new_key();
    let hold = json!({"buyer_id": "b-ab"});
    let body = unavailable(
        app.post("/v1/assets/AB-1/reservations", Some(&key), &hold)
            .await,
    )
    .await;
    assert_eq!(body["write_outcome"], "UNKNOWN", "{body}");
    blocker.release().await;
    let other = app
        .post("/v1/assets/AB-2/reservations", Some(&new_key()), &hold)
        .await;
    assert_eq!(other.status(), 201);
    // The abandoned hold committed: its retry replays it (a stored 201
    // replays as 200).
    let retried = app
        .post("/v1/assets/AB-1/reservations", Some(&key), &hold)
        .await;
    assert_eq!(retried.status(), 200);
    assert!(retried.headers().get("idempotent-replayed").is_some());
    assert_eq!(
        app.count("SELECT count(*) FROM reservations WHERE asset_id = 'AB-1'")
            .await,
        1
    );
}

/// SQLite has one writer connection: a write that cannot get it within the
/// acquire timeout (another request has it and waits for the lock) answers
/// 503 NOT_APPLIED without having started, and its retry with the same key
/// runs for the first time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_write_that_never_got_the_writer_is_not_applied() {
    let Some(app) = TestApp::try_spawn_with(Backend::Sqlite, |c| {
        c.db_lock_timeout_ms = 5000;
        c.db_timeout_ms = 6000;
        c.db_acquire_timeout_ms = 300;
    })
    .await
    else {
        return;
    };
    app.create_asset("WP-1").await;
    app.create_asset("WP-2").await;
    let blocker = app.lock_asset("WP-1").await;
    let (first, second) = (json!({"buyer_id": "b1"}), json!({"buyer_id": "b2"}));
    let (first_key, second_key) = (new_key(), new_key());
    let path = "/v1/assets/WP-2/reservations";
    // Once the first hold has the writer (waiting on the lock), the second
    // waits for the writer in vain; then the lock is freed.
    let refused_then_free = async {
        eventually("the first hold has the writer", || async {
            app.metric("holdfast_db_pool_in_use").await >= 1.0
        })
        .await;
        let refused = app.post(path, Some(&second_key), &second).await;
        blocker.release().await;
        refused
    };
    let (held, refused) = tokio::join!(
        app.post("/v1/assets/WP-1/reservations", Some(&first_key), &first),
        refused_then_free
    );
    assert_eq!(held.status(), 201, "the first hold waited for the lock");
    let body = unavailable(refused).await;
    assert_eq!(body["write_outcome"], "NOT_APPLIED", "{body}");
    assert_eq!(
        app.count("SELECT count(*) FROM reservations WHERE asset_id = 'WP-2'")
            .await,
        0
    );
    let retry = app.post(path, Some(&second_key), &second).await;
    assert_eq!(retry.status(), 201, "runs for the first time");
    assert!(retry.headers().get("idempotent-replayed").is_none());
}

backend_tests!(
    ; backend:
        a_statement_stuck_behind_a_lock_is_not_applied,
);
