//! The janitor: every interval, one sweep (expire lapsed holds, purge old
//! idempotency records and, when configured, old delivered events). Safe with
//! several instances: batches are taken with `FOR UPDATE SKIP LOCKED`.

use std::time::Duration;

use crate::store::{Store, StoreResult, SweepReport};
use crate::worker::{Running, Worker};

pub fn start(store: Store, every: Duration) -> Worker {
    Worker::start("janitor", every, move |running: Running| {
        let store = store.clone();
        async move {
            let going = move || running.going();
            run_while(&store, &going)
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        }
    })
}

/// One janitor pass.
pub async fn run_once(store: &Store) -> StoreResult<SweepReport> {
    run_while(store, &|| true).await
}

/// One janitor pass, ended after the batch under way once `go_on` says no.
pub async fn run_while(
    store: &Store,
    go_on: &(dyn Fn() -> bool + Sync),
) -> StoreResult<SweepReport> {
    let result = store.sweep_while(go_on).await;
    let outcome = if result.is_ok() { "ok" } else { "error" };
    metrics::counter!("holdfast_janitor_runs_total", "result" => outcome).increment(1);
    let report = result?;
    metrics::counter!("holdfast_janitor_expired_total").increment(report.expired);
    if report != SweepReport::default() {
        tracing::info!(
            expired = report.expired,
            purged_keys = report.purged_keys,
            purged_events = report.purged_events,
            "janitor pass"
        );
    }
    Ok(report)
}
