//! SQLite, the embedded default: diesel with the bundled library, an r2d2
//! pool of readers and a single writer connection, WAL, and `BEGIN IMMEDIATE`
//! for every write transaction. All work runs on blocking threads. The
//! process clock is this database's clock.

use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{SubsecRound, Utc};
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, CustomizeConnection, Pool, PooledConnection};
use diesel::sql_query;
use diesel::sql_types::{BigInt, Integer, Nullable, Text};
use diesel::sqlite::SqliteConnection;
use diesel_migrations::{embed_migrations, EmbeddedMigrations, MigrationHarness};

use super::audit::{self, Finding, CHECKS};
use super::error::{Abort, Context};
use super::flow::{Backend, Claim, HoldDraft, PaymentKey, Snapshot};
use super::rows::{
    parse_reservation_id, reservation_page_query, with_refunds, ClaimedRow, Count, EventRow,
    FeedRow, HoldSnapshotRow, KeySnapshotRow, NewEvent, NowAssetRow, PaymentRow, ReadAssetRow,
    RefundRow, ReservationRow, ReservationSnapshotRow, EVENT_COLUMNS, HOLDER_COLUMN,
};
use super::schema::{assets, events, payments, refunds, reservations, At, Instant};
use super::{
    AssetPage, Delivery, DeliveryResult, FeedCursor, Idempotency, PoolStatus, RefundPage,
    ReinstateOutcome, ReservationPage, StoreError, StoreResult, StoreSettings, WithdrawOutcome,
};
use crate::domain::{
    extension_allowed, withdraw_decision, Asset, AssetId, AssetStatus, Event, EventId, EventType,
    HoldTarget, Refund, RefundId, RefundReason, Reservation, ReservationId, Timestamp,
    WithdrawDecision,
};
use crate::reply::{self, Reply};

pub const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/sqlite");

type Conn = PooledConnection<ConnectionManager<SqliteConnection>>;

/// The clock of the embedded database: this process's, to the microsecond.
fn clock() -> Timestamp {
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
    readers: Pool<ConnectionManager<SqliteConnection>>,
    /// One connection: writers queue here instead of spinning on SQLite's lock.
    writer: Pool<ConnectionManager<SqliteConnection>>,
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
            Pool::builder()
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
                .map_err(|e| StoreError::Config(format!("cannot open {}: {e}", path.display())))
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
        run(self.writer.clone(), "read a setting", |c| {
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
        let (readers, writer) = (self.readers.state(), self.writer.state());
        let size = (readers.connections + writer.connections) as usize;
        let idle = (readers.idle_connections + writer.idle_connections) as usize;
        PoolStatus {
            size,
            in_use: size.saturating_sub(idle),
            waiting: 0,
        }
    }

    async fn read<T, F>(&self, context: &'static str, work: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut SqliteConnection) -> StoreResult<T> + Send + 'static,
    {
        run(self.readers.clone(), context, work).await
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
        run(self.writer.clone(), context, move |conn| {
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

    pub async fn migrate(&self) -> StoreResult<()> {
        run(self.writer.clone(), "migrate", |conn| {
            conn.run_pending_migrations(MIGRATIONS)
                .map(|_| ())
                .map_err(|e| StoreError::Migration(e.to_string()))
        })
        .await
    }

    pub async fn audit(&self, events_since: Timestamp) -> StoreResult<Vec<Finding>> {
        self.read("audit the invariants", move |c| {
            let mut findings = Vec::new();
            for check in CHECKS {
                let rows = sql_query(audit::statement(check.sql, "$1"))
                    .bind::<Instant, _>(events_since)
                    .load::<audit::Row>(c)
                    .context("run an audit check")?;
                findings.push(audit::finding(check, rows));
            }
            Ok(findings)
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

    pub async fn create_asset(
        &self,
        id: &AssetId,
        name: &str,
        available_from: Option<Timestamp>,
    ) -> StoreResult<Option<Asset>> {
        let (id, name) = (id.to_string(), name.to_owned());
        let result = self
            .write("create an asset", move |c| {
                let now = clock();
                let row = sql_query(
                    "INSERT INTO assets (id, name, available_from, created_at, updated_at) \
                     VALUES (?1, ?2, ?3, ?4, ?4) \
                     ON CONFLICT (id) DO NOTHING RETURNING ?4 AS now, *",
                )
                .bind::<Text, _>(id)
                .bind::<Text, _>(name)
                .bind::<Nullable<Instant>, _>(available_from)
                .bind::<Instant, _>(now)
                .get_result::<NowAssetRow>(c)
                .optional()
                .context("create an asset")?;
                Ok(row)
            })
            .await?;
        match result {
            Ok(row) => row.map(|r| r.asset.into_asset(r.now)).transpose(),
            Err(Abort::Retry) => Ok(None),
            Err(other) => Err(other.into_error()),
        }
    }

    /// Sets or clears the instant an asset's sale opens.
    pub async fn set_available_from(
        &self,
        id: &AssetId,
        available_from: Option<Timestamp>,
    ) -> StoreResult<Option<Asset>> {
        let id = id.to_string();
        self.write("set when the sale opens", move |c| {
            let now = clock();
            let row = sql_query(
                "UPDATE assets SET available_from = ?2, version = version + 1, updated_at = ?3 \
                 WHERE id = ?1 RETURNING ?3 AS now, *",
            )
            .bind::<Text, _>(id)
            .bind::<Nullable<Instant>, _>(available_from)
            .bind::<Instant, _>(now)
            .get_result::<NowAssetRow>(c)
            .optional()
            .context("set when the sale opens")?;
            Ok(row.map(|r| r.asset.into_asset(now)).transpose()?)
        })
        .await?
        .map_err(abort_to_error)
    }

    /// Takes an asset off sale; with `force`, a live hold is released first.
    /// A lapsed hold is expired first. Writes are serialised.
    pub async fn withdraw(
        &self,
        id: &AssetId,
        force: bool,
        actor: &str,
    ) -> StoreResult<WithdrawOutcome> {
        let (id, actor) = (id.to_string(), actor.to_owned());
        self.write("withdraw the asset", move |c| {
            let now = clock();
            expire_lapsed(c, Some(&id), now, 1)?;
            let row = sql_query("SELECT ? AS now, * FROM assets WHERE id = ?")
                .bind::<Instant, _>(now)
                .bind::<Text, _>(&id)
                .get_result::<NowAssetRow>(c)
                .optional()
                .context("read the asset")?;
            let Some(row) = row else {
                return Ok(WithdrawOutcome::NotFound);
            };
            let asset = row.asset.into_asset(now)?;
            match withdraw_decision(asset.status, force) {
                WithdrawDecision::AlreadyWithdrawn => return Ok(WithdrawOutcome::Unchanged(asset)),
                WithdrawDecision::Held => return Ok(WithdrawOutcome::Held(asset)),
                WithdrawDecision::Sold => return Ok(WithdrawOutcome::Sold(asset)),
                WithdrawDecision::ReleaseAndWithdraw => {
                    let released = sql_query(
                        "UPDATE reservations SET status = 'RELEASED', released_at = ? \
                         WHERE id = ? AND status = 'HELD' RETURNING *",
                    )
                    .bind::<Instant, _>(now)
                    .bind::<Text, _>(asset.current_reservation_id.as_deref().unwrap_or_default())
                    .get_result::<ReservationRow>(c)
                    .context("release the hold")?
                    .into_reservation()?;
                    let sequence = next_sequence(c, &id)?;
                    let data = reply::reservation_ok(&released).body;
                    let event =
                        NewEvent::new(&id, sequence, EventType::ReservationReleased, data, now)
                            .about(&released.reservation_id)
                            .by(&actor);
                    insert_event(c, &event)?;
                }
                WithdrawDecision::Withdraw => {}
            }
            let row = sql_query(
                "UPDATE assets SET status = 'WITHDRAWN', hold_expires_at = NULL, current_reservation_id = NULL, \
                        version = version + 1, last_event_sequence = last_event_sequence + 1, updated_at = ?2 \
                 WHERE id = ?1 RETURNING ?2 AS now, *",
            )
            .bind::<Text, _>(&id)
            .bind::<Instant, _>(now)
            .get_result::<NowAssetRow>(c)
            .context("withdraw the asset")?;
            let sequence = row.asset.last_event_sequence;
            let asset = row.asset.into_asset(now)?;
            let data = serde_json::to_string(&asset).unwrap_or_default();
            let event =
                NewEvent::new(&id, sequence, EventType::AssetWithdrawn, data, now).by(&actor);
            insert_event(c, &event)?;
            Ok(WithdrawOutcome::Withdrawn(asset))
        })
        .await?
        .map_err(abort_to_error)
    }

    /// Puts a WITHDRAWN asset back on sale; anything else stays as it is.
    pub async fn reinstate(&self, id: &AssetId, actor: &str) -> StoreResult<ReinstateOutcome> {
        let (id, actor) = (id.to_string(), actor.to_owned());
        self.write("reinstate the asset", move |c| {
            let now = clock();
            let row = sql_query(
                "UPDATE assets SET status = 'AVAILABLE', version = version + 1, \
                        last_event_sequence = last_event_sequence + 1, updated_at = ?2 \
                 WHERE id = ?1 AND status = 'WITHDRAWN' RETURNING ?2 AS now, *",
            )
            .bind::<Text, _>(&id)
            .bind::<Instant, _>(now)
            .get_result::<NowAssetRow>(c)
            .optional()
            .context("reinstate the asset")?;
            if let Some(row) = row {
                let sequence = row.asset.last_event_sequence;
                let asset = row.asset.into_asset(now)?;
                let data = serde_json::to_string(&asset).unwrap_or_default();
                let event =
                    NewEvent::new(&id, sequence, EventType::AssetReinstated, data, now).by(&actor);
                insert_event(c, &event)?;
                return Ok(ReinstateOutcome::Reinstated(asset));
            }
            let row = sql_query("SELECT ? AS now, * FROM assets WHERE id = ?")
                .bind::<Instant, _>(now)
                .bind::<Text, _>(&id)
                .get_result::<NowAssetRow>(c)
                .optional()
                .context("read an asset")?;
            Ok(match row {
                Some(r) => ReinstateOutcome::Unchanged(r.asset.into_asset(now)?),
                None => ReinstateOutcome::NotFound,
            })
        })
        .await?
        .map_err(abort_to_error)
    }

    pub async fn get_asset(&self, id: &AssetId) -> StoreResult<Option<Asset>> {
        let id = id.to_string();
        self.read("read an asset", move |c| {
            let row = sql_query(format!(
                "SELECT ? AS now, a.*, {HOLDER_COLUMN} FROM assets a WHERE a.id = ?"
            ))
            .bind::<Instant, _>(clock())
            .bind::<Text, _>(id)
            .get_result::<ReadAssetRow>(c)
            .optional()
            .context("read an asset")?;
            row.map(ReadAssetRow::into_asset).transpose()
        })
        .await
    }

    pub async fn list_assets(&self, page: &AssetPage) -> StoreResult<Vec<Asset>> {
        let page = page.clone();
        self.read("list assets", move |c| {
            let now = clock();
            let rows = sql_query(format!(
                "SELECT ?1 AS now, a.*, {HOLDER_COLUMN} FROM assets a \
                 WHERE (?2 IS NULL OR id > ?2) AND CASE ?3 \
                   WHEN 'AVAILABLE' THEN status = 'AVAILABLE' OR (status = 'HELD' AND hold_expires_at <= ?1) \
                   WHEN 'HELD' THEN status = 'HELD' AND hold_expires_at > ?1 \
                   WHEN 'SOLD' THEN status = 'SOLD' WHEN 'WITHDRAWN' THEN status = 'WITHDRAWN' \
                   ELSE 1 END \
                 ORDER BY id LIMIT ?4"
            ))
            .bind::<Instant, _>(now)
            .bind::<Nullable<Text>, _>(page.after)
            .bind::<Nullable<Text>, _>(page.status.map(AssetStatus::as_str))
            .bind::<BigInt, _>(page.limit)
            .load::<ReadAssetRow>(c)
            .context("list assets")?;
            rows.into_iter().map(ReadAssetRow::into_asset).collect()
        })
        .await
    }

    pub async fn asset_events(
        &self,
        id: &AssetId,
        after: i64,
        limit: i64,
    ) -> StoreResult<Option<Vec<Event>>> {
        let id = id.to_string();
        self.read("read an asset's events", move |c| {
            let exists = assets::table
                .find(&id)
                .select(assets::id)
                .first::<String>(c)
                .optional()
                .context("find an asset")?
                .is_some();
            if !exists {
                return Ok(None);
            }
            let rows = events::table
                .filter(events::asset_id.eq(&id))
                .filter(events::sequence.gt(after))
                .order(events::sequence.asc())
                .limit(limit)
                .select(EventRow::as_select())
                .load::<EventRow>(c)
                .context("read an asset's events")?;
            rows.into_iter()
                .map(EventRow::into_event)
                .collect::<StoreResult<_>>()
                .map(Some)
        })
        .await
    }

    /// The reservation, when `visible_to` (if given) owns it: another
    /// client's is not read beyond the filter, exactly like a missing one.
    pub async fn get_reservation(
        &self,
        id: &ReservationId,
        visible_to: Option<&str>,
    ) -> StoreResult<Option<Reservation>> {
        let (id, visible_to) = (*id, visible_to.map(str::to_owned));
        self.read("read a reservation", move |c| {
            load_visible_reservation(c, &id, clock(), visible_to.as_deref())
        })
        .await
    }

    /// One page of reservations, newest first, with their refunds.
    pub async fn list_reservations(&self, page: &ReservationPage) -> StoreResult<Vec<Reservation>> {
        let page = page.clone();
        self.read("list reservations", move |c| {
            let now = clock();
            let query = reservation_page_query!(
                reservations::table.into_boxed::<diesel::sqlite::Sqlite>(),
                page,
                now
            );
            let rows = query
                .load::<ReservationRow>(c)
                .context("list reservations")?;
            let ids: Vec<&str> = rows.iter().map(|r| r.id.as_str()).collect();
            let refund_rows = refunds::table
                .filter(refunds::reservation_id.eq_any(&ids))
                .order((refunds::created_at.asc(), refunds::id.asc()))
                .select(RefundRow::as_select())
                .load::<RefundRow>(c)
                .context("read the reservations' refunds")?;
            with_refunds(rows, refund_rows, now)
        })
        .await
    }
}

/// Puts the backup at `backup` in place of the database at `target`, which
/// no holdfast may have open: the backup must be a whole holdfast database
/// (`PRAGMA integrity_check`), the target's old write-ahead log and shared
/// memory files are removed (a stale log would be replayed into the restored
/// file), and the copy is synced and renamed into place, so that a crash
/// leaves either the old database or the restored one.
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

fn abort_to_error(abort: Abort) -> StoreError {
    abort.into_error()
}

async fn run<T, F>(
    pool: Pool<ConnectionManager<SqliteConnection>>,
    context: &'static str,
    work: F,
) -> StoreResult<T>
where
    T: Send + 'static,
    F: FnOnce(&mut SqliteConnection) -> StoreResult<T> + Send + 'static,
{
    tokio::task::spawn_blocking(move || {
        let mut conn: Conn = pool
            .get()
            .map_err(|e| StoreError::unavailable(context, e))?;
        work(&mut conn)
    })
    .await
    .map_err(|e| StoreError::unavailable(context, format!("the database task ended: {e}")))?
}

/// Delivery of events, the event feed and refunds. Writes are serialised,
/// so position order is commit order.
impl SqliteStore {
    pub async fn list_refunds(&self, page: &RefundPage) -> StoreResult<Vec<Refund>> {
        let page = page.clone();
        self.read("list refunds", move |c| {
            let mut query = refunds::table
                .select(RefundRow::as_select())
                .order(refunds::id.asc())
                .limit(page.limit)
                .into_boxed();
            if let Some(status) = page.status {
                query = query.filter(refunds::status.eq(status.as_str()));
            }
            if let Some(after) = page.after {
                query = query.filter(refunds::id.gt(after));
            }
            let rows = query.load::<RefundRow>(c).context("list refunds")?;
            rows.into_iter().map(RefundRow::into_refund).collect()
        })
        .await
    }

    pub async fn event_feed(
        &self,
        after: FeedCursor,
        limit: i64,
        dead: bool,
    ) -> StoreResult<Vec<(FeedCursor, Event)>> {
        self.read("read the event feed", move |c| {
            let sql = if dead {
                format!("SELECT 0 AS tx, position, {EVENT_COLUMNS} FROM events WHERE dead_at IS NOT NULL AND position > ? \
                 ORDER BY position LIMIT ?")
            } else {
                format!("SELECT 0 AS tx, position, {EVENT_COLUMNS} FROM events WHERE position > ? ORDER BY position LIMIT ?")
            };
            let rows = sql_query(sql)
                .bind::<BigInt, _>(after.position)
                .bind::<BigInt, _>(limit)
                .load::<FeedRow>(c)
                .context("read the event feed")?;
            rows.into_iter()
                .map(|r| {
                    let cursor = FeedCursor { tx: r.tx, position: r.position };
                    r.event.into_event().map(|e| (cursor, e))
                })
                .collect()
        })
        .await
    }

    pub async fn redeliver(&self, id: &EventId) -> StoreResult<Option<Event>> {
        let id = id.to_string();
        let row = self
            .write("schedule an event again", move |c| {
                Ok(sql_query(format!(
                    "UPDATE events SET delivered_at = NULL, dead_at = NULL, attempts = 0, next_attempt_at = NULL, \
                            last_error = NULL WHERE id = ? RETURNING {EVENT_COLUMNS}"
                ))
                .bind::<Text, _>(id)
                .get_result::<EventRow>(c)
                .optional()
                .context("schedule an event again")?)
            })
            .await?
            .map_err(abort_to_error)?;
        row.map(EventRow::into_event).transpose()
    }

    pub async fn claim_deliveries(
        &self,
        limit: i64,
        lease: Duration,
    ) -> StoreResult<Vec<Delivery>> {
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
        rows.into_iter()
            .map(|r| {
                r.event.into_event().map(|event| Delivery {
                    event,
                    attempt: r.attempts,
                })
            })
            .collect()
    }

    pub async fn finish_delivery(&self, id: &str, result: &DeliveryResult) -> StoreResult<()> {
        let id = id.to_owned();
        let result = result.clone();
        self.write("record a delivery", move |c| {
            let now = clock();
            let (delivered, dead, next, error) = match result {
                DeliveryResult::Delivered => (Some(now), None, None, None),
                DeliveryResult::Failed { error, retry_in: Some(delay) } => (
                    None,
                    None,
                    Some(now + chrono::Duration::from_std(delay).unwrap_or(chrono::Duration::hours(1))),
                    Some(error),
                ),
                DeliveryResult::Failed { error, retry_in: None } => (None, Some(now), None, Some(error)),
            };
            sql_query(
                "UPDATE events SET delivered_at = ?, dead_at = ?, next_attempt_at = ?, last_error = ? WHERE id = ?",
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
}

impl Backend for SqliteStore {
    async fn refund_snapshot(
        &self,
        id: &RefundId,
        idempotency: &Idempotency,
    ) -> StoreResult<Snapshot<Refund>> {
        let (id, idempotency) = (id.to_string(), idempotency.clone());
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
            let refund = refunds::table
                .find(id)
                .select(RefundRow::as_select())
                .first::<RefundRow>(c)
                .optional()
                .context("read a refund")?;
            Ok(Snapshot {
                now: key.now,
                row: refund.map(RefundRow::into_refund).transpose()?,
                stored: key.stored.into_answer(),
                fate: None,
            })
        })
        .await
    }

    async fn complete_refund(
        &self,
        refund: &Refund,
        idempotency: &Idempotency,
    ) -> StoreResult<Option<Reply>> {
        let (id, idempotency) = (refund.refund_id.clone(), idempotency.clone());
        let result = self
            .write("complete a refund", move |c| {
                let now = clock();
                let row = sql_query(
                    "UPDATE refunds SET status = 'COMPLETED', completed_at = ? \
                     WHERE id = ? AND status = 'REQUESTED' RETURNING *",
                )
                .bind::<Instant, _>(now)
                .bind::<Text, _>(id)
                .get_result::<RefundRow>(c)
                .optional()
                .context("complete a refund")?;
                let Some(row) = row else {
                    return Err(Abort::Retry);
                };
                let completed = row.into_refund()?;
                let sequence = next_sequence(c, &completed.asset_id)?;
                let reply = Reply::json(200, &completed);
                let event = NewEvent::new(
                    &completed.asset_id,
                    sequence,
                    EventType::RefundCompleted,
                    reply.body.clone(),
                    now,
                )
                .about(&completed.reservation_id);
                record(
                    c,
                    &event,
                    &idempotency,
                    &reply,
                    &completed.reservation_id,
                    now,
                )?;
                Ok(reply)
            })
            .await?;
        Abort::settle(result.map(Some), None)
    }

    async fn purge_events_batch(&self, limit: i64) -> StoreResult<u64> {
        let Some(retention) = self.settings.event_retention else {
            return Ok(0);
        };
        let retention =
            chrono::Duration::from_std(retention).unwrap_or(chrono::Duration::days(36500));
        let purged = self
            .write("purge delivered events", move |c| {
                Ok(sql_query(
                    "DELETE FROM events WHERE position IN ( \
                       SELECT position FROM events WHERE delivered_at IS NOT NULL AND created_at < ? \
                       ORDER BY position LIMIT ?)",
                )
                .bind::<Instant, _>(clock() - retention)
                .bind::<BigInt, _>(limit)
                .execute(c)
                .context("purge delivered events")?)
            })
            .await?
            .map_err(abort_to_error)?;
        Ok(purged as u64)
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

    async fn purge_batch(&self, limit: i64) -> StoreResult<u64> {
        let retention = chrono::Duration::from_std(self.settings.idempotency_retention)
            .unwrap_or(chrono::Duration::hours(24));
        let purged = self
            .write("purge idempotency records", move |c| {
                Ok(sql_query(
                    "DELETE FROM idempotency_keys WHERE rowid IN ( \
                       SELECT rowid FROM idempotency_keys WHERE created_at < ? ORDER BY created_at LIMIT ?)",
                )
                .bind::<Instant, _>(clock() - retention)
                .bind::<BigInt, _>(limit)
                .execute(c)
                .context("purge idempotency records")?)
            })
            .await?
            .map_err(abort_to_error)?;
        Ok(purged as u64)
    }

    async fn hold_snapshot(
        &self,
        asset: &AssetId,
        idempotency: &Idempotency,
    ) -> StoreResult<Snapshot<HoldTarget>> {
        let (asset, idempotency) = (asset.to_string(), idempotency.clone());
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
                    "UPDATE assets SET status = 'HELD', hold_expires_at = ?, current_reservation_id = ?, \
                            version = version + 1, last_event_sequence = last_event_sequence + 1, updated_at = ? \
                     WHERE id = ? AND status = 'AVAILABLE' AND (available_from IS NULL OR available_from <= ?) \
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
                    "INSERT INTO reservations (id, asset_id, buyer_id, status, expires_at, created_at, owner) \
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
                    sequence.last_event_sequence,
                    EventType::ReservationHeld,
                    reply.body.clone(),
                    now,
                )
                .about(&r.reservation_id);
                event.id = event_id;
                record(c, &event, &idem, &reply, &r.reservation_id, now)?;
                Ok(Claim::Claimed)
            })
            .await?;
        Abort::settle(result, Claim::Taken)
    }

    async fn reservation_snapshot(
        &self,
        id: &ReservationId,
        idempotency: &Idempotency,
        payment: Option<PaymentKey<'_>>,
    ) -> StoreResult<Snapshot<Reservation>> {
        let (id, idempotency) = (id.to_string(), idempotency.clone());
        let scope = payment.map(|p| p.scope.to_owned());
        let reference = payment.map(|p| p.reference.to_owned());
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

    async fn payment_fates(
        &self,
        scope: Option<&str>,
        reference: &str,
    ) -> StoreResult<(Timestamp, Vec<PaymentRow>)> {
        let (scope, reference) = (scope.map(str::to_owned), reference.to_owned());
        self.read("read a payment", move |c| {
            let mut query = payments::table
                .filter(payments::reference.eq(reference))
                .select(PaymentRow::as_select())
                .order(payments::scope.desc())
                .into_boxed();
            if let Some(scope) = scope {
                query = query.filter(payments::scope.eq_any([scope, String::new()]));
            }
            let rows = query.load::<PaymentRow>(c).context("read a payment")?;
            Ok((clock(), rows))
        })
        .await
    }

    async fn load_reservation(
        &self,
        id: &ReservationId,
        now: Timestamp,
    ) -> StoreResult<Option<Reservation>> {
        let id = *id;
        self.read("read a reservation", move |c| load_reservation(c, &id, now))
            .await
    }

    async fn commit(
        &self,
        reservation: &Reservation,
        payment: PaymentKey<'_>,
        idempotency: &Idempotency,
    ) -> StoreResult<Option<Reply>> {
        let payment = (payment.scope.to_owned(), payment.reference.to_owned());
        self.finish_transition(reservation, idempotency, Some(payment))
            .await
    }

    async fn refund(
        &self,
        reservation: &Reservation,
        payment: PaymentKey<'_>,
        reason: RefundReason,
        idempotency: &Idempotency,
        now: Timestamp,
    ) -> StoreResult<Reply> {
        let reservation = reservation.clone();
        let (scope, reference) = (payment.scope.to_owned(), payment.reference.to_owned());
        let idempotency = idempotency.clone();
        let result = self
            .write("record a refund", move |c| {
                // A lapsed hold nobody swept yet is expired first, so the
                // timeline reads held → expired → refund requested.
                expire_lapsed(c, Some(&reservation.asset_id), now, 1)?;
                let sequence = next_sequence(c, &reservation.asset_id)?;
                let refund = Refund::requested(&reservation, &scope, &reference, reason, now);
                insert_refund(c, &refund)?;
                let payment = PaymentKey {
                    scope: &scope,
                    reference: &reference,
                };
                record_fate(
                    c,
                    payment,
                    &refund.reservation_id,
                    Some(&refund.refund_id),
                    now,
                )?;
                let id = parse_reservation_id(&reservation.reservation_id)?;
                let current = load_reservation(c, &id, now)?
                    .ok_or_else(|| StoreError::Corrupt(format!("reservation {id} vanished")))?;
                let reply = reply::commit_refused(reason, &current, &refund).into_reply();
                let data = serde_json::to_string(&refund).unwrap_or_default();
                let event = NewEvent::new(
                    &refund.asset_id,
                    sequence,
                    EventType::RefundRequested,
                    data,
                    now,
                )
                .about(&refund.reservation_id);
                record(c, &event, &idempotency, &reply, &refund.reservation_id, now)?;
                Ok(reply)
            })
            .await?;
        result.map_err(Abort::into_error)
    }

    async fn release(
        &self,
        reservation: &Reservation,
        idempotency: &Idempotency,
    ) -> StoreResult<Option<Reply>> {
        self.finish_transition(reservation, idempotency, None).await
    }

    async fn extend(
        &self,
        reservation: &Reservation,
        hold_seconds: i64,
        max_total_seconds: i64,
        idempotency: &Idempotency,
    ) -> StoreResult<Option<Reply>> {
        let (id, asset, created_at) = (
            reservation.reservation_id.clone(),
            reservation.asset_id.clone(),
            reservation.created_at,
        );
        let idempotency = idempotency.clone();
        let result = self
            .write("extend the hold", move |c| {
                // Judged at the write's own clock, after any wait for the writer.
                let now = clock();
                let until = now + chrono::Duration::seconds(hold_seconds);
                if !extension_allowed(created_at, until, max_total_seconds) {
                    return Err(Abort::Retry);
                }
                let sequence = sql_query(
                    "UPDATE assets SET hold_expires_at = ?1, version = version + 1, \
                            last_event_sequence = last_event_sequence + 1, updated_at = ?2 \
                     WHERE id = ?3 AND status = 'HELD' AND current_reservation_id = ?4 AND hold_expires_at > ?2 \
                     RETURNING last_event_sequence",
                )
                .bind::<Instant, _>(until)
                .bind::<Instant, _>(now)
                .bind::<Text, _>(&asset)
                .bind::<Text, _>(&id)
                .get_result::<Sequence>(c)
                .optional()
                .context("extend the hold")?;
                let Some(sequence) = sequence else {
                    return Err(Abort::Retry);
                };
                let updated = sql_query(
                    "UPDATE reservations SET expires_at = ? WHERE id = ? AND status = 'HELD' RETURNING *",
                )
                .bind::<Instant, _>(until)
                .bind::<Text, _>(&id)
                .get_result::<ReservationRow>(c)
                .context("extend the reservation")?
                .into_reservation()?;
                let reply = reply::reservation_ok(&updated);
                let event = NewEvent::new(
                    &asset,
                    sequence.last_event_sequence,
                    EventType::ReservationExtended,
                    reply.body.clone(),
                    now,
                )
                .about(&id);
                record(c, &event, &idempotency, &reply, &id, now)?;
                Ok(reply)
            })
            .await?;
        Abort::settle(result.map(Some), None)
    }

    async fn void(
        &self,
        reservation: &Reservation,
        refund: bool,
        actor: &str,
        idempotency: &Idempotency,
    ) -> StoreResult<Option<Reply>> {
        let (id, asset, actor) = (
            reservation.reservation_id.clone(),
            reservation.asset_id.clone(),
            actor.to_owned(),
        );
        let idempotency = idempotency.clone();
        let result = self
            .write("void the sale", move |c| {
                let now = clock();
                let sequence = sql_query(
                    "UPDATE assets SET status = 'AVAILABLE', current_reservation_id = NULL, hold_expires_at = NULL, \
                            version = version + 1, last_event_sequence = last_event_sequence + 1, updated_at = ?1 \
                     WHERE id = ?2 AND status = 'SOLD' AND current_reservation_id = ?3 \
                     RETURNING last_event_sequence",
                )
                .bind::<Instant, _>(now)
                .bind::<Text, _>(&asset)
                .bind::<Text, _>(&id)
                .get_result::<Sequence>(c)
                .optional()
                .context("void the sale")?;
                let Some(sequence) = sequence else {
                    return Err(Abort::Retry);
                };
                let voided = sql_query(
                    "UPDATE reservations SET status = 'VOIDED', voided_at = ? \
                     WHERE id = ? AND status = 'COMMITTED' RETURNING *",
                )
                .bind::<Instant, _>(now)
                .bind::<Text, _>(&id)
                .get_result::<ReservationRow>(c)
                .context("void the reservation")?
                .into_reservation()?;
                let data = reply::reservation_ok(&voided).body;
                let event = NewEvent::new(
                    &asset,
                    sequence.last_event_sequence,
                    EventType::ReservationVoided,
                    data,
                    now,
                )
                .about(&id)
                .by(&actor);
                insert_event(c, &event)?;
                if let (true, Some(payment), Some(scope)) = (
                    refund,
                    voided.payment_reference.as_deref(),
                    voided.payment_scope.as_deref(),
                ) {
                    // Part of the payment's one fate: it bought this sale.
                    let refund =
                        Refund::requested(&voided, scope, payment, RefundReason::SaleVoided, now);
                    insert_refund(c, &refund)?;
                    let sequence = next_sequence(c, &asset)?;
                    let data = serde_json::to_string(&refund).unwrap_or_default();
                    let event = NewEvent::new(&asset, sequence, EventType::RefundRequested, data, now)
                        .about(&id)
                        .by(&actor);
                    insert_event(c, &event)?;
                }
                let rid = parse_reservation_id(&id)?;
                let current = load_reservation(c, &rid, now)?
                    .ok_or_else(|| StoreError::Corrupt(format!("reservation {id} vanished")))?;
                let reply = reply::reservation_ok(&current);
                store_answer(c, &idempotency, &reply, &id, now)?;
                Ok(reply)
            })
            .await?;
        Abort::settle(result.map(Some), None)
    }

    async fn commit_late(
        &self,
        reservation: &Reservation,
        payment: PaymentKey<'_>,
        idempotency: &Idempotency,
    ) -> StoreResult<Option<Reply>> {
        let (id, asset) = (
            reservation.reservation_id.clone(),
            reservation.asset_id.clone(),
        );
        let (scope, reference) = (payment.scope.to_owned(), payment.reference.to_owned());
        let idempotency = idempotency.clone();
        let result = self
            .write("sell to a late payment", move |c| {
                let now = clock();
                // The lapsed hold, if nobody swept it yet, expires first.
                expire_lapsed(c, Some(&asset), now, 1)?;
                let sequence = sql_query(
                    "UPDATE assets SET status = 'SOLD', current_reservation_id = ?1, hold_expires_at = NULL, \
                            version = version + 1, last_event_sequence = last_event_sequence + 1, updated_at = ?2 \
                     WHERE id = ?3 AND status = 'AVAILABLE' \
                       AND NOT EXISTS (SELECT 1 FROM reservations o WHERE o.asset_id = ?3 AND o.id <> ?1 \
                             AND o.created_at >= (SELECT created_at FROM reservations WHERE id = ?1)) \
                       AND EXISTS (SELECT 1 FROM reservations r WHERE r.id = ?1 AND r.status = 'EXPIRED') \
                     RETURNING last_event_sequence",
                )
                .bind::<Text, _>(&id)
                .bind::<Instant, _>(now)
                .bind::<Text, _>(&asset)
                .get_result::<Sequence>(c)
                .optional()
                .context("sell to a late payment")?;
                let Some(sequence) = sequence else {
                    return Err(Abort::Retry);
                };
                let updated = sql_query(
                    "UPDATE reservations SET status = 'COMMITTED', committed_at = ?, payment_reference = ?, \
                            payment_scope = ? WHERE id = ? AND status = 'EXPIRED' RETURNING *",
                )
                .bind::<Instant, _>(now)
                .bind::<Text, _>(&reference)
                .bind::<Text, _>(&scope)
                .bind::<Text, _>(&id)
                .get_result::<ReservationRow>(c)
                .context("commit the reservation")?
                .into_reservation()?;
                let payment = PaymentKey {
                    scope: &scope,
                    reference: &reference,
                };
                record_fate(c, payment, &id, None, now)?;
                let reply = reply::reservation_ok(&updated);
                let event = NewEvent::new(
                    &asset,
                    sequence.last_event_sequence,
                    EventType::ReservationCommitted,
                    reply.body.clone(),
                    now,
                )
                .about(&id);
                record(c, &event, &idempotency, &reply, &id, now)?;
                Ok(reply)
            })
            .await?;
        Abort::settle(result.map(Some), None)
    }
}

/// Records a refund; a unique violation when this payment of this
/// reservation has one.
fn insert_refund(conn: &mut SqliteConnection, refund: &Refund) -> StoreResult<()> {
    diesel::insert_into(refunds::table)
        .values((
            refunds::id.eq(&refund.refund_id),
            refunds::reservation_id.eq(&refund.reservation_id),
            refunds::asset_id.eq(&refund.asset_id),
            refunds::payment_reference.eq(&refund.payment_reference),
            refunds::payment_scope.eq(&refund.payment_scope),
            refunds::reason.eq(refund.reason.as_str()),
            refunds::status.eq(refund.status.as_str()),
            refunds::created_at.eq(At(refund.created_at)),
        ))
        .execute(conn)
        .context("record a refund")?;
    Ok(())
}

/// Records a payment's one fate: it bought `reservation_id`, or `refund_id`
/// gives it back. A unique violation when it has one already.
fn record_fate(
    conn: &mut SqliteConnection,
    payment: PaymentKey<'_>,
    reservation_id: &str,
    refund_id: Option<&str>,
    now: Timestamp,
) -> StoreResult<()> {
    diesel::insert_into(payments::table)
        .values((
            payments::scope.eq(payment.scope),
            payments::reference.eq(payment.reference),
            payments::reservation_id.eq(reservation_id),
            payments::refund_id.eq(refund_id),
            payments::created_at.eq(At(now)),
        ))
        .execute(conn)
        .context("record the payment's fate")?;
    Ok(())
}

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

impl SqliteStore {
    /// Commit (with a payment) or release of a live hold: the asset first,
    /// guarded by status, owner and expiry at the write's clock; then the reservation, the event
    /// and the stored answer, in one transaction.
    async fn finish_transition(
        &self,
        reservation: &Reservation,
        idempotency: &Idempotency,
        payment: Option<(String, String)>,
    ) -> StoreResult<Option<Reply>> {
        let (id, asset) = (
            reservation.reservation_id.clone(),
            reservation.asset_id.clone(),
        );
        let idempotency = idempotency.clone();
        let result = self
            .write("change the reservation", move |c| {
                // Judged at the write's own clock, after any wait for the writer.
                let now = clock();
                let asset_sql = if payment.is_some() {
                    "UPDATE assets SET status = 'SOLD', hold_expires_at = NULL, version = version + 1, \
                            last_event_sequence = last_event_sequence + 1, updated_at = ?1 \
                     WHERE id = ?2 AND status = 'HELD' AND current_reservation_id = ?3 AND hold_expires_at > ?1 \
                     RETURNING last_event_sequence"
                } else {
                    "UPDATE assets SET status = 'AVAILABLE', hold_expires_at = NULL, current_reservation_id = NULL, \
                            version = version + 1, last_event_sequence = last_event_sequence + 1, updated_at = ?1 \
                     WHERE id = ?2 AND status = 'HELD' AND current_reservation_id = ?3 AND hold_expires_at > ?1 \
                     RETURNING last_event_sequence"
                };
                let sequence = sql_query(asset_sql)
                    .bind::<Instant, _>(now)
                    .bind::<Text, _>(&asset)
                    .bind::<Text, _>(&id)
                    .get_result::<Sequence>(c)
                    .optional()
                    .context("change the asset")?;
                let Some(sequence) = sequence else {
                    return Err(Abort::Retry);
                };
                let (row, event_type) = match &payment {
                    Some((scope, reference)) => {
                        let row = sql_query(
                            "UPDATE reservations SET status = 'COMMITTED', committed_at = ?, payment_reference = ?, \
                                    payment_scope = ? WHERE id = ? AND status = 'HELD' RETURNING *",
                        )
                        .bind::<Instant, _>(now)
                        .bind::<Text, _>(reference)
                        .bind::<Text, _>(scope)
                        .bind::<Text, _>(&id)
                        .get_result::<ReservationRow>(c)
                        .context("commit the reservation")?;
                        let payment = PaymentKey { scope, reference };
                        record_fate(c, payment, &id, None, now)?;
                        (row, EventType::ReservationCommitted)
                    }
                    None => (
                        sql_query(
                            "UPDATE reservations SET status = 'RELEASED', released_at = ? \
                             WHERE id = ? AND status = 'HELD' RETURNING *",
                        )
                        .bind::<Instant, _>(now)
                        .bind::<Text, _>(&id)
                        .get_result::<ReservationRow>(c)
                        .context("release the reservation")?,
                        EventType::ReservationReleased,
                    ),
                };
                // A live hold has no refunds yet.
                let updated = row.into_reservation()?.effective(now);
                let reply = reply::reservation_ok(&updated);
                let event = NewEvent::new(&asset, sequence.last_event_sequence, event_type, reply.body.clone(), now)
                    .about(&id);
                record(c, &event, &idempotency, &reply, &id, now)?;
                Ok(reply)
            })
            .await?;
        Abort::settle(result.map(Some), None)
    }
}

#[derive(QueryableByName)]
struct Sequence {
    #[diesel(sql_type = BigInt)]
    last_event_sequence: i64,
}

/// Expires lapsed holds (of one asset, or up to `limit` of any) as of `now`.
fn expire_lapsed(
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
        "SELECT id FROM assets WHERE status = 'HELD' AND hold_expires_at <= ?1 AND (?2 IS NULL OR id = ?2) \
         ORDER BY id LIMIT ?3",
    )
    .bind::<Instant, _>(now)
    .bind::<Nullable<Text>, _>(asset)
    .bind::<BigInt, _>(limit)
    .load::<Id>(conn)
    .context("find lapsed holds")?;
    for Id { id } in &lapsed {
        let sequence = sql_query(
            "UPDATE assets SET status = 'AVAILABLE', hold_expires_at = NULL, current_reservation_id = NULL, \
                    version = version + 1, last_event_sequence = last_event_sequence + 1, updated_at = ?1 \
             WHERE id = ?2 RETURNING last_event_sequence",
        )
        .bind::<Instant, _>(now)
        .bind::<Text, _>(id)
        .get_result::<Sequence>(conn)
        .context("expire a lapsed hold")?;
        let row = sql_query(
            "UPDATE reservations SET status = 'EXPIRED' WHERE asset_id = ? AND status = 'HELD' RETURNING *",
        )
        .bind::<Text, _>(id)
        .get_result::<ReservationRow>(conn)
        .context("expire a lapsed reservation")?;
        let reservation = row.into_reservation()?;
        let data = serde_json::to_string(&reservation).unwrap_or_default();
        let event = NewEvent::new(
            id,
            sequence.last_event_sequence,
            EventType::ReservationExpired,
            data,
            now,
        )
        .about(&reservation.reservation_id);
        insert_event(conn, &event)?;
    }
    Ok(lapsed.len())
}

fn next_sequence(conn: &mut SqliteConnection, asset: &str) -> StoreResult<i64> {
    sql_query("UPDATE assets SET last_event_sequence = last_event_sequence + 1 WHERE id = ? RETURNING last_event_sequence")
        .bind::<Text, _>(asset)
        .get_result::<Sequence>(conn)
        .map(|s| s.last_event_sequence)
        .context("number an event")
}

/// An event; its owner is the owner of the reservation it reports (?7). Its
/// feed position is the larger of the last one plus one and the clock in
/// microseconds (?9): it grows even when every older event was purged, and
/// after a restore it lies above every position handed out before.
const INSERT_EVENT_SQL: &str = "\
INSERT INTO events (position, id, asset_id, sequence, type, data, created_at, owner, actor)
VALUES (max(coalesce((SELECT max(position) FROM events), 0) + 1, ?9),
        ?1, ?2, ?3, ?4, ?5, ?6, (SELECT owner FROM reservations WHERE id = ?7), ?8)";

fn insert_event(conn: &mut SqliteConnection, event: &NewEvent) -> StoreResult<()> {
    sql_query(INSERT_EVENT_SQL)
        .bind::<Text, _>(&event.id)
        .bind::<Text, _>(&event.asset_id)
        .bind::<BigInt, _>(event.sequence)
        .bind::<Text, _>(event.event_type.as_str())
        .bind::<Text, _>(&event.data)
        .bind::<Instant, _>(event.created_at)
        .bind::<Nullable<Text>, _>(event.reservation_id.as_deref())
        .bind::<Nullable<Text>, _>(event.actor.as_deref())
        .bind::<BigInt, _>(clock().timestamp_micros())
        .execute(conn)
        .context("record an event")?;
    Ok(())
}

/// Writes an event and the answer stored under the request's key.
fn record(
    conn: &mut SqliteConnection,
    event: &NewEvent,
    idempotency: &Idempotency,
    reply: &Reply,
    reservation_id: &str,
    now: Timestamp,
) -> StoreResult<()> {
    insert_event(conn, event)?;
    store_answer(conn, idempotency, reply, reservation_id, now)
}

/// Writes the answer stored under the request's key.
fn store_answer(
    conn: &mut SqliteConnection,
    idempotency: &Idempotency,
    reply: &Reply,
    reservation_id: &str,
    now: Timestamp,
) -> StoreResult<()> {
    sql_query(
        "INSERT INTO idempotency_keys (scope, key, fingerprint, status_code, body, location, reservation_id, created_at) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind::<Text, _>(&idempotency.scope)
    .bind::<Text, _>(idempotency.key.as_str())
    .bind::<Text, _>(&idempotency.fingerprint)
    .bind::<Integer, _>(i32::from(reply.status))
    .bind::<Text, _>(&reply.body)
    .bind::<Nullable<Text>, _>(reply.location.as_deref())
    .bind::<Text, _>(reservation_id)
    .bind::<Instant, _>(now)
    .execute(conn)
    .context("store the answer")?;
    Ok(())
}

fn load_reservation(
    conn: &mut SqliteConnection,
    id: &ReservationId,
    now: Timestamp,
) -> StoreResult<Option<Reservation>> {
    load_visible_reservation(conn, id, now, None)
}

fn load_visible_reservation(
    conn: &mut SqliteConnection,
    id: &ReservationId,
    now: Timestamp,
    visible_to: Option<&str>,
) -> StoreResult<Option<Reservation>> {
    let id = id.to_string();
    let mut query = reservations::table
        .find(&id)
        .select(ReservationRow::as_select())
        .into_boxed();
    if let Some(owner) = visible_to {
        query = query.filter(reservations::owner.eq(owner));
    }
    let row = query
        .first::<ReservationRow>(conn)
        .optional()
        .context("read a reservation")?;
    let Some(row) = row else {
        return Ok(None);
    };
    let refund_rows = refunds::table
        .filter(refunds::reservation_id.eq(&id))
        .order((refunds::created_at.asc(), refunds::id.asc()))
        .select(RefundRow::as_select())
        .load::<RefundRow>(conn)
        .context("read a reservation's refunds")?;
    let mut reservation = row.into_reservation()?;
    reservation.refunds = refund_rows
        .into_iter()
        .map(RefundRow::into_refund)
        .collect::<StoreResult<_>>()?;
    Ok(Some(reservation.effective(now)))
}

/// The operator console's counts.
impl SqliteStore {
    /// Assets per effective status (a lapsed hold counts as AVAILABLE, as in
    /// `list_assets`); statuses no asset has are left out.
    pub async fn asset_counts(&self) -> StoreResult<Vec<(AssetStatus, i64)>> {
        self.read("count assets", move |c| {
            let rows = sql_query(
                "SELECT CASE WHEN status = 'HELD' AND hold_expires_at <= ?1 THEN 'AVAILABLE' \
                 ELSE status END AS status, count(*) AS n FROM assets GROUP BY 1",
            )
            .bind::<Instant, _>(clock())
            .load::<super::rows::StatusCountRow>(c)
            .context("count assets")?;
            rows.into_iter()
                .map(super::rows::StatusCountRow::into_count)
                .collect()
        })
        .await
    }
}
