//! SQLite, the embedded default: diesel with the bundled library, an r2d2
//! pool of readers and a single writer connection, WAL, and `BEGIN IMMEDIATE`
//! for every write transaction, which concurrent writes share (group commit,
//! [`super::grouped`]). Reads run on blocking threads, writes on the writer's
//! own. The
//! process clock is this database's clock. This module opens the pools, runs
//! work on them, and backs the database up and restores it; the statements
//! themselves are in the transition and read modules.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use chrono::{SubsecRound, Utc};
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, CustomizeConnection, Pool, PooledConnection};
use diesel::sql_query;
use diesel::sql_types::{BigInt, Text};
use diesel::sqlite::SqliteConnection;
use diesel_migrations::{embed_migrations, EmbeddedMigrations, MigrationHarness};
use tokio::sync::Semaphore;

use super::api::{PoolStatus, SqliteSynchronous, StoreSettings};
use super::error::{Abort, Context};
use super::error::{StoreError, StoreResult};
use super::grouped::Committer;
use super::home::Home;
use super::rows::Count;
use crate::domain::Timestamp;

pub const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/sqlite");

type Conn = PooledConnection<ConnectionManager<SqliteConnection>>;

/// Each reader's page cache, in KiB (see [`Pragmas`]).
const READER_CACHE_KIB: i64 = 256;
/// The writer's page cache, in KiB: SQLite's default.
const WRITER_CACHE_KIB: i64 = 2000;

/// The clock of the embedded database: this process's, to the microsecond.
pub(crate) fn clock() -> Timestamp {
    Utc::now().trunc_subsecs(6)
}

/// Set on every new connection; busy_timeout must come before WAL.
#[derive(Debug)]
struct Pragmas {
    busy_timeout: Duration,
    synchronous: &'static str,
    /// `temp_store`: the writer keeps the journal of each write's savepoint
    /// in memory (group commit), where a file would cost a system call for
    /// every page a write first changes.
    temp_store: &'static str,
    /// `cache_size`, in KiB. Each connection keeps a page cache of its own,
    /// which fills to its size over a long run: with SQLite's default of
    /// 2 MiB, sixteen readers grew the server by 27 MiB over five minutes of
    /// holds. A reader's cache serves little under writes anyway (a reader
    /// resets it when another connection has committed since its last read),
    /// so readers keep 256 KiB (bench/README.md, "Memory"); the writer keeps
    /// SQLite's default.
    cache_kib: i64,
}

impl CustomizeConnection<SqliteConnection, diesel::r2d2::Error> for Pragmas {
    fn on_acquire(&self, conn: &mut SqliteConnection) -> Result<(), diesel::r2d2::Error> {
        conn.set_instrumentation(super::outcome::statement_counter());
        conn.batch_execute(&format!(
            "PRAGMA busy_timeout = {}; PRAGMA journal_mode = WAL; PRAGMA synchronous = {}; \
             PRAGMA foreign_keys = ON; PRAGMA temp_store = {}; PRAGMA cache_size = -{};",
            self.busy_timeout.as_millis(),
            self.synchronous,
            self.temp_store,
            self.cache_kib
        ))
        .map_err(diesel::r2d2::Error::QueryError)
    }
}

#[derive(Clone)]
pub struct SqliteStore {
    readers: Lane,
    /// One connection, for migrations and settings; writes reach it through
    /// `commits`, and queue there instead of spinning on SQLite's lock.
    writer: Lane,
    commits: Committer,
    path: PathBuf,
    synchronous: SqliteSynchronous,
}

impl SqliteStore {
    pub fn open(path: &Path, settings: &StoreSettings) -> StoreResult<Self> {
        let path = std::path::absolute(path)
            .map_err(|e| StoreError::Config(format!("cannot resolve {}: {e}", path.display())))?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| StoreError::Config(format!("cannot create {}: {e}", dir.display())))?;
        }
        let pool = |size: usize, temp_store: &'static str, cache_kib: i64| {
            let pool = Pool::builder()
                .max_size(u32::try_from(size).unwrap_or(u32::MAX))
                .min_idle(Some(1))
                .connection_timeout(settings.acquire_timeout)
                .connection_customizer(Box::new(Pragmas {
                    busy_timeout: settings.lock_timeout,
                    synchronous: settings.sqlite_synchronous.as_pragma(),
                    temp_store,
                    cache_kib,
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
        let writer = pool(1, "MEMORY", WRITER_CACHE_KIB)?;
        let readers = pool(settings.pool_size, "DEFAULT", READER_CACHE_KIB)?;
        let commits = Committer::start(writer.pool.clone(), settings.acquire_timeout)?;
        Ok(Self {
            readers,
            writer,
            commits,
            path,
            synchronous: settings.sqlite_synchronous,
        })
    }

    pub fn describe(&self) -> String {
        format!(
            "SQLite at {} (synchronous = {})",
            self.path.display(),
            self.synchronous.as_pragma()
        )
    }

    /// The page cache of a reader and of the writer, in KiB, as the
    /// connections have them (`PRAGMA cache_size`).
    pub async fn page_caches(&self) -> StoreResult<(i64, i64)> {
        #[derive(QueryableByName)]
        struct CacheSize {
            #[diesel(sql_type = BigInt)]
            cache_size: i64,
        }
        let read = |c: &mut SqliteConnection| {
            sql_query("PRAGMA cache_size")
                .get_result::<CacheSize>(c)
                // Negative: a size in KiB rather than in pages.
                .map(|s| -s.cache_size)
                .context("read a setting")
        };
        let reader = run(&self.readers, "read a setting", read).await?;
        let writer = run(&self.writer, "read a setting", read).await?;
        Ok((reader, writer))
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

    /// Runs `work` in a `BEGIN IMMEDIATE` transaction on the writer, shared
    /// with the writes queued beside it, each in a savepoint of its own. The
    /// work goes on on the writer's thread even when the call gives up: it is
    /// kept only if the call's gate is still open, else it rolls back.
    pub(crate) async fn write<T, F>(
        &self,
        context: &'static str,
        work: F,
    ) -> StoreResult<Result<T, Abort>>
    where
        T: Send + 'static,
        F: FnOnce(&mut SqliteConnection) -> Result<T, Abort> + Send + 'static,
    {
        self.commits
            .write(context, super::outcome::current(), work)
            .await
    }

    /// Waits until the writes queued before this call have ended: an empty
    /// write queued behind them, outside any call's gate.
    pub(crate) async fn after_writes(&self, context: &'static str) -> StoreResult<()> {
        let empty = self
            .commits
            .write(context, None, |_| Err::<(), _>(Abort::Retry));
        match empty.await? {
            Ok(()) | Err(Abort::Retry) => Ok(()),
            Err(other) => Err(other.into_error()),
        }
    }

    pub async fn migrate(&self) -> StoreResult<()> {
        run(&self.writer, "migrate", |conn| {
            conn.run_pending_migrations(MIGRATIONS)
                .map(|_| ())
                .map_err(|e| StoreError::Migration(e.to_string()))
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
