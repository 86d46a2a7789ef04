//! The event feed (every event, in an order that never skips one) and the
//! webhook deliveries (due events claimed with a lease, the outcome of
//! each attempt recorded).
//!
//! PostgreSQL orders the feed by the writing transaction's id and shows
//! only events below the oldest running transaction, so that none can
//! commit later in front of a cursor. SQLite's writes are serialised, so
//! position order is commit order.

use std::time::Duration;

use diesel::sql_query;
use diesel::sql_types::{BigInt, Nullable, Text};

use super::api::{Delivery, DeliveryResult, FeedCursor, FeedPage};
use super::conn::{Bind, Conn, Sql};
use super::db::Store;
use super::error::Context;
use super::error::StoreResult;
use super::rows::{ClaimedRow, EventRow, FeedRow, EVENT_COLUMNS};
use super::schema::Instant;
use crate::domain::{Event, EventId};

/// One page of the feed (or of its dead events), oldest first.
pub(crate) async fn page(store: &Store, page: FeedPage) -> StoreResult<Vec<(FeedCursor, Event)>> {
    store
        .run("read the event feed", async move |conn| {
            let mut read = match conn {
                Conn::Pg(_) => {
                    let mut read = Sql::new(&format!(
                        "SELECT txid::text::bigint AS tx, position, {EVENT_COLUMNS} FROM events \
                         WHERE (txid, position) > ("
                    ));
                    read.bind(Bind::Text(page.after.tx.to_string()))
                        .push("::text::xid8, ")
                        .bind(Bind::BigInt(page.after.position))
                        .push(")");
                    if !page.dead {
                        read.push(" AND txid < pg_snapshot_xmin(pg_current_snapshot())");
                    }
                    read
                }
                Conn::Lite(_) => {
                    let mut read = Sql::new(&format!(
                        "SELECT 0 AS tx, position, {EVENT_COLUMNS} FROM events WHERE position > "
                    ));
                    read.bind(Bind::BigInt(page.after.position));
                    read
                }
            };
            let order = if conn.is_postgres() {
                " ORDER BY txid, position LIMIT "
            } else {
                " ORDER BY position LIMIT "
            };
            if page.dead {
                read.push(" AND dead_at IS NOT NULL");
            }
            read.push(order).bind(Bind::BigInt(page.limit));
            let rows = conn
                .load_sql::<FeedRow>(&read)
                .await
                .context("read the event feed")?;
            rows.into_iter().map(FeedRow::into_entry).collect()
        })
        .await
}

/// Claims up to `limit` due events and leases them for `lease`, in one
/// short statement (`SKIP LOCKED` on PostgreSQL, so that the dispatchers of
/// several instances share the work); delivery happens after it committed.
pub(crate) async fn claim(
    store: &Store,
    limit: i64,
    lease: Duration,
) -> StoreResult<Vec<Delivery>> {
    let rows = store
        .write_statement("claim events to deliver", async move |conn| {
            let now = conn.now().await?;
            let until =
                now + chrono::Duration::from_std(lease).unwrap_or(chrono::Duration::minutes(1));
            let lock = if conn.is_postgres() {
                " FOR UPDATE SKIP LOCKED"
            } else {
                ""
            };
            let claim = sql_query(format!(
                "UPDATE events SET attempts = attempts + 1, next_attempt_at = $1 \
                 WHERE id IN (SELECT id FROM events \
                              WHERE delivered_at IS NULL AND dead_at IS NULL \
                                AND (next_attempt_at IS NULL OR next_attempt_at <= $2) \
                              ORDER BY position LIMIT $3{lock}) \
                 RETURNING {EVENT_COLUMNS}, attempts"
            ))
            .bind::<Instant, _>(until)
            .bind::<Instant, _>(now)
            .bind::<BigInt, _>(limit);
            Ok(conn
                .load::<_, ClaimedRow>(claim)
                .await
                .context("claim events to deliver")?)
        })
        .await?
        .unwrap_or_default();
    rows.into_iter().map(ClaimedRow::into_delivery).collect()
}

/// Records what became of one delivery attempt: delivered, due again after
/// a delay, or dead.
pub(crate) async fn finish(store: &Store, id: &str, result: &DeliveryResult) -> StoreResult<()> {
    let (id, result) = (id.to_owned(), result.clone());
    store
        .write_statement("record a delivery", async move |conn| {
            let now = conn.now().await?;
            let (delivered, dead, next, error) = match result {
                DeliveryResult::Delivered => (Some(now), None, None, None),
                DeliveryResult::Failed {
                    error,
                    retry_in: Some(delay),
                } => {
                    let delay =
                        chrono::Duration::from_std(delay).unwrap_or(chrono::Duration::hours(1));
                    (None, None, Some(now + delay), Some(error))
                }
                DeliveryResult::Failed {
                    error,
                    retry_in: None,
                } => (None, Some(now), None, Some(error)),
            };
            let record = sql_query(
                "UPDATE events SET delivered_at = $1, dead_at = $2, next_attempt_at = $3, \
                     last_error = $4 WHERE id = $5",
            )
            .bind::<Nullable<Instant>, _>(delivered)
            .bind::<Nullable<Instant>, _>(dead)
            .bind::<Nullable<Instant>, _>(next)
            .bind::<Nullable<Text>, _>(error)
            .bind::<Text, _>(id);
            conn.execute(record).await.context("record a delivery")?;
            Ok(())
        })
        .await?;
    Ok(())
}

/// Schedules an event for delivery again; `None` when it does not exist.
pub(crate) async fn redeliver(store: &Store, id: &EventId) -> StoreResult<Option<Event>> {
    let id = id.to_string();
    let row = store
        .write_statement("schedule an event again", async move |conn| {
            let again = sql_query(format!(
                "UPDATE events SET delivered_at = NULL, dead_at = NULL, attempts = 0, \
                     next_attempt_at = NULL, last_error = NULL \
                 WHERE id = $1 RETURNING {EVENT_COLUMNS}"
            ))
            .bind::<Text, _>(id);
            Ok(conn
                .optional::<_, EventRow>(again)
                .await
                .context("schedule an event again")?)
        })
        .await?
        .flatten();
    row.map(EventRow::into_event).transpose()
}

/// What the janitor deletes once it is past its retention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Purge {
    /// Stored answers of idempotency keys.
    Keys,
    /// Delivered events.
    Events,
}

impl Purge {
    pub(crate) fn context(self) -> &'static str {
        match self {
            Purge::Keys => "purge idempotency records",
            Purge::Events => "purge delivered events",
        }
    }
}

/// Deletes up to `limit` rows of `what` older than `retention`, oldest
/// first, in one statement that reads a range of an index (creation times
/// for stored answers, ids for events; `SKIP LOCKED` on PostgreSQL); how
/// many.
pub(crate) async fn purge(
    store: &Store,
    what: Purge,
    limit: i64,
    retention: Duration,
) -> StoreResult<u64> {
    let Ok(age) = chrono::Duration::from_std(retention) else {
        // A retention too long to count back from keeps every row.
        return Ok(0);
    };
    let purged = store
        .write_statement(what.context(), async move |conn| {
            let now = conn.now().await?;
            let Some(before) = now.checked_sub_signed(age) else {
                return Ok(0);
            };
            let lock = if conn.is_postgres() {
                " FOR UPDATE SKIP LOCKED"
            } else {
                ""
            };
            let mut delete = match what {
                Purge::Keys => {
                    let mut delete = Sql::new(
                        "DELETE FROM idempotency_keys WHERE (client, key) IN ( \
                         SELECT client, key FROM idempotency_keys WHERE created_at < ",
                    );
                    delete.bind(Bind::At(before)).push(" ORDER BY created_at");
                    delete
                }
                // An event's id is made at its creation (`EventId::at`): the
                // ids before the cutoff's are the oldest events, a range of
                // the primary key, so that no index of creation times is
                // written by every event.
                Purge::Events => {
                    let mut delete = Sql::new(
                        "DELETE FROM events WHERE id IN (SELECT id FROM events WHERE id < ",
                    );
                    delete
                        .bind(Bind::Text(EventId::floor(before).to_string()))
                        .push(" AND created_at < ")
                        .bind(Bind::At(before))
                        .push(" AND delivered_at IS NOT NULL ORDER BY id");
                    delete
                }
            };
            delete
                .push(" LIMIT ")
                .bind(Bind::BigInt(limit))
                .push(lock)
                .push(")");
            Ok(conn.execute_sql(&delete).await.context(what.context())?)
        })
        .await?
        .unwrap_or_default();
    Ok(purged as u64)
}
