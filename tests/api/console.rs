//! The operator console's data: the counts per status it shows.

use serde_json::json;

use crate::backend_tests;
use crate::helpers::{new_key as idempotency_key, TestApp};

/// Counts by effective status: a lapsed hold counts as AVAILABLE before any
/// sweep, every status is present, and the counts agree with the list.
async fn counts_follow_the_effective_status(app: TestApp) {
    let empty = app.get_json("/v1/asset-counts").await;
    assert_eq!(
        empty,
        json!({"counts": {"AVAILABLE": 0, "HELD": 0, "SOLD": 0}})
    );
    for id in ["C-1", "C-2", "C-3", "C-4", "C-5"] {
        app.create_asset(id).await;
    }
    app.hold("C-1", "buyer-1", 600).await;
    let sold = app.hold("C-2", "buyer-2", 600).await;
    let commit = app
        .commit(
            sold["reservation_id"].as_str().unwrap(),
            &idempotency_key(),
            "pay-c2",
        )
        .await;
    assert_eq!(commit.status(), 200);
    // A one-second hold on C-3 lapses; no janitor runs in tests.
    app.hold("C-3", "buyer-3", 1).await;
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let counts = app.get_json("/v1/asset-counts").await;
    assert_eq!(
        counts,
        json!({"counts": {"AVAILABLE": 3, "HELD": 1, "SOLD": 1}})
    );
    for status in ["AVAILABLE", "HELD", "SOLD"] {
        let page = app
            .get_json(&format!("/v1/assets?status={status}&limit=500"))
            .await;
        assert_eq!(
            page["items"].as_array().unwrap().len() as i64,
            counts["counts"][status].as_i64().unwrap(),
            "{status}: the count agrees with the list"
        );
    }
}

backend_tests!(counts_follow_the_effective_status);
