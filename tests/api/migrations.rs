use futures_util::future::join_all;
use holdfast::{Config, Store};

use crate::helpers::EmptyPgDatabase;

/// Instances starting together serialise their migrations on an advisory lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_starting_at_once_migrate_safely() {
    let Some(db) = EmptyPgDatabase::create().await else {
        return;
    };
    let config = Config::with_database(db.url.clone());
    let stores: Vec<Store> = join_all((0..4).map(|_| config.open_store()))
        .await
        .into_iter()
        .map(|s| s.expect("open"))
        .collect();
    let results = join_all(stores.iter().map(Store::migrate)).await;
    for result in results {
        result.expect("every instance migrates without error");
    }
    // The schema is usable and migrating again is a no-op.
    stores[0].migrate().await.expect("migrate again");
    stores[0].ping().await.expect("ping");
    assert!(stores[1]
        .create_asset(&new_asset("M-1"))
        .await
        .unwrap()
        .is_some());
}

/// An asset named `x`, with nothing else.
fn new_asset(id: &str) -> holdfast::store::NewAsset {
    holdfast::store::NewAsset {
        id: holdfast::domain::AssetId::parse(id).unwrap(),
        name: "x".into(),
        price: None,
        attributes: Default::default(),
        available_from: None,
    }
}

/// The embedded database is created, migrated once, and reopened as is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sqlite_file_is_created_and_migrated_once() {
    let dir = std::env::temp_dir().join(format!("holdfast-mig-{}", ulid::Ulid::new()));
    let url = format!("sqlite://{}", dir.join("nested/holdfast.db").display());
    let store = Config::with_database(url.clone())
        .open_store()
        .await
        .expect("open");
    store.migrate().await.expect("migrate");
    let asset = new_asset("M-2");
    store.create_asset(&asset).await.unwrap();
    let id = asset.id;
    drop(store);
    let again = Config::with_database(url)
        .open_store()
        .await
        .expect("reopen");
    again.migrate().await.expect("migrate again");
    assert!(again.get_asset(&id).await.unwrap().is_some());
    assert!(again.describe().contains(&dir.display().to_string()));
    let copy = dir.join("copy.db");
    again.backup(&copy).await.expect("backup");
    let restored = Config::with_database(format!("sqlite://{}", copy.display()))
        .open_store()
        .await
        .expect("open the copy");
    assert!(restored.get_asset(&id).await.unwrap().is_some());
    let _ = std::fs::remove_dir_all(dir);
}

/// History written before each payment had one fate: a payment kept and
/// refunded, another refunded twice. The migration keeps every refund,
/// records each reference's earliest fate, and the audit lists the older
/// conflicts as history without failing; the service starts on it, serves
/// the old refunds and applies the rule from then on.
const HISTORY: &str = "
INSERT INTO assets (id, name, status, current_reservation_id, version, last_event_sequence, created_at, updated_at)
VALUES ('H-A', 'a', 'SOLD', 'res_01HZX49R8T39QK6G7Y1W2V3N4A', 3, 0, '2026-11-01T10:00:00.000000Z', '2026-11-01T10:00:00.000000Z'),
       ('H-B', 'b', 'AVAILABLE', NULL, 3, 0, '2026-11-01T10:00:00.000000Z', '2026-11-01T10:00:00.000000Z'),
       ('H-C', 'c', 'AVAILABLE', NULL, 3, 0, '2026-11-01T10:00:00.000000Z', '2026-11-01T10:00:00.000000Z'),
       ('H-D', 'd', 'AVAILABLE', NULL, 3, 0, '2026-11-01T10:00:00.000000Z', '2026-11-01T10:00:00.000000Z');
INSERT INTO reservations (id, asset_id, buyer_id, status, expires_at, created_at, committed_at, released_at, payment_reference, owner)
VALUES ('res_01HZX49R8T39QK6G7Y1W2V3N4A', 'H-A', 'b', 'COMMITTED', '2026-11-01T10:10:00.000000Z', '2026-11-01T10:00:00.000000Z', '2026-11-01T10:01:00.000000Z', NULL, 'pay-kept-and-refunded', '-'),
       ('res_01HZX49R8T39QK6G7Y1W2V3N4B', 'H-B', 'b', 'RELEASED', '2026-11-01T10:10:00.000000Z', '2026-11-01T10:00:00.000000Z', NULL, '2026-11-01T10:01:00.000000Z', NULL, '-'),
       ('res_01HZX49R8T39QK6G7Y1W2V3N4C', 'H-C', 'b', 'RELEASED', '2026-11-01T10:10:00.000000Z', '2026-11-01T10:00:00.000000Z', NULL, '2026-11-01T10:01:00.000000Z', NULL, '-'),
       ('res_01HZX49R8T39QK6G7Y1W2V3N4D', 'H-D', 'b', 'RELEASED', '2026-11-01T10:10:00.000000Z', '2026-11-01T10:00:00.000000Z', NULL, '2026-11-01T10:01:00.000000Z', NULL, '-');
INSERT INTO refunds (id, reservation_id, asset_id, payment_reference, reason, status, created_at, completed_at)
VALUES ('rf_01HZX4B2Q7C3M9D8E6F5G4H3JB', 'res_01HZX49R8T39QK6G7Y1W2V3N4B', 'H-B', 'pay-kept-and-refunded', 'RESERVATION_RELEASED', 'REQUESTED', '2026-11-01T10:02:00.000000Z', NULL),
       ('rf_01HZX4B2Q7C3M9D8E6F5G4H3JC', 'res_01HZX49R8T39QK6G7Y1W2V3N4C', 'H-C', 'pay-twice', 'RESERVATION_RELEASED', 'REQUESTED', '2026-11-01T10:02:00.000000Z', NULL),
       ('rf_01HZX4B2Q7C3M9D8E6F5G4H3JD', 'res_01HZX49R8T39QK6G7Y1W2V3N4D', 'H-D', 'pay-twice', 'RESERVATION_RELEASED', 'COMPLETED', '2026-11-01T10:03:00.000000Z', '2026-11-01T10:04:00.000000Z');
";

/// Migrations before the one-fate rule (the first four).
const BEFORE_ONE_FATE: usize = 4;

async fn history_survives_the_one_fate_migration(url: String) {
    use diesel_migrations::MigrationHarness;
    if url.starts_with("postgres") {
        let url = url.clone();
        tokio::task::spawn_blocking(move || {
            use diesel::connection::SimpleConnection;
            use diesel_async::async_connection_wrapper::AsyncConnectionWrapper;
            use diesel_async::AsyncPgConnection;
            let mut conn =
                <AsyncConnectionWrapper<AsyncPgConnection> as diesel::Connection>::establish(&url)
                    .unwrap();
            let migrations = diesel::migration::MigrationSource::<diesel::pg::Pg>::migrations(
                &holdfast::store::postgres::MIGRATIONS,
            )
            .unwrap();
            diesel::migration::MigrationConnection::setup(&mut conn).unwrap();
            for migration in &migrations[..BEFORE_ONE_FATE] {
                conn.run_migration(&**migration).unwrap();
            }
            conn.batch_execute(HISTORY).unwrap();
        })
        .await
        .unwrap();
    } else {
        use diesel::connection::SimpleConnection;
        use diesel::Connection;
        let path = url.trim_start_matches("sqlite://");
        let mut conn = diesel::SqliteConnection::establish(path).unwrap();
        let migrations = diesel::migration::MigrationSource::<diesel::sqlite::Sqlite>::migrations(
            &holdfast::store::sqlite::MIGRATIONS,
        )
        .unwrap();
        diesel::migration::MigrationConnection::setup(&mut conn).unwrap();
        for migration in &migrations[..BEFORE_ONE_FATE] {
            conn.run_migration(&**migration).unwrap();
        }
        conn.batch_execute(HISTORY).unwrap();
    }
    // The service starts on it, migrating as it does in production, and serves.
    let mut config = Config::with_database(url.clone());
    config.bind = "127.0.0.1:0".parse().unwrap();
    let app = holdfast::Application::build(config, true)
        .await
        .expect("the service starts on history");
    let address = format!("http://127.0.0.1:{}", app.port());
    let store = app.store().clone();
    let server = tokio::spawn(app.run_until_stopped());
    let payment: serde_json::Value = reqwest::get(format!("{address}/v1/payments/pay-twice"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        payment["refund"]["refund_id"], "rf_01HZX4B2Q7C3M9D8E6F5G4H3JC",
        "{payment}"
    );
    // Every refund from before is still there: they are money records.
    let refunds: serde_json::Value = reqwest::get(format!("{address}/v1/refunds?limit=500"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ids: Vec<&str> = refunds["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["refund_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        [
            "rf_01HZX4B2Q7C3M9D8E6F5G4H3JB",
            "rf_01HZX4B2Q7C3M9D8E6F5G4H3JC",
            "rf_01HZX4B2Q7C3M9D8E6F5G4H3JD"
        ],
        "{refunds}"
    );
    server.abort();
    let findings = store
        .audit(chrono::DateTime::UNIX_EPOCH, &|_, _| {})
        .await
        .unwrap();
    let finding = |name: &str| {
        findings
            .iter()
            .find(|f| f.name == name)
            .unwrap_or_else(|| panic!("{name}"))
            .clone()
    };
    let history = finding("payment_fates_before_scopes");
    assert!(history.history);
    assert_eq!(history.violations, 2, "{findings:#?}");
    assert_eq!(
        history.examples,
        ["pay-kept-and-refunded", "pay-twice"],
        "{findings:#?}"
    );
    for f in findings.iter().filter(|f| !f.history) {
        if f.name.starts_with("payment") {
            assert_eq!(f.violations, 0, "{f:#?}");
        }
    }
    // Both old refunds of pay-twice are still there.
    let reference = holdfast::domain::PaymentReference::parse("pay-twice").unwrap();
    let fates = store.payments(Some("psp"), &reference).await.unwrap();
    assert_eq!(fates.len(), 1, "the earliest fate, visible to every client");
    assert_eq!(
        fates[0].1.refund.as_ref().unwrap().refund_id,
        "rf_01HZX4B2Q7C3M9D8E6F5G4H3JC"
    );
    let kept = holdfast::domain::PaymentReference::parse("pay-kept-and-refunded").unwrap();
    let fates = store.payments(None, &kept).await.unwrap();
    assert_eq!(fates[0].1.fate, holdfast::domain::PaymentOutcome::Bought);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_survives_the_one_fate_migration_on_postgres() {
    let Some(db) = EmptyPgDatabase::create().await else {
        return;
    };
    history_survives_the_one_fate_migration(db.url.clone()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_survives_the_one_fate_migration_on_sqlite() {
    let dir = std::env::temp_dir().join(format!("holdfast-hist-{}", ulid::Ulid::new()));
    std::fs::create_dir_all(&dir).unwrap();
    history_survives_the_one_fate_migration(format!("sqlite://{}", dir.join("h.db").display()))
        .await;
    let _ = std::fs::remove_dir_all(dir);
}

/// SQLite's readers keep small page caches, so that a pool of them does not
/// grow the server as their caches fill over a long run; the writer keeps
/// SQLite's default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_readers_keep_small_page_caches() {
    let dir = std::env::temp_dir().join(format!("holdfast-cache-{}", ulid::Ulid::new()));
    let url = format!("sqlite://{}", dir.join("c.db").display());
    let store = Config::with_database(url).open_store().await.unwrap();
    let Some(sqlite) = store.sqlite() else {
        panic!("an SQLite store")
    };
    assert_eq!(sqlite.page_caches().await.unwrap(), (256, 2000));
    let _ = std::fs::remove_dir_all(dir);
}

/// SQLite syncs every commit to disk by default (an answered write survives
/// power loss); NORMAL only when asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_is_durable_at_every_commit_by_default() {
    use holdfast::store::SqliteSynchronous;
    let dir = std::env::temp_dir().join(format!("holdfast-sync-{}", ulid::Ulid::new()));
    let url = format!("sqlite://{}", dir.join("s.db").display());
    for (setting, pragma, word) in [
        (None, 2, "FULL"),
        (Some(SqliteSynchronous::Normal), 1, "NORMAL"),
        (Some(SqliteSynchronous::Full), 2, "FULL"),
    ] {
        let mut config = Config::with_database(url.clone());
        if let Some(setting) = setting {
            config.sqlite_synchronous = setting;
        }
        let store = config.open_store().await.unwrap();
        let Some(sqlite) = store.sqlite() else {
            panic!("an SQLite store")
        };
        assert_eq!(sqlite.synchronous().await.unwrap(), pragma, "{setting:?}");
        assert!(store.describe().contains(word), "{}", store.describe());
    }
    let _ = std::fs::remove_dir_all(dir);
}
