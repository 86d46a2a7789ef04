//! Backups restore: a copy taken under load comes back whole, with every
//! reservation acknowledged before the copy began; the event feed goes on.

use std::collections::BTreeSet;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use holdfast::{Application, Config};
use serde_json::{json, Value};

use crate::helpers::{eventually, new_key, Backend, EmptyPgDatabase, TestApp};

fn holdfast(args: &[&str], database_url: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_holdfast"))
        .args(args)
        .env("HOLDFAST_DATABASE_URL", database_url)
        .output()
        .expect("holdfast runs")
}

/// Holds and sells on many assets from several clients until told to stop,
/// recording every reservation whose hold or sale was acknowledged.
async fn load(
    app: Arc<TestApp>,
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<(String, &'static str)>>>,
) {
    let mut workers = Vec::new();
    for w in 0..6 {
        let (app, stop, acked) = (app.clone(), stop.clone(), acked.clone());
        workers.push(tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                let asset = format!("BK-{w}-{i}");
                i += 1;
                let created = app
                    .post("/v1/assets", None, &json!({"id": asset, "name": "x"}))
                    .await;
                if created.status() != 201 {
                    continue;
                }
                let held = app
                    .post(
                        &format!("/v1/assets/{asset}/reservations"),
                        Some(&new_key()),
                        &json!({"buyer_id": format!("b{w}")}),
                    )
                    .await;
                if held.status() != 201 {
                    continue;
                }
                let body: Value = held.json().await.unwrap();
                let id = body["reservation_id"].as_str().unwrap().to_owned();
                acked.lock().unwrap().push((id.clone(), "HELD"));
                if i % 2 == 0 {
                    let sold = app.commit(&id, &new_key(), &format!("pay-{id}")).await;
                    if sold.status() == 200 {
                        acked.lock().unwrap().push((id, "COMMITTED"));
                    }
                }
            }
        }));
    }
    for worker in workers {
        worker.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sqlite_backup_taken_under_load_restores_whole() {
    let Some(app) = TestApp::try_spawn(Backend::Sqlite).await else {
        return;
    };
    let app = Arc::new(app);
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(Vec::new()));
    let running = tokio::spawn(load(app.clone(), stop.clone(), acked.clone()));
    eventually("the load acknowledged some writes", || async {
        acked.lock().unwrap().len() > 10
    })
    .await;
    // Everything acknowledged before the backup begins must be in it.
    let before: Vec<(String, &str)> = acked.lock().unwrap().clone();
    assert!(before.len() > 10, "load ran: {}", before.len());
    let dir = std::env::temp_dir().join(format!("holdfast-backup-{}", ulid::Ulid::new()));
    std::fs::create_dir_all(&dir).unwrap();
    let copy = dir.join("copy.db");
    let url = app.database_url().to_owned();
    let copy_arg = copy.display().to_string();
    let backup = tokio::task::spawn_blocking(move || holdfast(&["backup", &copy_arg], &url))
        .await
        .unwrap();
    assert!(
        backup.status.success(),
        "{}",
        String::from_utf8_lossy(&backup.stderr)
    );
    stop.store(true, Ordering::SeqCst);
    running.await.unwrap();

    // Restore into a database that has a stale write-ahead log beside it.
    let target = dir.join("restored.db");
    std::fs::write(dir.join("restored.db-wal"), b"stale log of another life").unwrap();
    let target_url = format!("sqlite://{}", target.display());
    let restored = holdfast(&["restore", &copy.display().to_string()], &target_url);
    assert!(
        restored.status.success(),
        "{}",
        String::from_utf8_lossy(&restored.stderr)
    );
    assert!(!dir.join("restored.db-wal").exists());

    let audit = holdfast(&["audit", "--json"], &target_url);
    let doc: Value = serde_json::from_slice(&audit.stdout).unwrap();
    assert_eq!(doc["ok"], true, "{doc:#}");
    let store = Config::with_database(target_url.clone())
        .open_store()
        .await
        .unwrap();
    let mut missing = BTreeSet::new();
    for (id, status) in &before {
        let rid = holdfast::domain::ReservationId::parse(id).unwrap();
        match store
            .get_reservation(&rid, &holdfast::store::Client::seeing_all("-"))
            .await
            .unwrap()
        {
            Some(r) if *status == "COMMITTED" && r.status.as_str() != "COMMITTED" => {
                missing.insert(format!("{id} {status} is {}", r.status));
            }
            Some(_) => {}
            None => {
                missing.insert(format!("{id} {status}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "acknowledged but not restored: {missing:?}"
    );

    // A damaged file or another database is refused, the target untouched.
    let damaged = dir.join("damaged.db");
    let mut bytes = std::fs::read(&copy).unwrap();
    let half = bytes.len() / 2;
    bytes.truncate(half);
    std::fs::write(&damaged, &bytes).unwrap();
    let refused = holdfast(&["restore", &damaged.display().to_string()], &target_url);
    assert!(!refused.status.success());
    let stranger = dir.join("stranger.db");
    {
        use diesel::connection::SimpleConnection;
        use diesel::Connection;
        let mut c = diesel::SqliteConnection::establish(&stranger.display().to_string()).unwrap();
        c.batch_execute("CREATE TABLE t (x INTEGER)").unwrap();
    }
    let refused = holdfast(&["restore", &stranger.display().to_string()], &target_url);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("not a holdfast database"));
    let audit = holdfast(&["audit", "--json"], &target_url);
    assert!(
        audit.status.success(),
        "the restored database is still there"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// The feed page at `url` once it holds at least `want` events. PostgreSQL's
/// feed shows an event only when no older transaction of the cluster still
/// runs, and other tests share the cluster: their open transactions may hold
/// the feed back for a moment.
async fn feed_page(client: &reqwest::Client, url: &str, want: usize) -> Value {
    let mut page = Value::Null;
    for _ in 0..300 {
        page = client.get(url).send().await.unwrap().json().await.unwrap();
        if page["items"].as_array().unwrap().len() >= want {
            return page;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("fewer than {want} events at {url} after 30 s: {page}");
}

fn pg_tool(tool: &str, args: &[&str]) {
    let output = Command::new(tool).args(args).output().expect(tool);
    assert!(
        output.status.success(),
        "{tool}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A logical backup (`pg_dump`) restored into the same cluster: the service
/// starts on it, the audit passes, and a poller resuming from its cursor
/// receives what comes next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pg_dump_restores_and_the_feed_goes_on() {
    let Some(app) = TestApp::try_spawn(Backend::Postgres).await else {
        return;
    };
    for i in 0..3 {
        app.create_asset(&format!("PD-{i}")).await;
        let held = app.hold(&format!("PD-{i}"), "b", 300).await;
        if i == 0 {
            let id = held["reservation_id"].as_str().unwrap();
            assert_eq!(app.commit(id, &new_key(), "pay-pd").await.status(), 200);
        }
    }
    // The poller has received all four events: its cursor is past them.
    let page = feed_page(&app.client, &app.url("/v1/events"), 4).await;
    assert_eq!(page["items"].as_array().unwrap().len(), 4, "{page}");
    let cursor = page["next_cursor"].as_str().unwrap().to_owned();
    let dump = std::env::temp_dir().join(format!("holdfast-{}.dump", ulid::Ulid::new()));
    pg_tool(
        "pg_dump",
        &["-Fc", "-f", &dump.display().to_string(), app.database_url()],
    );
    let Some(fresh) = EmptyPgDatabase::create().await else {
        return;
    };
    pg_tool(
        "pg_restore",
        &["--no-owner", "-d", &fresh.url, &dump.display().to_string()],
    );
    let _ = std::fs::remove_file(&dump);
    let mut config = Config::with_database(fresh.url.clone());
    config.bind = "127.0.0.1:0".parse().unwrap();
    config.janitor_interval_seconds = 0;
    let restored = Application::build(config, true)
        .await
        .expect("starts on the restored copy");
    let base = format!("http://127.0.0.1:{}", restored.port());
    let store = restored.store().clone();
    tokio::spawn(restored.run_until_stopped());
    let client = reqwest::Client::new();
    let findings = store
        .audit(chrono::DateTime::UNIX_EPOCH, &|_, _| {})
        .await
        .unwrap();
    assert!(findings.iter().all(|f| f.violations == 0), "{findings:#?}");
    let sold: Value = client
        .get(format!("{base}/v1/payments/pay-pd"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(sold["fate"], "BOUGHT");
    let held: Value = client
        .post(format!("{base}/v1/assets/PD-2/reservations"))
        .header("Idempotency-Key", new_key())
        .json(&json!({"buyer_id": "c"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        held["error_code"], "ASSET_UNAVAILABLE",
        "the hold came back too"
    );
    client
        .post(format!("{base}/v1/assets"))
        .json(&json!({"id": "PD-new", "name": "n"}))
        .send()
        .await
        .unwrap();
    client
        .post(format!("{base}/v1/assets/PD-new/reservations"))
        .header("Idempotency-Key", new_key())
        .json(&json!({"buyer_id": "c"}))
        .send()
        .await
        .unwrap();
    let page = feed_page(&client, &format!("{base}/v1/events?after={cursor}"), 1).await;
    let assets: Vec<&str> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["asset_id"].as_str().unwrap())
        .collect();
    assert_eq!(assets, ["PD-new"], "{page}");
}

/// A dump restored into a cluster whose transaction counter is behind the
/// events' ids would hide every new event from pollers: holdfast refuses to
/// start and says what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_feed_ahead_of_the_cluster_refuses_to_start() {
    let Some(app) = TestApp::try_spawn(Backend::Postgres).await else {
        return;
    };
    app.create_asset("PA-1").await;
    app.hold("PA-1", "b", 300).await;
    // What a restore from a busier cluster looks like: ids far ahead.
    app.sql(
        "UPDATE events SET txid = \
         (pg_snapshot_xmax(pg_current_snapshot())::text::bigint + 5000000000)::text::xid8",
    )
    .await;
    let mut config = Config::with_database(app.database_url().to_owned());
    config.bind = "127.0.0.1:0".parse().unwrap();
    let error = match Application::build(config, true).await {
        Ok(_) => panic!("started on a feed ahead of the cluster"),
        Err(e) => holdfast::http::error::error_chain(&e),
    };
    assert!(error.contains("pg_resetwal -e 1 -x"), "{error}");
    assert!(error.contains("pg_basebackup"), "{error}");
}
