//! PostgreSQL: diesel-async over a bounded deadpool pool, no libpq. Time is
//! `now()` of the database. What only PostgreSQL does lives here: the hold
//! and the sale of a live hold as single statements, the coalesced first read
//! of concurrent holds, the event feed by transaction id, and the delivery
//! claims with `SKIP LOCKED`; every other statement is shared
//! ([`super::statements::pg`]).

use std::sync::Arc;
use std::time::Duration;

use deadpool::managed::{Hook, HookError, Metrics};
use diesel::connection::CacheSize;
use diesel::pg::Pg;
use diesel::prelude::*;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::sql_query;
use diesel::sql_types::{Array, BigInt, Double, Integer, Nullable, Text, Timestamptz};
use diesel_async::async_connection_wrapper::AsyncConnectionWrapper;
use diesel_async::pooled_connection::deadpool::{Object, Pool};
use diesel_async::pooled_connection::{
    AsyncDieselConnectionManager, ManagerConfig, RecyclingMethod,
};
use diesel_async::{
    AnsiTransactionManager, AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection,
    TransactionManager,
};
use diesel_migrations::{embed_migrations, EmbeddedMigrations, MigrationHarness};
use futures_util::FutureExt;

use super::coalesce::{Coalescer, Gather};
use super::error::{Abort, Context};
use super::flow::{
    expired_event, Assemble, Backend, Change, Changed, Claim, Fates, HoldDraft, PaymentKey, Purge,
    Snapshot, Target,
};
use super::outcome::write_alone;
use super::plans::Replans;
use super::rows::{
    asset_snapshot, Claimed, ClaimedRow, Ended, FeedRow, HoldSnapshotRow, KeySnapshotRow, NewEvent,
    NowAssetRow, ReservationSnapshotRow, TransitionRow, EVENT_COLUMNS,
};
use super::statements::pg as shared;
use super::{
    CompleteRefundRequest, Delivery, DeliveryResult, FeedCursor, FeedPage, HoldRequest,
    Idempotency, PoolStatus, Reply, StoreError, StoreResult, StoreSettings, WriteOutcome,
};
use crate::domain::{
    Asset, AssetId, Event, HoldTarget, Refund, Reservation, ReservationId, Timestamp,
};

pub const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/postgres");

/// Serialises migrations of instances that start at the same time.
const MIGRATION_LOCK: i64 = 0x686f_6c64_6661_7374; // "holdfast"

type Conn = Object<AsyncPgConnection>;

/// A raw statement whose text never changes, so that PostgreSQL may keep it
/// prepared on each connection (diesel never caches `sql_query` by itself:
/// it cannot know the text is fixed). Used for the statements on hot paths.
///
/// PostgreSQL chooses, per statement, between planning each execution and
/// a generic plan kept with the statement (`plan_cache_mode = auto`): the
/// hot statements are index lookups whose generic plan costs what a
/// custom one does, so after five executions they skip planning, which was
/// most of their cost. A generic plan is made again whenever ANALYZE
/// updates the statistics of a table it reads, so it follows the tables'
/// growth.
struct Prepared<Q>(Q);

impl<Q: QueryFragment<Pg>> QueryFragment<Pg> for Prepared<Q> {
    fn walk_ast<'b>(&'b self, pass: AstPass<'_, 'b, Pg>) -> diesel::QueryResult<()> {
        self.0.walk_ast(pass)
    }

    fn is_safe_to_cache_prepared(&self, _: &Pg) -> diesel::QueryResult<bool> {
        Ok(true)
    }
}

impl<Q> QueryId for Prepared<Q> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<Q: Query> Query for Prepared<Q> {
    type SqlType = Q::SqlType;
}

#[derive(Clone)]
pub struct PgStore {
    db: Sessions,
    /// Hold snapshots of concurrent requests, read together.
    snapshots: Arc<Coalescer<SnapshotInput, HoldSnapshotRow>>,
    url: String,
    settings: StoreSettings,
}

/// The pool, and how a unit of work reaches the server through it.
///
/// Directly, a connection is a session: its timeouts are set once when it
/// opens, and its statements stay prepared. Behind a pooler in transaction
/// mode (PgBouncer), a session lasts one transaction, after which the
/// pooler may hand the server connection to another client: every unit of
/// work is then a transaction of its own that sets its timeouts with
/// `SET LOCAL`, and no prepared statement outlives it.
#[derive(Clone)]
pub(crate) struct Sessions {
    pool: Pool<AsyncPgConnection>,
    /// What opens a transaction, in one round trip: `BEGIN`, and behind a
    /// pooler the transaction's own timeouts.
    begin: Arc<str>,
    pooled: bool,
}

impl Sessions {
    fn open(url: &str, settings: &StoreSettings) -> StoreResult<Self> {
        let statement_ms = settings.statement_timeout.as_millis();
        let lock_ms = settings.lock_timeout.as_millis();
        let idle_ms = statement_ms.max(1000) * 2;
        let pooled = !settings.pg_prepared_statements;
        let mut config = ManagerConfig::default();
        // A broken connection is noticed by its first failing query (503 once)
        // and then discarded; no test query per checkout.
        config.recycling_method = RecyclingMethod::Fast;
        // The pool's commits tell when its sessions remake their plans.
        let replans = Arc::new(Replans::default());
        let counted = Arc::clone(&replans);
        config.custom_setup = Box::new(move |url| {
            let url = url.to_owned();
            let counted = Arc::clone(&counted);
            async move {
                let mut conn = if pooled {
                    connect_through_pooler(&url).await?
                } else {
                    let mut conn = AsyncPgConnection::establish(&url).await?;
                    conn.batch_execute(&format!(
                        "SET statement_timeout = {statement_ms}; SET lock_timeout = {lock_ms}; \
                         SET idle_in_transaction_session_timeout = {idle_ms}; \
                         SET TIME ZONE 'UTC'"
                    ))
                    .await
                    .map_err(|e| diesel::ConnectionError::BadConnection(e.to_string()))?;
                    conn
                };
                conn.set_instrumentation(super::watched_counter(move || counted.committed()));
                Ok(conn)
            }
            .boxed()
        });
        let manager =
            AsyncDieselConnectionManager::<AsyncPgConnection>::new_with_config(url, config);
        let mut builder = Pool::builder(manager)
            .max_size(settings.pool_size)
            .wait_timeout(Some(settings.acquire_timeout))
            .create_timeout(Some(settings.acquire_timeout))
            .recycle_timeout(Some(settings.acquire_timeout))
            .runtime(deadpool::Runtime::Tokio1);
        // Behind a pooler the plans live in its server connections, which a
        // session of ours does not stay on: there is nothing to remake here.
        if !pooled {
            builder = builder.post_recycle(Hook::async_fn(
                move |conn: &mut AsyncPgConnection, metrics: &Metrics| {
                    let stale = replans.stale(metrics);
                    Box::pin(async move {
                        if stale {
                            conn.batch_execute("DISCARD PLANS").await.map_err(|e| {
                                HookError::Message(format!("remake the plans: {e}").into())
                            })?;
                        }
                        Ok(())
                    })
                },
            ));
        }
        let pool = builder
            .build()
            .map_err(|e| StoreError::Config(format!("cannot build the connection pool: {e}")))?;
        let begin = if pooled {
            format!(
                "BEGIN; SET LOCAL statement_timeout = {statement_ms}; \
                 SET LOCAL lock_timeout = {lock_ms}; \
                 SET LOCAL idle_in_transaction_session_timeout = {idle_ms}; \
                 SET LOCAL TIME ZONE 'UTC'"
            )
        } else {
            "BEGIN".to_owned()
        };
        Ok(Self {
            pool,
            begin: begin.into(),
            pooled,
        })
    }

    async fn conn(&self) -> StoreResult<Conn> {
        self.pool
            .get()
            .await
            .map_err(|e| StoreError::unavailable("get a database connection", e))
    }

    /// Runs `work` on a pooled connection; behind a pooler, in a transaction
    /// of its own.
    pub(crate) async fn run<T>(
        &self,
        work: impl AsyncFnOnce(&mut AsyncPgConnection) -> StoreResult<T>,
    ) -> StoreResult<T> {
        let mut conn = self.conn().await?;
        if self.pooled {
            self.within(&mut conn, work).await
        } else {
            work(&mut conn).await
        }
    }

    /// The rows `query` answers on a pooled connection, each made into
    /// what it stands for.
    async fn rows<'q, Q, R, T>(
        &self,
        query: Q,
        context: &'static str,
        into: fn(R) -> StoreResult<T>,
    ) -> StoreResult<Vec<T>>
    where
        Q: diesel_async::methods::LoadQuery<'q, AsyncPgConnection, R> + Send + 'q,
        R: Send,
    {
        self.run(async |c| {
            let rows = query.load::<R>(c).await.context(context)?;
            rows.into_iter().map(into).collect()
        })
        .await
    }

    /// Runs `work` in one transaction on a pooled connection: committed when
    /// it succeeds, rolled back when it fails.
    pub(crate) async fn transaction<T, E>(
        &self,
        work: impl AsyncFnOnce(&mut AsyncPgConnection) -> Result<T, E>,
    ) -> Result<T, E>
    where
        E: From<StoreError>,
    {
        let mut conn = self.conn().await?;
        self.within(&mut conn, work).await
    }

    async fn within<T, E>(
        &self,
        conn: &mut AsyncPgConnection,
        work: impl AsyncFnOnce(&mut AsyncPgConnection) -> Result<T, E>,
    ) -> Result<T, E>
    where
        E: From<StoreError>,
    {
        AnsiTransactionManager::begin_transaction_sql(conn, &self.begin)
            .await
            .context("begin a transaction")?;
        let result = work(conn).await;
        settle(conn, result).await
    }
}

/// Ends the transaction `result` came from: committed when it succeeded,
/// rolled back when it failed.
async fn settle<T, E>(conn: &mut AsyncPgConnection, result: Result<T, E>) -> Result<T, E>
where
    E: From<StoreError>,
{
    type Manager = AnsiTransactionManager;
    match result {
        Ok(value) => {
            <Manager as TransactionManager<_>>::commit_transaction(conn)
                .await
                .context("commit a transaction")?;
            Ok(value)
        }
        Err(error) => {
            match <Manager as TransactionManager<_>>::rollback_transaction(conn).await {
                // The error that made it roll back says more than a broken
                // connection's rollback.
                Ok(()) | Err(diesel::result::Error::BrokenTransactionManager) => Err(error),
                Err(rollback) => Err(StoreError::from_diesel("roll back a transaction", rollback)
                    .with_outcome(WriteOutcome::NotApplied)
                    .into()),
            }
        }
    }
}

/// A connection through a pooler in transaction mode. What the driver sends
/// to set a connection up (its time zone and encoding, as statements it
/// prepares) runs in one transaction, so that it reaches one server
/// connection and leaves nothing prepared there; no statement is kept
/// prepared afterwards.
async fn connect_through_pooler(url: &str) -> diesel::ConnectionResult<AsyncPgConnection> {
    let bad = |e: tokio_postgres::Error| diesel::ConnectionError::BadConnection(e.to_string());
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .map_err(bad)?;
    // Driven until the client is dropped; the client reports a lost
    // connection to whoever uses it.
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "a database connection ended");
        }
    });
    client.batch_execute("BEGIN").await.map_err(bad)?;
    let mut conn = AsyncPgConnection::try_from(client).await?;
    conn.batch_execute("COMMIT")
        .await
        .map_err(|e| diesel::ConnectionError::BadConnection(e.to_string()))?;
    conn.set_prepared_statement_cache_size(CacheSize::Disabled);
    Ok(conn)
}

impl PgStore {
    pub fn connect(url: &str, settings: &StoreSettings) -> StoreResult<Self> {
        let db = Sessions::open(url, settings)?;
        let batch_db = db.clone();
        let snapshots = Coalescer::new(
            "read the asset to hold",
            SNAPSHOT_BATCHES,
            SNAPSHOT_BATCH_SIZE,
            SNAPSHOT_GATHER,
            move |inputs| Box::pin(read_hold_snapshots(batch_db.clone(), inputs)),
        );
        Ok(Self {
            db,
            snapshots,
            url: url.to_owned(),
            settings: settings.clone(),
        })
    }

    pub(crate) fn sessions(&self) -> &Sessions {
        &self.db
    }

    pub fn describe(&self) -> String {
        // Everything after the authority is safe to show; credentials are not.
        let tail = self.url.rsplit('@').next().unwrap_or_default();
        let tail = tail
            .trim_start_matches("postgres://")
            .trim_start_matches("postgresql://");
        format!("PostgreSQL at {tail}")
    }

    pub fn pool_status(&self) -> PoolStatus {
        let status = self.db.pool.status();
        PoolStatus {
            size: status.size,
            in_use: status.size.saturating_sub(status.available),
            waiting: status.waiting,
        }
    }

    pub fn settings(&self) -> &StoreSettings {
        &self.settings
    }

    /// Runs pending migrations in one transaction, under a transaction-level
    /// advisory lock that serialises instances starting together, on a
    /// blocking thread: through `migration_url` when one is set, else through
    /// the service's own URL (a pooler in transaction mode keeps one
    /// transaction on one server connection).
    pub async fn migrate(&self) -> StoreResult<()> {
        let url = self
            .settings
            .migration_url
            .clone()
            .unwrap_or_else(|| self.url.clone());
        let pooled = !self.settings.pg_prepared_statements;
        tokio::task::spawn_blocking(move || -> StoreResult<()> {
            use diesel::connection::SimpleConnection;
            let runtime = tokio::runtime::Handle::current();
            let inner = runtime
                .block_on(async {
                    if pooled {
                        connect_through_pooler(&url).await
                    } else {
                        AsyncPgConnection::establish(&url).await
                    }
                })
                .map_err(|e| StoreError::unavailable("connect to migrate", e))?;
            let mut conn = AsyncConnectionWrapper::<AsyncPgConnection>::from(inner);
            diesel::Connection::transaction(&mut conn, |c| {
                SimpleConnection::batch_execute(
                    c,
                    &format!("SELECT pg_advisory_xact_lock({MIGRATION_LOCK})"),
                )
                .context("take the migration lock")?;
                c.run_pending_migrations(MIGRATIONS)
                    .map(|_| ())
                    .map_err(|e| StoreError::Migration(e.to_string()))
            })
        })
        .await
        .map_err(|e| StoreError::Migration(format!("migration task failed: {e}")))?
    }

    /// Refuses a database whose events carry transaction ids ahead of this
    /// cluster's counter (a `pg_dump` restored into another cluster): the
    /// feed orders by transaction id, so new events would sort before the
    /// cursors pollers already hold, and they would never see them.
    pub async fn check_feed(&self) -> StoreResult<()> {
        #[derive(QueryableByName)]
        struct Counters {
            #[diesel(sql_type = Nullable<BigInt>)]
            newest: Option<i64>,
            #[diesel(sql_type = BigInt)]
            next: i64,
        }
        let counters = self
            .db
            .run(async |c| {
                sql_query(
                    "SELECT (SELECT max(txid) FROM events)::text::bigint AS newest, \
                            pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS next",
                )
                .get_result::<Counters>(c)
                .await
                .context("compare the feed with the transaction counter")
            })
            .await?;
        match counters.newest {
            Some(newest) if newest >= counters.next => {
                Err(StoreError::Config(feed_ahead(newest, counters.next)))
            }
            _ => Ok(()),
        }
    }

    pub async fn ping(&self) -> StoreResult<()> {
        self.db
            .run(async |c| c.batch_execute("SELECT 1").await.context("answer a ping"))
            .await
    }

    /// Runs shared statements on a pooled connection, with the database clock.
    pub(crate) async fn read<T>(
        &self,
        work: impl AsyncFnOnce(&mut AsyncPgConnection, Timestamp) -> StoreResult<T>,
    ) -> StoreResult<T> {
        self.db
            .run(async |c| {
                let now = db_now(c).await?;
                work(c, now).await
            })
            .await
    }
}

impl Backend for PgStore {
    /// Only events whose transaction id is below the oldest running
    /// transaction are returned: none can commit later in front of them.
    async fn event_feed(&self, page: FeedPage) -> StoreResult<Vec<(FeedCursor, Event)>> {
        let sql = if page.dead {
            format!(
                "SELECT txid::text::bigint AS tx, position, {EVENT_COLUMNS} FROM events \
             WHERE dead_at IS NOT NULL AND (txid, position) > ($1::text::xid8, $2) \
             ORDER BY txid, position LIMIT $3"
            )
        } else {
            format!(
                "SELECT txid::text::bigint AS tx, position, {EVENT_COLUMNS} FROM events \
             WHERE (txid, position) > ($1::text::xid8, $2) AND txid < \
                 pg_snapshot_xmin(pg_current_snapshot()) \
             ORDER BY txid, position LIMIT $3"
            )
        };
        let query = sql_query(sql)
            .bind::<Text, _>(page.after.tx.to_string())
            .bind::<BigInt, _>(page.after.position)
            .bind::<BigInt, _>(page.limit);
        let context = "read the event feed";
        self.db.rows(query, context, FeedRow::into_entry).await
    }

    /// Claims due events with SKIP LOCKED and leases them, in one short
    /// statement; delivery happens after it committed.
    async fn claim_deliveries(&self, limit: i64, lease: Duration) -> StoreResult<Vec<Delivery>> {
        let sql = format!(
            "UPDATE events SET attempts = attempts + 1, next_attempt_at = now() + \
                make_interval(secs => $2) \
             WHERE id IN (SELECT id FROM events \
                          WHERE delivered_at IS NULL AND dead_at IS NULL \
                            AND (next_attempt_at IS NULL OR next_attempt_at <= now()) \
                          ORDER BY position LIMIT $1 FOR UPDATE SKIP LOCKED) \
             RETURNING {EVENT_COLUMNS}, attempts"
        );
        let query = sql_query(sql)
            .bind::<BigInt, _>(limit)
            .bind::<Double, _>(lease.as_secs_f64());
        let context = "claim events to deliver";
        self.db
            .rows(query, context, ClaimedRow::into_delivery)
            .await
    }

    async fn finish_delivery(&self, id: &str, result: &DeliveryResult) -> StoreResult<()> {
        self.db
            .run(async |conn| {
                let (error, delay) = match result {
                    DeliveryResult::Delivered => (None, None),
                    DeliveryResult::Failed { error, retry_in } => (
                        Some(error.as_str()),
                        Some(retry_in.map(|d| d.as_secs_f64())),
                    ),
                };
                // Delivered: done. Failed with a delay: due again then. Failed without: dead.
                sql_query(
                    "UPDATE events SET \
                   delivered_at = CASE WHEN $2::text IS NULL THEN now() END, \
                   dead_at = CASE WHEN $2::text IS NOT NULL AND $3::float8 IS NULL THEN now() END, \
                   next_attempt_at = CASE WHEN $3::float8 IS NOT NULL THEN now() + \
                       make_interval(secs => $3) END, \
                   last_error = $2 \
                 WHERE id = $1",
                )
                .bind::<Text, _>(id)
                .bind::<Nullable<Text>, _>(error)
                .bind::<Nullable<Double>, _>(delay.flatten())
                .execute(conn)
                .await
                .context("record a delivery")?;
                Ok(())
            })
            .await
    }

    async fn refund_snapshot(&self, req: &CompleteRefundRequest) -> StoreResult<Snapshot<Refund>> {
        let idempotency = &req.idempotency;
        self.db
            .run(async |conn| {
                let key = sql_query(KEY_SNAPSHOT_SQL)
                    .bind::<Text, _>(&idempotency.scope)
                    .bind::<Text, _>(idempotency.key.as_str())
                    .get_result::<KeySnapshotRow>(conn)
                    .await
                    .context("read the idempotency key")?;
                Ok(key.with_row(shared::refund(conn, &req.refund_id.to_string()).await?))
            })
            .await
    }

    async fn asset_snapshot(&self, id: &AssetId) -> StoreResult<Snapshot<Asset>> {
        self.db
            .run(async |conn| {
                let row = sql_query("SELECT now() AS now, * FROM assets WHERE id = $1")
                    .bind::<Text, _>(id.as_str())
                    .get_result::<NowAssetRow>(conn)
                    .await
                    .optional()
                    .context("read an asset")?;
                let now = match &row {
                    Some(row) => row.now,
                    None => db_now(conn).await?,
                };
                asset_snapshot(now, row)
            })
            .await
    }

    /// Rows are taken with SKIP LOCKED in id order, so instances share the work.
    async fn expire_batch(&self, limit: i64) -> StoreResult<u64> {
        let expired = self
            .db
            .transaction(async |c| {
                let now = db_now(c).await?;
                expire_lapsed(c, None, now, limit).await
            })
            .await?;
        Ok(expired as u64)
    }

    /// The purge statements take the rows older than the retention ($1,
    /// seconds), `limit` ($2) at a time, with SKIP LOCKED.
    async fn purge_batch(&self, what: Purge, limit: i64, retention: Duration) -> StoreResult<u64> {
        let sql = match what {
            Purge::Keys => PURGE_KEYS_SQL,
            Purge::Events => PURGE_EVENTS_SQL,
        };
        let query = sql_query(sql)
            .bind::<Double, _>(retention.as_secs_f64())
            .bind::<BigInt, _>(limit);
        let purged = self
            .db
            .run(async |c| query.execute(c).await.context(what.context()))
            .await?;
        Ok(purged as u64)
    }

    async fn hold_snapshot(&self, req: &HoldRequest) -> StoreResult<Snapshot<HoldTarget>> {
        self.snapshots
            .call((
                req.asset_id.to_string(),
                req.idempotency.scope.clone(),
                req.idempotency.key.to_string(),
            ))
            .await?
            .into_snapshot()
    }

    async fn claim(&self, draft: &HoldDraft<'_>, reclaim: bool) -> StoreResult<Claim> {
        if !reclaim {
            // One statement, its own transaction: one round trip.
            return self.db.run(async |c| claim_available(c, draft).await).await;
        }
        let r = &draft.reservation;
        // Whatever the claim finds, what ran before it (the buyer's lock, the
        // expiry of a lapsed hold) may commit: the claim itself wrote nothing.
        self.db
            .transaction(async |c| {
                if draft.request.max_live_holds.is_some() {
                    lock_buyer(c, &r.owner, &r.buyer_id).await?;
                }
                expire_lapsed(c, Some(&r.asset_id), r.created_at, 1).await?;
                claim_available(c, draft).await
            })
            .await
    }

    async fn reservation_snapshot(&self, target: Target<'_>) -> StoreResult<Snapshot<Reservation>> {
        let (key, payment) = (target.idempotency, target.payment);
        self.db
            .run(async |conn| {
                Prepared(
                    sql_query(RESERVATION_SNAPSHOT_SQL)
                        .bind::<Text, _>(target.id.to_string())
                        .bind::<Text, _>(&key.scope)
                        .bind::<Text, _>(key.key.as_str())
                        .bind::<Nullable<Text>, _>(payment.map(|p| p.scope))
                        .bind::<Nullable<Text>, _>(payment.map(|p| p.reference)),
                )
                .get_result::<ReservationSnapshotRow>(conn)
                .await
                .context("read the reservation")?
                .into_snapshot()
            })
            .await
    }

    async fn reload(&self, id: &ReservationId, now: Timestamp) -> StoreResult<Reservation> {
        let id = id.to_string();
        self.db
            .run(async |c| shared::reload(c, &id, now).await)
            .await
    }

    async fn payment_fates(&self, scope: Option<&str>, reference: &str) -> StoreResult<Fates> {
        self.read(async |c, now| {
            let rows = shared::payment_fates(c, scope, reference).await?;
            Ok(Fates { now, rows })
        })
        .await
    }

    async fn transition<T: Send + 'static>(
        &self,
        change: Change,
        idempotency: Option<&Idempotency>,
        assemble: Assemble<T>,
    ) -> StoreResult<Option<T>> {
        let result = match LiveHoldEnd::of(&change) {
            // The sale or release of a live hold: one statement, whose event
            // and stored answer are built first, from the first read.
            Some(end) => {
                let written = assemble(&end.changed())?;
                let [event] = written.events.as_slice() else {
                    return Err(StoreError::Corrupt(
                        "the end of a live hold writes exactly one event".into(),
                    ));
                };
                let answer = match (idempotency, &written.answer) {
                    (Some(idempotency), Some((reply, _))) => Some((idempotency, reply)),
                    _ => None,
                };
                let ended = self
                    .db
                    .run(async |c| end_live_hold(c, &end, event, answer).await)
                    .await;
                match ended {
                    Ok(true) => Ok(written.value),
                    Ok(false) => Err(Abort::Retry),
                    Err(error) => Err(Abort::Failed(error)),
                }
            }
            None => {
                self.db
                    .transaction(async |c| {
                        let now = match &change {
                            Change::Refund { refund, .. } => refund.created_at,
                            _ => db_now(c).await?,
                        };
                        let Some(changed) = shared::apply(c, &change, now).await? else {
                            return Err(Abort::Retry);
                        };
                        let written = assemble(&changed)?;
                        let asset = change.asset_id();
                        Ok(shared::write_after(c, asset, &changed, written, idempotency).await?)
                    })
                    .await
            }
        };
        Abort::settle(result.map(Some), None)
    }
}

/// The answer stored under a key ($1 scope, $2 key), at the database's clock.
const KEY_SNAPSHOT_SQL: &str = "\
SELECT now() AS now, i.fingerprint, i.status_code, i.body, i.location \
FROM (SELECT 1) AS one LEFT JOIN idempotency_keys i ON i.scope = $1 AND i.key = $2";

const PURGE_EVENTS_SQL: &str = "\
DELETE FROM events WHERE id IN ( \
SELECT id FROM events WHERE delivered_at IS NOT NULL \
AND created_at < now() - make_interval(secs => $1) \
ORDER BY position LIMIT $2 FOR UPDATE SKIP LOCKED)";

const PURGE_KEYS_SQL: &str = "\
DELETE FROM idempotency_keys WHERE (scope, key) IN ( \
SELECT scope, key FROM idempotency_keys WHERE created_at < now() - \
make_interval(secs => $1) \
ORDER BY created_at LIMIT $2 FOR UPDATE SKIP LOCKED)";

/// The sale (with a payment) or the release of a hold that was live at the
/// first read, at that read's clock.
struct LiveHoldEnd<'c> {
    reservation: &'c Reservation,
    payment: Option<PaymentKey<'c>>,
    read_at: Timestamp,
}

impl<'c> LiveHoldEnd<'c> {
    fn of(change: &'c Change) -> Option<Self> {
        match change {
            Change::Commit {
                reservation,
                scope,
                reference,
                read_at,
            } => Some(Self {
                reservation,
                payment: Some(PaymentKey { scope, reference }),
                read_at: *read_at,
            }),
            Change::Release {
                reservation,
                read_at,
            } => Some(Self {
                reservation,
                payment: None,
                read_at: *read_at,
            }),
            _ => None,
        }
    }

    /// What the statement writes when the hold is still live: the
    /// reservation as it becomes, at the first read's clock.
    fn changed(&self) -> Changed {
        let reservation = self.reservation.clone();
        let ended = match self.payment {
            Some(payment) => reservation.sold(self.read_at, payment.scope, payment.reference),
            None => reservation.released(self.read_at),
        };
        Changed {
            now: Some(self.read_at),
            reservation: Some(ended),
            ..Changed::default()
        }
    }
}

/// Sells or releases a live hold with its event and the stored answer, in
/// one statement and so in one round trip with its commit; `false` when the
/// hold is not live any more and nothing was written.
async fn end_live_hold<C>(
    conn: &mut C,
    end: &LiveHoldEnd<'_>,
    event: &NewEvent,
    answer: Option<(&Idempotency, &Reply)>,
) -> StoreResult<bool>
where
    C: diesel_async::AsyncConnectionCore<Backend = Pg> + Send,
{
    let r = end.reservation;
    let end_hold = Prepared(
        sql_query(END_HOLD_SQL)
            .bind::<Text, _>(&r.reservation_id)
            .bind::<Text, _>(&r.asset_id)
            .bind::<Nullable<Text>, _>(end.payment.map(|p| p.reference))
            .bind::<Nullable<Text>, _>(end.payment.map(|p| p.scope))
            .bind::<Timestamptz, _>(end.read_at)
            .bind::<Text, _>(&event.id)
            .bind::<Text, _>(event.event_type.as_str())
            .bind::<Text, _>(&event.data)
            .bind::<Nullable<Text>, _>(event.actor.as_deref())
            .bind::<Nullable<Text>, _>(answer.map(|(i, _)| i.scope.as_str()))
            .bind::<Nullable<Text>, _>(answer.map(|(i, _)| i.key.as_str()))
            .bind::<Nullable<Text>, _>(answer.map(|(i, _)| i.fingerprint.as_str()))
            .bind::<Nullable<Integer>, _>(answer.map(|(_, reply)| i32::from(reply.status)))
            .bind::<Nullable<Text>, _>(answer.map(|(_, reply)| reply.body.as_str()))
            .bind::<Nullable<Text>, _>(answer.and_then(|(_, reply)| reply.location.as_deref())),
    );
    let rows = write_alone(|| end_hold.load::<Ended>(conn))
        .await
        .context("end the hold")?;
    let row = rows
        .into_iter()
        .next()
        .ok_or_else(|| StoreError::Corrupt("ending a hold answered no row".into()))?;
    Ok(row.ended > 0)
}

/// The sale ($3 payment reference, $4 its scope) or, without a payment, the
/// release of a live hold: the asset first (lock order: asset, then
/// reservation), guarded by status, owner and expiry at the statement's own
/// now(); then the reservation, the payment's fate (whose key fails the
/// statement when the payment has one already), the event under the number
/// the asset's update took, and the answer stored under the key ($11, when
/// there is one). It records the first read's clock ($5). Like `HOLD_SQL`,
/// it begins with `WITH`: sent on its own, it is a write.
const END_HOLD_SQL: &str = "\
WITH a AS (
    UPDATE assets
       SET status = CASE WHEN $3::text IS NULL THEN 'AVAILABLE' ELSE 'SOLD' END,
           current_reservation_id = CASE WHEN $3::text IS NULL THEN NULL ELSE $1 END,
           hold_expires_at = NULL, version = version + 1,
           last_event_sequence = last_event_sequence + 1, updated_at = $5
     WHERE id = $2 AND status = 'HELD' AND current_reservation_id = $1 AND hold_expires_at > now()
 RETURNING id, last_event_sequence
), r AS (
    UPDATE reservations
       SET status = CASE WHEN $3::text IS NULL THEN 'RELEASED' ELSE 'COMMITTED' END,
           committed_at = CASE WHEN $3::text IS NULL THEN NULL ELSE $5 END,
           released_at = CASE WHEN $3::text IS NULL THEN $5 END,
           payment_reference = $3, payment_scope = $4
     WHERE id = $1 AND status = 'HELD' AND EXISTS (SELECT 1 FROM a)
 RETURNING id, owner
), fate AS (
    INSERT INTO payments (scope, reference, reservation_id, created_at)
    SELECT $4, $3, id, $5 FROM r WHERE $3::text IS NOT NULL
), event AS (
    INSERT INTO events (id, asset_id, sequence, type, data, created_at, owner, actor)
    SELECT $6, a.id, a.last_event_sequence, $7, $8, $5, r.owner, $9 FROM a, r
), answer AS (
    INSERT INTO idempotency_keys (scope, key, fingerprint, status_code, body, location, \
        reservation_id, created_at)
    SELECT $10, $11, $12, $13, $14, $15, r.id, $5 FROM r WHERE $11::text IS NOT NULL
)
SELECT count(*) AS ended FROM r";

/// What to do when the events are ahead of the cluster's transaction counter.
fn feed_ahead(newest: i64, next: i64) -> String {
    let target = newest + 1;
    let (epoch, xid) = (target >> 32, (target & 0xffff_ffff).max(3));
    format!(
        "the event feed's newest transaction id ({newest}) is ahead of this PostgreSQL \
         cluster's next one ({next}): the database was restored with pg_dump into a cluster \
         whose transaction counter is behind, and new events would sort before the cursors \
         that pollers already hold, who would never receive them. Advance the counter past \
         {newest}: stop PostgreSQL and run, as its owner, `pg_resetwal -e {epoch} -x {xid} \
         <data directory>`, then start PostgreSQL and holdfast again. Physical backups \
         (pg_basebackup, file-system snapshots) keep the counter and need none of this."
    )
}

/// A reservation's first read: the database clock, the reservation, the
/// answer stored under the key, and the fate of the payment a commit carries
/// ($4 scope, $5 reference; NULL for other requests). Sales recorded before
/// scopes (scope '') count in every scope.
const RESERVATION_SNAPSHOT_SQL: &str = "\
SELECT now() AS now, r.id, r.asset_id, r.buyer_id, r.status, r.expires_at, r.created_at,
       r.committed_at, r.released_at, r.payment_reference, r.owner, r.voided_at, r.payment_scope,
       i.fingerprint, i.status_code, i.body, i.location,
       p.reservation_id AS fate_reservation_id, p.refund_id AS fate_refund_id
  FROM (SELECT 1) AS one
  LEFT JOIN reservations r ON r.id = $1
  LEFT JOIN idempotency_keys i ON i.scope = $2 AND i.key = $3
  LEFT JOIN payments p ON p.reference = $5 AND p.scope IN ($4, '')
 ORDER BY p.scope DESC NULLS LAST LIMIT 1";

/// A hold's first read: the database clock, the asset and the answer stored
/// under the key, from one snapshot. Losers stop here.
///
/// It reads for many requests at once: `$1`, `$2` and `$3` are the requests'
/// asset ids, key scopes and keys, answered one row each in their order.
pub const HOLD_SNAPSHOT_SQL: &str = "\
SELECT now() AS now, a.status, a.hold_expires_at, a.available_from, i.fingerprint, \
    i.status_code, i.body, i.location
  FROM unnest($1::text[], $2::text[], $3::text[]) WITH ORDINALITY AS r(asset_id, scope, key, ord)
  LEFT JOIN assets a ON a.id = r.asset_id
  LEFT JOIN idempotency_keys i ON i.scope = r.scope AND i.key = r.key
 ORDER BY r.ord";

/// At most this many hold snapshot statements run at once; requests that
/// arrive meanwhile are read together by the next one. One: a statement is
/// mostly its planning, so the fewer and fuller the statements, the less the
/// database works per request, and a request waits at most for the
/// statement running when it came and then its own.
const SNAPSHOT_BATCHES: usize = 1;
/// The largest number of requests one snapshot statement reads for.
const SNAPSHOT_BATCH_SIZE: usize = 256;
/// A snapshot statement that follows another waits for 32 requests, or half
/// a millisecond, when fewer are queued. At 64 connections in a flash sale
/// that takes the statements from about 15 requests each to about 50, and
/// the database's CPU per request to less than half.
const SNAPSHOT_GATHER: Gather = Gather {
    callers: 32,
    at_most: Duration::from_micros(500),
};

/// What a hold snapshot reads for one request: asset id, key scope, key.
type SnapshotInput = (String, String, String);

async fn read_hold_snapshots(
    db: Sessions,
    inputs: Vec<SnapshotInput>,
) -> StoreResult<Vec<HoldSnapshotRow>> {
    // Identical requests (retries of one key) are read once.
    let mut unique: Vec<&SnapshotInput> = Vec::with_capacity(inputs.len());
    let mut index = std::collections::HashMap::with_capacity(inputs.len());
    let slots: Vec<usize> = inputs
        .iter()
        .map(|input| {
            *index.entry(input).or_insert_with(|| {
                unique.push(input);
                unique.len() - 1
            })
        })
        .collect();
    let assets: Vec<&str> = unique.iter().map(|(a, _, _)| a.as_str()).collect();
    let scopes: Vec<&str> = unique.iter().map(|(_, s, _)| s.as_str()).collect();
    let keys: Vec<&str> = unique.iter().map(|(_, _, k)| k.as_str()).collect();
    let rows = db
        .run(async |c| {
            Prepared(
                sql_query(HOLD_SNAPSHOT_SQL)
                    .bind::<Array<Text>, _>(assets)
                    .bind::<Array<Text>, _>(scopes)
                    .bind::<Array<Text>, _>(keys),
            )
            .load::<HoldSnapshotRow>(c)
            .await
            .context("read the asset to hold")
        })
        .await?;
    if rows.len() != unique.len() {
        return Err(StoreError::Corrupt(format!(
            "{} snapshot rows for {} requests",
            rows.len(),
            unique.len()
        )));
    }
    if rows.len() == slots.len() {
        // Every request was its own: the rows are the answers, in order.
        return Ok(rows);
    }
    Ok(slots.into_iter().map(|slot| rows[slot].clone()).collect())
}

/// Takes the per-buyer limit's lock on the (owner, buyer) pair, held until
/// the end of the transaction (`lock_buyer`, an advisory lock).
const LOCK_BUYER_SQL: &str = "SELECT lock_buyer($1, $2)";

/// Takes the buyer's lock, so that one buyer's holds are counted one at a
/// time while others run in parallel. A hold takes it itself; a hold that
/// reclaims a lapsed one takes it first, before the asset's row, as every
/// hold does.
async fn lock_buyer<C>(conn: &mut C, owner: &str, buyer: &str) -> StoreResult<()>
where
    C: diesel_async::AsyncConnectionCore<Backend = Pg> + Send,
{
    Prepared(
        sql_query(LOCK_BUYER_SQL)
            .bind::<Text, _>(owner)
            .bind::<Text, _>(buyer),
    )
    .execute(conn)
    .await
    .context("lock the buyer")?;
    Ok(())
}

/// The hold itself: one statement that claims an AVAILABLE asset, unless the
/// buyer is at the limit of live holds, and writes the reservation, its event
/// and the stored answer. A taken asset makes it write nothing; a key used
/// concurrently fails it whole (unique violation).
///
/// Sent on its own, the statement commits after its row has been sent: its
/// answer is read to the end (`load`, not `get_result`, which stops at the
/// first row), so that the hold is acknowledged only once it committed. See
/// [`write_alone`] for an error that comes with the rows.
async fn claim_available<C>(conn: &mut C, draft: &HoldDraft<'_>) -> StoreResult<Claim>
where
    C: diesel_async::AsyncConnectionCore<Backend = Pg> + Send,
{
    let r = &draft.reservation;
    let idem = &draft.request.idempotency;
    let hold = Prepared(
        sql_query(HOLD_SQL)
            .bind::<Text, _>(&r.asset_id)
            .bind::<Text, _>(&r.reservation_id)
            .bind::<Text, _>(&r.buyer_id)
            .bind::<Timestamptz, _>(r.created_at)
            .bind::<Timestamptz, _>(r.expires_at)
            .bind::<Text, _>(draft.event_id.to_string())
            .bind::<Text, _>(&draft.reply.body)
            .bind::<Text, _>(&idem.scope)
            .bind::<Text, _>(idem.key.as_str())
            .bind::<Text, _>(&idem.fingerprint)
            .bind::<Integer, _>(i32::from(draft.reply.status))
            .bind::<Nullable<Text>, _>(draft.reply.location.as_deref())
            .bind::<Text, _>(&r.owner)
            .bind::<Nullable<BigInt>, _>(draft.request.max_live_holds),
    );
    let rows = write_alone(|| hold.load::<Claimed>(conn))
        .await
        .context("hold the asset")?;
    let row = rows
        .into_iter()
        .next()
        .ok_or_else(|| StoreError::Corrupt("the hold statement answered no row".into()))?;
    Ok(if row.claimed > 0 {
        Claim::Claimed
    } else if row.limit_reached {
        Claim::LimitReached
    } else {
        Claim::Taken
    })
}

/// The hold: `hold_asset` (migration `hold_statement_by_statement`) takes
/// the buyer's lock when there is a limit ($14), then counts the buyer's
/// live holds in a statement of its own, with a snapshot taken after the
/// lock, and claims below the limit; all in this one statement. It begins with `WITH`, not `SELECT`:
/// sent outside a transaction, a statement that begins with `SELECT` counts
/// as a read, whose 503 would say that nothing was written.
pub const HOLD_SQL: &str = "\
WITH hold AS (
    SELECT claimed, limit_reached
      FROM hold_asset(asset_id => $1, reservation_id => $2, buyer_id => $3, at => $4,
                      expires_at => $5, event_id => $6, body => $7, key_scope => $8, key => $9,
                      fingerprint => $10, status_code => $11, location => $12, owner => $13,
                      max_live_holds => $14)
)
SELECT claimed, limit_reached FROM hold";

/// The expiry statement, with the lock clause of its choice of assets.
macro_rules! expire_sql {
    ($lock:literal) => {
        concat!(
            "WITH lapsed AS ( \
               SELECT id FROM assets \
               WHERE status = 'HELD' AND hold_expires_at <= $1 AND ($2::text IS NULL OR id = $2) \
               ORDER BY id LIMIT $3 ",
            $lock,
            " ), a AS ( \
               UPDATE assets SET status = 'AVAILABLE', hold_expires_at = NULL, \
                   current_reservation_id = NULL, \
                      version = version + 1, last_event_sequence = last_event_sequence + 1, \
                          updated_at = $1 \
               FROM lapsed WHERE assets.id = lapsed.id \
               RETURNING assets.id, assets.last_event_sequence) \
             UPDATE reservations SET status = 'EXPIRED' FROM a \
             WHERE reservations.asset_id = a.id AND reservations.status = 'HELD' \
             RETURNING reservations.*, a.last_event_sequence AS event_sequence"
        )
    };
}

/// Expires lapsed holds (of one asset, or up to `limit` of any) as of `now`:
/// each asset back to AVAILABLE, its HELD reservation EXPIRED, one event each.
///
/// Sweeps of any assets skip rows another transaction holds, so that
/// janitors share the work. The expiry of one asset, done before acting on
/// it, waits for such a transaction instead (a janitor expiring that very
/// hold): what the caller does next then reads after it.
pub(crate) async fn expire_lapsed<C>(
    conn: &mut C,
    asset: Option<&str>,
    now: Timestamp,
    limit: i64,
) -> StoreResult<usize>
where
    C: diesel_async::AsyncConnectionCore<Backend = Pg> + Send,
{
    let sql = if asset.is_some() {
        expire_sql!("FOR UPDATE")
    } else {
        expire_sql!("FOR UPDATE SKIP LOCKED")
    };
    let rows = sql_query(sql)
        .bind::<Timestamptz, _>(now)
        .bind::<Nullable<Text>, _>(asset)
        .bind::<BigInt, _>(limit)
        .load::<TransitionRow>(conn)
        .await
        .context("expire lapsed holds")?;
    for row in &rows {
        let reservation = row.reservation.clone().into_reservation()?;
        insert_event(conn, &expired_event(&reservation, row.event_sequence, now)).await?;
    }
    Ok(rows.len())
}

/// An event; its owner is the owner of the reservation it reports ($7).
const INSERT_EVENT_SQL: &str = "\
INSERT INTO events (id, asset_id, sequence, type, data, created_at, owner, actor)
VALUES ($1, $2, $3, $4, $5, $6, (SELECT owner FROM reservations WHERE id = $7), $8)";

pub(crate) async fn insert_event<C>(conn: &mut C, event: &NewEvent) -> StoreResult<()>
where
    C: diesel_async::AsyncConnectionCore<Backend = Pg> + Send,
{
    Prepared(event.bound::<Pg>(INSERT_EVENT_SQL))
        .execute(conn)
        .await
        .context("record an event")?;
    Ok(())
}

pub(crate) async fn db_now(conn: &mut AsyncPgConnection) -> StoreResult<Timestamp> {
    diesel::select(diesel::dsl::sql::<Timestamptz>("now()"))
        .get_result(conn)
        .await
        .context("read the database clock")
}
