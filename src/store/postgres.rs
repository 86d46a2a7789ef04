//! PostgreSQL: diesel-async over a bounded deadpool pool, no libpq. Time is
//! `now()` of the database. This module opens the pool, sets up each
//! session (directly, or behind a pooler in transaction mode), migrates,
//! and runs work on a connection or in a transaction; the statements
//! themselves are in the transition and read modules.

use std::sync::Arc;

use deadpool::managed::{Hook, HookError, Metrics};
use diesel::connection::CacheSize;
use diesel::pg::Pg;
use diesel::prelude::*;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::sql_query;
use diesel::sql_types::{BigInt, Nullable, Timestamptz};
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

use super::api::{PoolStatus, StoreSettings};
use super::error::Context;
use super::error::{StoreError, StoreResult};
use super::plans::Replans;
use crate::domain::Timestamp;
use crate::domain::WriteOutcome;

pub const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/postgres");

/// Serialises migrations of instances that start at the same time.
const MIGRATION_LOCK: i64 = 0x686f_6c64_6661_7374; // "holdfast"

type Conn = Object<AsyncPgConnection>;

/// A raw statement whose text never changes, so that the connection keeps
/// it prepared (diesel never caches `sql_query` by itself: it cannot know the
/// text is fixed). Used for the statements on PostgreSQL's hot paths, and
/// for every statement on SQLite ([`super::conn::Conn`]), whose texts have
/// placeholders for every value: preparing a statement is most of what an
/// SQLite read of one row costs.
///
/// PostgreSQL chooses, per statement, between planning each execution and
/// a generic plan kept with the statement (`plan_cache_mode = auto`): the
/// hot statements are index lookups whose generic plan costs what a
/// custom one does, so after five executions they skip planning, which was
/// most of their cost. A generic plan is made again whenever ANALYZE
/// updates the statistics of a table it reads, so it follows the tables'
/// growth.
pub(crate) struct Prepared<Q>(pub(crate) Q);

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
    url: String,
    migration_url: Option<String>,
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
        // Every connection is opened, and so driven, on the store's runtime,
        // where the batched reads run: a connection opened by the HTTP worker
        // that happened to need one first was driven by that worker's thread
        // for good, and every statement another thread sent on it woke that
        // worker twice (its query, then its answer).
        let home = super::home::Home::here();
        config.custom_setup = Box::new(move |url| {
            let url = url.to_owned();
            let counted = Arc::clone(&counted);
            let home = home.clone();
            let connect = async move {
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
                conn.set_instrumentation(super::outcome::watched_counter(move || {
                    counted.committed()
                }));
                Ok(conn)
            };
            let connect = home.run(connect);
            async move {
                connect.await.map_err(|e| {
                    diesel::ConnectionError::BadConnection(format!("open a connection: {e}"))
                })?
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

    pub(crate) async fn conn(&self) -> StoreResult<Conn> {
        self.pool
            .get()
            .await
            .map_err(|e| StoreError::unavailable("get a database connection", e))
    }

    /// Runs `work`, which only reads, on a pooled connection; behind a
    /// pooler, in a transaction of its own, whose COMMIT writes nothing and
    /// so is kept off the gate of the call that reads.
    pub(crate) async fn run<T>(
        &self,
        work: impl AsyncFnOnce(&mut AsyncPgConnection) -> StoreResult<T>,
    ) -> StoreResult<T> {
        let mut conn = self.conn().await?;
        if self.pooled {
            let reading = super::outcome::Gate::new();
            super::outcome::with_gate(reading, self.within(&mut conn, work)).await
        } else {
            work(&mut conn).await
        }
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

    /// Whether sessions are reached through a pooler in transaction mode.
    pub(crate) fn pooled(&self) -> bool {
        self.pooled
    }

    /// Runs `work` in one transaction on `conn`.
    pub(crate) async fn within<T, E>(
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
        Ok(Self {
            db,
            url: url.to_owned(),
            migration_url: settings.migration_url.clone(),
        })
    }

    pub(crate) fn sessions(&self) -> &Sessions {
        &self.db
    }

    pub(crate) fn url(&self) -> &str {
        &self.url
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

    /// Runs pending migrations in one transaction, under a transaction-level
    /// advisory lock that serialises instances starting together, on a
    /// blocking thread: through `migration_url` when one is set, else through
    /// the service's own URL (a pooler in transaction mode keeps one
    /// transaction on one server connection).
    pub async fn migrate(&self) -> StoreResult<()> {
        let url = self
            .migration_url
            .clone()
            .unwrap_or_else(|| self.url.clone());
        let pooled = self.db.pooled;
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
}

/// The database clock.
pub(crate) async fn db_now(conn: &mut AsyncPgConnection) -> StoreResult<Timestamp> {
    db_clock(conn, "now()").await
}

/// The database's clock as `clock` reads it (`now()`, the transaction's
/// start; `statement_timestamp()`, this statement's).
pub(crate) async fn db_clock(
    conn: &mut AsyncPgConnection,
    clock: &'static str,
) -> StoreResult<Timestamp> {
    Prepared(diesel::select(diesel::dsl::sql::<Timestamptz>(clock)))
        .get_result(conn)
        .await
        .context("read the database clock")
}

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
