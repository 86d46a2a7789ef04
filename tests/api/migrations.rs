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
    let stores: Vec<Store> = join_all((0..4).map(|_| Store::open(&config)))
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
    let id = holdfast::domain::AssetId::parse("M-1").unwrap();
    assert!(stores[1]
        .create_asset(&id, "x", None)
        .await
        .unwrap()
        .is_some());
}

/// The embedded database is created, migrated once, and reopened as is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sqlite_file_is_created_and_migrated_once() {
    let dir = std::env::temp_dir().join(format!("holdfast-mig-{}", ulid::Ulid::new()));
    let url = format!("sqlite://{}", dir.join("nested/holdfast.db").display());
    let store = Store::open(&Config::with_database(url.clone()))
        .await
        .expect("open");
    store.migrate().await.expect("migrate");
    let id = holdfast::domain::AssetId::parse("M-2").unwrap();
    store.create_asset(&id, "x", None).await.unwrap();
    drop(store);
    let again = Store::open(&Config::with_database(url))
        .await
        .expect("reopen");
    again.migrate().await.expect("migrate again");
    assert!(again.get_asset(&id).await.unwrap().is_some());
    assert!(again.describe().contains(&dir.display().to_string()));
    let copy = dir.join("copy.db");
    again.backup(&copy).await.expect("backup");
    let restored = Store::open(&Config::with_database(format!(
        "sqlite://{}",
        copy.display()
    )))
    .await
    .expect("open the copy");
    assert!(restored.get_asset(&id).await.unwrap().is_some());
    let _ = std::fs::remove_dir_all(dir);
}
