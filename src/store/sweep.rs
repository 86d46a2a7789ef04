//! The janitor's pass: lapsed holds expired batch by batch, the asset
//! counts' changes folded in, then stored answers and delivered events past
//! their retention purged, each batch its own short call within the call
//! timeout. Holds that lapse while a long purge runs are expired between its
//! batches, and a pass asked to stop ends after the batch under way.

use std::time::{Duration, Instant};

use diesel::sql_query;

use super::api::SweepReport;
use super::db::Store;
use super::error::{Context, StoreResult};
use super::feed::{purge, Purge};
use super::tx::expire::{expire_lapsed, Lapsed};

/// How often a long purge says how far it got.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// One pass, going on while `go_on` says so.
pub(crate) async fn pass(
    store: &Store,
    go_on: &(dyn Fn() -> bool + Sync),
) -> StoreResult<SweepReport> {
    let settings = store.settings();
    let batch = settings.sweep_batch.max(1);
    let mut report = SweepReport {
        expired: expire_all(store, batch, go_on).await?,
        ..SweepReport::default()
    };
    fold_counts(store).await?;
    let mut purges = vec![(Purge::Keys, settings.idempotency_retention)];
    if let Some(retention) = settings.event_retention {
        purges.push((Purge::Events, retention));
    }
    for (what, retention) in purges {
        let (mut purged, mut said) = (0, Instant::now());
        while go_on() {
            let done = store
                .bounded(what.context(), purge(store, what, batch, retention))
                .await?;
            purged += done;
            // Holds that lapsed meanwhile do not wait for the purge to end.
            report.expired += expire_all(store, batch, go_on).await?;
            if done < batch as u64 {
                break;
            }
            if said.elapsed() >= PROGRESS_EVERY {
                tracing::info!(purged, what = what.context(), "purging");
                said = Instant::now();
            }
        }
        match what {
            Purge::Keys => report.purged_keys = purged,
            Purge::Events => report.purged_events = purged,
        }
    }
    Ok(report)
}

/// Expires lapsed holds, batch after batch until one comes back short (or
/// the pass is asked to stop); how many.
async fn expire_all(
    store: &Store,
    batch: i64,
    go_on: &(dyn Fn() -> bool + Sync),
) -> StoreResult<u64> {
    let mut expired = 0;
    while go_on() {
        let done = expire_batch(store, batch).await?;
        expired += done;
        if done < batch as u64 {
            break;
        }
    }
    Ok(expired)
}

/// Expires up to `batch` lapsed holds in one transaction; how many.
async fn expire_batch(store: &Store, batch: i64) -> StoreResult<u64> {
    let policy = *store.policy();
    let expire = store.write("expire lapsed holds", async move |conn| {
        let now = conn.now().await?;
        Ok(expire_lapsed(conn, Lapsed::Any(batch), now, &policy).await?)
    });
    let expired = store.bounded("expire lapsed holds", expire).await?;
    Ok(expired.unwrap_or_default() as u64)
}

/// Folds the logged changes of the asset counts into the counts, in one
/// statement (PostgreSQL; SQLite's triggers change the counts directly).
/// Changes logged by transactions still under way stay for the next pass.
async fn fold_counts(store: &Store) -> StoreResult<()> {
    if store.postgres().is_none() {
        return Ok(());
    }
    let fold = store.write_statement("fold the asset counts", async |conn| {
        let fold = sql_query(
            "WITH folded AS (DELETE FROM asset_count_changes RETURNING status, delta), \
                  s AS (SELECT status, sum(delta) AS n FROM folded GROUP BY status) \
             UPDATE asset_counts c SET n = c.n + s.n FROM s WHERE c.status = s.status",
        );
        conn.execute(fold).await.context("fold the asset counts")?;
        Ok(())
    });
    store.bounded("fold the asset counts", fold).await?;
    Ok(())
}
