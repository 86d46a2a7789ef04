//! SQLite, the embedded default: diesel with the bundled library, an r2d2
//! pool of readers and a single writer connection, WAL, and `BEGIN IMMEDIATE`
//! for every write transaction. All work runs on blocking threads. The
//! process clock is this database's clock. What only SQLite does lives here:
//! the hold's statements, the expiry of lapsed holds, the event positions
//! and the delivery claims; every other statement is shared
//! ([`super::statements::lite`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use chrono::{SubsecRound, Utc};
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, CustomizeConnection, Pool, PooledConnection};
use diesel::sql_query;
use diesel::sql_types::{BigInt, Nullable, Text};
use diesel::sqlite::{Sqlite, SqliteConnection};
use diesel_migrations::{embed_migrations, EmbeddedMigrations, MigrationHarness};
use tokio::sync::Semaphore;

use super::error::{Abort, Context};
use super::flow::{
    expired_event, Assemble, Backend, Claim, Fates, HoldDraft, Purge, Snapshot, Target,
};
use super::home::Home;
use super::rows::{
    asset_snapshot, ClaimedRow, Count, FeedRow, HoldSnapshotRow, KeySnapshotRow, NewEvent,
    NowAssetRow, ReservationRow, ReservationSnapshotRow, EVENT_COLUMNS,
};
use super::schema::Instant;
use super::statements::lite as shared;
use super::{
    CompleteRefundRequest, Delivery, DeliveryResult, FeedCursor, FeedPage, HoldRequest,
    Idempotency, PoolStatus, StoreError, StoreResult, StoreSettings,
};
use crate::domain::{
    Asset, AssetId, Event, EventType, HoldTarget, Refund, Reservation, ReservationId, Timestamp,
};

pub const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/sqlite");

type Conn = PooledConnection<ConnectionManager<SqliteConnection>>;

/// The clock of the embedded database: this process's, to the microsecond.
pub(crate) fn clock() -> Timestamp {
    Utc::now().trunc_subsecs(6)
}

/// Set on every new connection; busy_timeout must come before WAL.
#[derive(Debug)]
struct Pragmas {
    busy_timeout: Duration,
    synchronous: &'static str,
}

impl CustomizeConnection<SqliteConnection, diesel::r2d2::Error> for Pragmas {
    fn on_acquire(&self, conn: &mut SqliteConnection) -> Result<(), diesel::r2d2::Error> {
        conn.set_instrumentation(super::statement_counter());
        conn.batch_execute(&format!(
            "PRAGMA busy_timeout = {}; PRAGMA journal_mode = WAL; PRAGMA synchronous = {}; \
             PRAGMA foreign_keys = ON;",
            self.busy_timeout.as_millis(),
            self.synchronous
        ))
        .map_err(diesel::r2d2::Error::QueryError)
    }
}

#[derive(Clone)]
pub struct SqliteStore {
    readers: Lane,
    /// One connection: writers queue here instead of spinning on SQLite's lock.
    writer: Lane,
    path: PathBuf,
    settings: StoreSettings,
}

impl SqliteStore {
    pub fn open(path: &Path, settings: &StoreSettings) -> StoreResult<Self> {
        let path = std::path::absolute(path)
            .map_err(|e| StoreError::Config(format!("cannot resolve {}: {e}", path.display())))?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| StoreError::Config(format!("cannot create {}: {e}", dir.display())))?;
        }
        let pool = |size: usize| {
            let pool = Pool::builder()
                .max_size(u32::try_from(size).unwrap_or(u32::MAX))
                .min_idle(Some(1))
                .connection_timeout(settings.acquire_timeout)
                .connection_customizer(Box::new(Pragmas {
                    busy_timeout: settings.lock_timeout,
                    synchronous: settings.sqlite_synchronous.as_pragma(),
                }))
                .build(ConnectionManager::<SqliteConnection>::new(
                    path.display().to_string(),
                ))
                .map_err(|e| StoreError::Config(format!("cannot open {}: {e}", path.display())))?;
            Ok::<_, StoreError>(Lane {
                pool,
                permits: Arc::new(Semaphore::new(size)),
                home: Home::here(),
                wait: settings.acquire_timeout,
            })
        };
        // The writer opens first, so WAL is on before readers arrive.
        let writer = pool(1)?;
        let readers = pool(settings.pool_size)?;
        Ok(Self {
            readers,
            writer,
            path,
            settings: settings.clone(),
        })
    }

    pub fn describe(&self) -> String {
        format!(
            "SQLite at {} (synchronous = {})",
            self.path.display(),
            self.settings.sqlite_synchronous.as_pragma()
        )
    }

    /// `PRAGMA synchronous` as the writer connection has it: 2 is FULL, 1 NORMAL.
    pub async fn synchronous(&self) -> StoreResult<i64> {
        #[derive(QueryableByName)]
        struct Synchronous {
            #[diesel(sql_type = BigInt)]
            synchronous: i64,
        }
        run(&self.writer, "read a setting", |c| {
            sql_query("PRAGMA synchronous")
                .get_result::<Synchronous>(c)
                .map(|s| s.synchronous)
                .context("read a setting")
        })
        .await
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn settings(&self) -> &StoreSettings {
        &self.settings
    }

    /// Readers and the writer together; r2d2 does not count its waiters.
    pub fn pool_status(&self) -> PoolStatus {
        let (readers, writer) = (self.readers.pool.state(), self.writer.pool.state());
        let size = (readers.connections + writer.connections) as usize;
        let idle = (readers.idle_connections + writer.idle_connections) as usize;
        PoolStatus {
            size,
            in_use: size.saturating_sub(idle),
            waiting: 0,
        }
    }

    pub(crate) async fn read<T, F>(&self, context: &'static str, work: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut SqliteConnection) -> StoreResult<T> + Send + 'static,
    {
        run(&self.readers, context, work).await
    }

    /// Runs `work` in a `BEGIN IMMEDIATE` transaction on the writer. The
    /// work goes on on its blocking thread even when the call gives up: it
    /// commits only if the call's gate is still open, else it rolls back.
    async fn write<T, F>(&self, context: &'static str, work: F) -> StoreResult<Result<T, Abort>>
    where
        T: Send + 'static,
        F: FnOnce(&mut SqliteConnection) -> Result<T, Abort> + Send + 'static,
    {
        let gate = super::outcome::current();
        run(&self.writer, context, move |conn| {
            let mut opened = false;
            let result = conn.immediate_transaction(|c| {
                let value = work(c)?;
                if let Some(gate) = &gate {
                    if !gate.open_commit() {
                        return Err(Abort::Abandoned);
                    }
                    opened = true;
                }
                Ok(value)
            });
            if let (true, Some(gate), Ok(_)) = (opened, &gate, &result) {
                gate.close_commit(Ok(()), super::WriteOutcome::NotApplied);
            }
            Ok(result)
        })
        .await
    }

    /// Runs one shared write in its own transaction at the write's clock.
    pub(crate) async fn write_now<T, F>(&self, context: &'static str, work: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut SqliteConnection, Timestamp) -> StoreResult<T> + Send + 'static,
    {
        self.write(context, move |c| Ok(work(c, clock())?))
            .await?
            .map_err(Abort::into_error)
    }

    pub async fn migrate(&self) -> StoreResult<()> {
        run(&self.writer, "migrate", |conn| {
            conn.run_pending_migrations(MIGRATIONS)
                .map(|_| ())
                .map_err(|e| StoreError::Migration(e.to_string()))
        })
        .await
    }

    pub async fn ping(&self) -> StoreResult<()> {
        self.read("answer a ping", |c| {
            c.batch_execute("SELECT 1").context("answer a ping")
        })
        .await
    }

    /// Writes a consistent copy of the live database to `target`.
    pub async fn backup(&self, target: &Path) -> StoreResult<()> {
        let target = target.display().to_string();
        self.read("back up the database", move |c| {
            sql_query("VACUUM INTO ?")
                .bind::<Text, _>(target)
                .execute(c)
                .map(|_| ())
                .context("back up the database")
        })
        .await
    }
}

/// Puts the backup at `backup` in place of the database at `target`, which
/// no holdfast may have open: the backup must be a whole holdfast database
/// (`PRAGMA integrity_check`), the target's old write-ahead log and shared
/// memory files are removed (a stale log would be replayed into the restored
/// file), the copy is migrated and its feed position raised above the
/// replaced database's, and it is synced and renamed into place, so that a
/// crash leaves either the old database or the restored one.
pub fn restore(backup: &Path, target: &Path) -> StoreResult<()> {
    let fail = |what: &str, e: &dyn std::fmt::Display| {
        StoreError::Config(format!("cannot restore {}: {what}: {e}", backup.display()))
    };
    {
        let mut conn = SqliteConnection::establish(&backup.display().to_string())
            .map_err(|e| fail("cannot open it", &e))?;
        #[derive(QueryableByName)]
        struct Check {
            #[diesel(sql_type = Text)]
            integrity_check: String,
        }
        let checks = sql_query("PRAGMA integrity_check")
            .load::<Check>(&mut conn)
            .map_err(|e| fail("cannot check it", &e))?;
        if checks.len() != 1 || checks[0].integrity_check != "ok" {
            let found: Vec<String> = checks.into_iter().map(|c| c.integrity_check).collect();
            return Err(fail("it is damaged", &found.join("; ")));
        }
        let tables = sql_query(
            "SELECT name AS integrity_check FROM sqlite_master \
             WHERE type = 'table' AND name IN ('__diesel_schema_migrations', 'assets', 'events')",
        )
        .load::<Check>(&mut conn)
        .map_err(|e| fail("cannot read it", &e))?;
        if tables.len() != 3 {
            return Err(StoreError::Config(format!(
                "cannot restore {}: it is not a holdfast database",
                backup.display()
            )));
        }
    }
    let target = std::path::absolute(target)
        .map_err(|e| StoreError::Config(format!("cannot resolve {}: {e}", target.display())))?;
    let staging = target.with_extension("restoring");
    std::fs::copy(backup, &staging).map_err(|e| fail("cannot copy it", &e))?;
    {
        // Migrated now, so that its feed has its mark; the mark is raised
        // above every position handed out before the restore: above the
        // replaced database's mark when it can still be read, and above the
        // clock in microseconds, which positions (one more per event) stay
        // far below, for when the old file is lost.
        let mut conn = SqliteConnection::establish(&staging.display().to_string())
            .map_err(|e| fail("cannot open the copy", &e))?;
        conn.run_pending_migrations(MIGRATIONS)
            .map_err(|e| fail("cannot migrate it", &e))?;
        let replaced = target
            .exists()
            .then(|| last_position(&target))
            .flatten()
            .unwrap_or(0);
        sql_query("UPDATE feed_position SET last_position = max(last_position, ?, ?)")
            .bind::<BigInt, _>(replaced)
            .bind::<BigInt, _>(clock().timestamp_micros())
            .execute(&mut conn)
            .map_err(|e| fail("cannot raise its feed position", &e))?;
    }
    std::fs::File::open(&staging)
        .and_then(|f| f.sync_all())
        .map_err(|e| fail("cannot sync the copy", &e))?;
    for suffix in ["-wal", "-shm"] {
        let side = PathBuf::from(format!("{}{suffix}", target.display()));
        match std::fs::remove_file(&side) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(fail(&format!("cannot remove {}", side.display()), &e)),
        }
    }
    std::fs::rename(&staging, &target).map_err(|e| fail("cannot put it in place", &e))?;
    if let Some(dir) = target.parent() {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| fail("cannot sync the directory", &e))?;
    }
    Ok(())
}

/// The last feed position of the database at `path`, if it can be read.
fn last_position(path: &Path) -> Option<i64> {
    let mut conn = SqliteConnection::establish(&path.display().to_string()).ok()?;
    sql_query("SELECT last_position AS n FROM feed_position")
        .get_result::<Count>(&mut conn)
        .ok()
        .map(|c| c.n)
}

fn abort_to_error(abort: Abort) -> StoreError {
    abort.into_error()
}

/// A pool, and as many permits as it has connections. A call waits for a
/// permit before it takes a blocking thread, so that no more threads wait
/// for the pool than it has connections: under load, the queue is of tasks,
/// not of threads, each with its stack and its allocator's arena. The
/// threads are those of the runtime the store was opened on, one set shared
/// by every HTTP worker (each worker's runtime would keep a set of its own).
#[derive(Clone)]
struct Lane {
    pool: Pool<ConnectionManager<SqliteConnection>>,
    permits: Arc<Semaphore>,
    home: Home,
    /// How long a call waits for a connection, permit and pool together.
    wait: Duration,
}

async fn run<T, F>(lane: &Lane, context: &'static str, work: F) -> StoreResult<T>
where
    T: Send + 'static,
    F: FnOnce(&mut SqliteConnection) -> StoreResult<T> + Send + 'static,
{
    let permit = match tokio::time::timeout(lane.wait, lane.permits.clone().acquire_owned()).await {
        Ok(Ok(permit)) => permit,
        Ok(Err(closed)) => return Err(StoreError::unavailable(context, closed)),
        Err(_) => {
            let waited = format!("no connection came free within {:?}", lane.wait);
            return Err(StoreError::unavailable(context, waited));
        }
    };
    let pool = lane.pool.clone();
    let call = move || {
        let _permit = permit;
        let mut conn: Conn = pool
            .get()
            .map_err(|e| StoreError::unavailable(context, e))?;
        work(&mut conn)
    };
    lane.home
        .spawn_blocking(call)
        .await
        .map_err(|e| StoreError::unavailable(context, format!("the database task ended: {e}")))?
}

impl Backend for SqliteStore {
    /// Writes are serialised, so position order is commit order.
    async fn event_feed(&self, page: FeedPage) -> StoreResult<Vec<(FeedCursor, Event)>> {
        self.read("read the event feed", move |c| {
            let sql = if page.dead {
                format!(
                    "SELECT 0 AS tx, position, {EVENT_COLUMNS} FROM events WHERE dead_at IS \
                    NOT NULL AND position > ? \
                 ORDER BY position LIMIT ?"
                )
            } else {
                format!(
                    "SELECT 0 AS tx, position, {EVENT_COLUMNS} FROM events WHERE position > \
                    ? ORDER BY position LIMIT ?"
                )
            };
            let rows = sql_query(sql)
                .bind::<BigInt, _>(page.after.position)
                .bind::<BigInt, _>(page.limit)
                .load::<FeedRow>(c)
                .context("read the event feed")?;
            rows.into_iter().map(FeedRow::into_entry).collect()
        })
        .await
    }

    async fn claim_deliveries(&self, limit: i64, lease: Duration) -> StoreResult<Vec<Delivery>> {
        let lease = chrono::Duration::from_std(lease).unwrap_or(chrono::Duration::seconds(60));
        let rows = self
            .write("claim events to deliver", move |c| {
                let now = clock();
                Ok(sql_query(format!(
                    "UPDATE events SET attempts = attempts + 1, next_attempt_at = ?1 \
                     WHERE id IN (SELECT id FROM events \
                                  WHERE delivered_at IS NULL AND dead_at IS NULL \
                                    AND (next_attempt_at IS NULL OR next_attempt_at <= ?2) \
                                  ORDER BY position LIMIT ?3) \
                     RETURNING {EVENT_COLUMNS}, attempts"
                ))
                .bind::<Instant, _>(now + lease)
                .bind::<Instant, _>(now)
                .bind::<BigInt, _>(limit)
                .load::<ClaimedRow>(c)
                .context("claim events to deliver")?)
            })
            .await?
            .map_err(abort_to_error)?;
        rows.into_iter().map(ClaimedRow::into_delivery).collect()
    }

    async fn finish_delivery(&self, id: &str, result: &DeliveryResult) -> StoreResult<()> {
        let id = id.to_owned();
        let result = result.clone();
        self.write("record a delivery", move |c| {
            let now = clock();
            let (delivered, dead, next, error) = match result {
                DeliveryResult::Delivered => (Some(now), None, None, None),
                DeliveryResult::Failed {
                    error,
                    retry_in: Some(delay),
                } => (
                    None,
                    None,
                    Some(
                        now + chrono::Duration::from_std(delay)
                            .unwrap_or(chrono::Duration::hours(1)),
                    ),
                    Some(error),
                ),
                DeliveryResult::Failed {
                    error,
                    retry_in: None,
                } => (None, Some(now), None, Some(error)),
            };
            sql_query(
                "UPDATE events SET delivered_at = ?, dead_at = ?, next_attempt_at = ?, \
                    last_error = ? WHERE id = ?",
            )
            .bind::<Nullable<Instant>, _>(delivered)
            .bind::<Nullable<Instant>, _>(dead)
            .bind::<Nullable<Instant>, _>(next)
            .bind::<Nullable<Text>, _>(error)
            .bind::<Text, _>(id)
            .execute(c)
            .context("record a delivery")?;
            Ok(())
        })
        .await?
        .map_err(abort_to_error)
    }

    async fn refund_snapshot(&self, req: &CompleteRefundRequest) -> StoreResult<Snapshot<Refund>> {
        let (id, idempotency) = (req.refund_id.to_string(), req.idempotency.clone());
        self.read("read the refund", move |c| {
            let key = sql_query(
                "SELECT ? AS now, i.fingerprint, i.status_code, i.body, i.location \
                 FROM (SELECT 1) AS one LEFT JOIN idempotency_keys i ON i.scope = ? AND i.key = ?",
            )
            .bind::<Instant, _>(clock())
            .bind::<Text, _>(idempotency.scope)
            .bind::<Text, _>(idempotency.key.into_inner())
            .get_result::<KeySnapshotRow>(c)
            .context("read the idempotency key")?;
            Ok(key.with_row(shared::refund(c, &id)?))
        })
        .await
    }

    async fn asset_snapshot(&self, id: &AssetId) -> StoreResult<Snapshot<Asset>> {
        let id = id.to_string();
        self.read("read an asset", move |c| {
            let now = clock();
            let row = sql_query("SELECT ? AS now, * FROM assets WHERE id = ?")
                .bind::<Instant, _>(now)
                .bind::<Text, _>(id)
                .get_result::<NowAssetRow>(c)
                .optional()
                .context("read an asset")?;
            asset_snapshot(now, row)
        })
        .await
    }

    async fn expire_batch(&self, limit: i64) -> StoreResult<u64> {
        let expired = self
            .write("expire lapsed holds", move |c| {
                Ok(expire_lapsed(c, None, clock(), limit)?)
            })
            .await?
            .map_err(abort_to_error)?;
        Ok(expired as u64)
    }

    /// The purge statements take the rows created before the clock less the
    /// retention (?1), `limit` (?2) at a time.
    async fn purge_batch(&self, what: Purge, limit: i64, retention: Duration) -> StoreResult<u64> {
        let sql = match what {
            Purge::Keys => PURGE_KEYS_SQL,
            Purge::Events => PURGE_EVENTS_SQL,
        };
        let age = chrono::Duration::from_std(retention).unwrap_or(chrono::Duration::MAX);
        let purged = self
            .write(what.context(), move |c| {
                // A retention too long to count back from keeps every row.
                let Some(before) = clock().checked_sub_signed(age) else {
                    return Ok(0);
                };
                Ok(sql_query(sql)
                    .bind::<Instant, _>(before)
                    .bind::<BigInt, _>(limit)
                    .execute(c)
                    .context(what.context())?)
            })
            .await?
            .map_err(abort_to_error)?;
        Ok(purged as u64)
    }

    async fn hold_snapshot(&self, req: &HoldRequest) -> StoreResult<Snapshot<HoldTarget>> {
        let (asset, idempotency) = (req.asset_id.to_string(), req.idempotency.clone());
        self.read("read the asset to hold", move |c| {
            sql_query(
                "SELECT ? AS now, a.status, a.hold_expires_at, a.available_from, \
                        i.fingerprint, i.status_code, i.body, i.location \
                 FROM (SELECT 1) AS one \
                 LEFT JOIN assets a ON a.id = ? \
                 LEFT JOIN idempotency_keys i ON i.scope = ? AND i.key = ?",
            )
            .bind::<Instant, _>(clock())
            .bind::<Text, _>(asset)
            .bind::<Text, _>(idempotency.scope)
            .bind::<Text, _>(idempotency.key.into_inner())
            .get_result::<HoldSnapshotRow>(c)
            .context("read the asset to hold")?
            .into_snapshot()
        })
        .await
    }

    async fn claim(&self, draft: &HoldDraft<'_>, reclaim: bool) -> StoreResult<Claim> {
        let r = draft.reservation.clone();
        let idem = draft.request.idempotency.clone();
        let reply = draft.reply.clone();
        let event_id = draft.event_id.to_string();
        let limit = draft.request.max_live_holds;
        let result = self
            .write("hold the asset", move |c| {
                let now = r.created_at;
                if let Some(limit) = limit {
                    // Writes are serialised: this count is current.
                    let live = sql_query(
                        "SELECT count(*) AS n FROM reservations \
                         WHERE owner = ? AND buyer_id = ? AND status = 'HELD' AND expires_at > ?",
                    )
                    .bind::<Text, _>(&r.owner)
                    .bind::<Text, _>(&r.buyer_id)
                    .bind::<Instant, _>(now)
                    .get_result::<Count>(c)
                    .context("count the buyer's live holds")?;
                    if live.n >= limit {
                        return Ok(Claim::LimitReached);
                    }
                }
                if reclaim {
                    expire_lapsed(c, Some(&r.asset_id), now, 1)?;
                }
                let sequence = sql_query(
                    "UPDATE assets SET status = 'HELD', hold_expires_at = ?, \
                        current_reservation_id = ?, \
                            version = version + 1, last_event_sequence = last_event_sequence + \
                                1, updated_at = ? \
                     WHERE id = ? AND status = 'AVAILABLE' AND (available_from IS NULL OR \
                         available_from <= ?) \
                     RETURNING last_event_sequence",
                )
                .bind::<Instant, _>(r.expires_at)
                .bind::<Text, _>(&r.reservation_id)
                .bind::<Instant, _>(now)
                .bind::<Text, _>(&r.asset_id)
                .bind::<Instant, _>(now)
                .get_result::<Sequence>(c)
                .optional()
                .context("hold the asset")?;
                let Some(sequence) = sequence else {
                    return Err(Abort::Retry);
                };
                sql_query(
                    "INSERT INTO reservations (id, asset_id, buyer_id, status, expires_at, \
                        created_at, owner) \
                     VALUES (?, ?, ?, 'HELD', ?, ?, ?)",
                )
                .bind::<Text, _>(&r.reservation_id)
                .bind::<Text, _>(&r.asset_id)
                .bind::<Text, _>(&r.buyer_id)
                .bind::<Instant, _>(r.expires_at)
                .bind::<Instant, _>(now)
                .bind::<Text, _>(&r.owner)
                .execute(c)
                .context("record the reservation")?;
                let mut event = NewEvent::new(
                    &r.asset_id,
                    EventType::ReservationHeld,
                    reply.body.clone(),
                    now,
                )
                .about(&r.reservation_id);
                event.id = event_id;
                event.sequence = sequence.last_event_sequence;
                insert_event(c, &event)?;
                shared::store_answer(c, &idem, &reply, &r.reservation_id, now)?;
                Ok(Claim::Claimed)
            })
            .await?;
        Abort::settle(result, Claim::Taken)
    }

    async fn reservation_snapshot(&self, target: Target<'_>) -> StoreResult<Snapshot<Reservation>> {
        let (id, idempotency) = (target.id.to_string(), target.idempotency.clone());
        let scope = target.payment.map(|p| p.scope.to_owned());
        let reference = target.payment.map(|p| p.reference.to_owned());
        self.read("read the reservation", move |c| {
            sql_query(RESERVATION_SNAPSHOT_SQL)
                .bind::<Instant, _>(clock())
                .bind::<Text, _>(id)
                .bind::<Text, _>(idempotency.scope)
                .bind::<Text, _>(idempotency.key.into_inner())
                .bind::<Nullable<Text>, _>(scope)
                .bind::<Nullable<Text>, _>(reference)
                .get_result::<ReservationSnapshotRow>(c)
                .context("read the reservation")?
                .into_snapshot()
        })
        .await
    }

    async fn payment_fates(&self, scope: Option<&str>, reference: &str) -> StoreResult<Fates> {
        let (scope, reference) = (scope.map(str::to_owned), reference.to_owned());
        self.read("read a payment", move |c| {
            let now = clock();
            let rows = shared::payment_fates(c, scope.as_deref(), &reference)?;
            Ok(Fates { now, rows })
        })
        .await
    }

    async fn reload(&self, id: &ReservationId, now: Timestamp) -> StoreResult<Reservation> {
        let id = id.to_string();
        self.read("read a reservation", move |c| shared::reload(c, &id, now))
            .await
    }

    async fn transition<T: Send + 'static>(
        &self,
        change: super::flow::Change,
        idempotency: Option<&Idempotency>,
        assemble: Assemble<T>,
    ) -> StoreResult<Option<T>> {
        let idempotency = idempotency.cloned();
        let result = self
            .write("change the reservation", move |c| {
                // Judged at the write's own clock, after any wait for the writer.
                let now = match &change {
                    super::flow::Change::Refund { refund, .. } => refund.created_at,
                    _ => clock(),
                };
                let Some(changed) = shared::apply(c, &change, now)? else {
                    return Err(Abort::Retry);
                };
                let written = assemble(&changed)?;
                Ok(shared::write_after(
                    c,
                    change.asset_id(),
                    &changed,
                    written,
                    idempotency.as_ref(),
                )?)
            })
            .await?;
        Abort::settle(result.map(Some), None)
    }
}

const PURGE_EVENTS_SQL: &str = "\
DELETE FROM events WHERE position IN ( \
SELECT position FROM events WHERE delivered_at IS NOT NULL AND created_at < ? \
ORDER BY position LIMIT ?)";

const PURGE_KEYS_SQL: &str = "\
DELETE FROM idempotency_keys WHERE rowid IN ( \
SELECT rowid FROM idempotency_keys WHERE created_at < ? ORDER BY created_at LIMIT ?)";

/// A reservation's first read: the clock, the reservation, the answer stored
/// under the key, and the fate of the payment a commit carries (?5 scope, ?6
/// reference; NULL for other requests). Sales recorded before scopes (scope
/// '') count in every scope.
const RESERVATION_SNAPSHOT_SQL: &str = "\
SELECT ?1 AS now, r.id, r.asset_id, r.buyer_id, r.status, r.expires_at, r.created_at,
       r.committed_at, r.released_at, r.payment_reference, r.owner, r.voided_at, r.payment_scope,
       i.fingerprint, i.status_code, i.body, i.location,
       p.reservation_id AS fate_reservation_id, p.refund_id AS fate_refund_id
  FROM (SELECT 1) AS one
  LEFT JOIN reservations r ON r.id = ?2
  LEFT JOIN idempotency_keys i ON i.scope = ?3 AND i.key = ?4
  LEFT JOIN payments p ON p.reference = ?6 AND p.scope IN (?5, '')
 ORDER BY p.scope DESC NULLS LAST LIMIT 1";

#[derive(QueryableByName)]
struct Sequence {
    #[diesel(sql_type = BigInt)]
    last_event_sequence: i64,
}

/// Expires lapsed holds (of one asset, or up to `limit` of any) as of `now`.
pub(crate) fn expire_lapsed(
    conn: &mut SqliteConnection,
    asset: Option<&str>,
    now: Timestamp,
    limit: i64,
) -> StoreResult<usize> {
    #[derive(QueryableByName)]
    struct Id {
        #[diesel(sql_type = Text)]
        id: String,
    }
    let lapsed = sql_query(
        "SELECT id FROM assets WHERE status = 'HELD' AND hold_expires_at <= ?1 AND (?2 IS NULL \
            OR id = ?2) \
         ORDER BY id LIMIT ?3",
    )
    .bind::<Instant, _>(now)
    .bind::<Nullable<Text>, _>(asset)
    .bind::<BigInt, _>(limit)
    .load::<Id>(conn)
    .context("find lapsed holds")?;
    for Id { id } in &lapsed {
        let sequence = sql_query(
            "UPDATE assets SET status = 'AVAILABLE', hold_expires_at = NULL, \
                current_reservation_id = NULL, \
                    version = version + 1, last_event_sequence = last_event_sequence + 1, \
                        updated_at = ?1 \
             WHERE id = ?2 RETURNING last_event_sequence",
        )
        .bind::<Instant, _>(now)
        .bind::<Text, _>(id)
        .get_result::<Sequence>(conn)
        .context("expire a lapsed hold")?;
        let row = sql_query(
            "UPDATE reservations SET status = 'EXPIRED' WHERE asset_id = ? AND status = 'HELD' \
                RETURNING *",
        )
        .bind::<Text, _>(id)
        .get_result::<ReservationRow>(conn)
        .context("expire a lapsed reservation")?;
        let reservation = row.into_reservation()?;
        insert_event(
            conn,
            &expired_event(&reservation, sequence.last_event_sequence, now),
        )?;
    }
    Ok(lapsed.len())
}

/// An event; its owner is the owner of the reservation it reports (?7). Its
/// feed position is one above the last one handed out, which `feed_position`
/// keeps in a row that purging never deletes (its trigger moves it up in the
/// same transaction): positions only ever grow, whatever the clock does.
const INSERT_EVENT_SQL: &str = "\
INSERT INTO events (position, id, asset_id, sequence, type, data, created_at, owner, actor)
VALUES ((SELECT last_position FROM feed_position) + 1,
        ?1, ?2, ?3, ?4, ?5, ?6, (SELECT owner FROM reservations WHERE id = ?7), ?8)";

pub(crate) fn insert_event(conn: &mut SqliteConnection, event: &NewEvent) -> StoreResult<()> {
    event
        .bound::<Sqlite>(INSERT_EVENT_SQL)
        .execute(conn)
        .context("record an event")?;
    Ok(())
}
