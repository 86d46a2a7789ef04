//! The janitor: every interval, one sweep (expire lapsed holds, purge old
//! idempotency records). Safe with several instances: batches are taken with
//! `FOR UPDATE SKIP LOCKED`.

use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::store::{Store, StoreResult, SweepReport};

pub struct Janitor {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Janitor {
    pub fn start(store: Store, every: Duration) -> Self {
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut ticker = tokio::time::interval(every);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = ticker.tick() => {}
                    _ = stopped.changed() => break,
                }
                // A pass in progress finishes before a stop is noticed.
                if let Err(e) = run_once(&store).await {
                    tracing::warn!(error = %e, "janitor pass failed; retrying next interval");
                }
            }
        });
        Self { stop, task }
    }

    /// Lets the current pass finish, then ends the task.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// One janitor pass.
pub async fn run_once(store: &Store) -> StoreResult<SweepReport> {
    let report = store.sweep().await?;
    if report.expired > 0 || report.purged_keys > 0 {
        tracing::info!(
            expired = report.expired,
            purged_keys = report.purged_keys,
            "janitor pass"
        );
    }
    Ok(report)
}
