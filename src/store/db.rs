//! The database a store runs on: its backend, how the answers it keeps are
//! rendered, its settings and policy, and the ways work runs on it (within
//! the call timeout; on a connection; in a write transaction; as one write
//! statement). The use cases run their statements through these.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::api::{Answer, DatabaseUrl, Policy, PoolStatus, Render, Rendered, StoreSettings};
use super::coalesce::{BatchFuture, Coalescer, Gather};
use super::conn::{self, Conn};
use super::error::{is_unique_violation, Abort, Context, StoreError, StoreResult};
use super::outcome;
use super::postgres::{self, Sessions};
use super::rows::{HoldSnapshotRow, ReservationInput, ReservationSnapshotRow, SnapshotInput};
use super::sqlite;

/// At most this many first-read statements of one kind (holds', or
/// reservations') run at once; requests that arrive meanwhile are read
/// together by the next one. One: a statement is mostly its planning, so
/// the fewer and fuller the statements, the less the database works per
/// request, and a request waits at most for the statement running when it
/// came and then its own.
const SNAPSHOT_BATCHES: usize = 1;
/// The largest number of requests one first-read statement reads for.
const SNAPSHOT_BATCH_SIZE: usize = 256;
/// A first-read statement that follows another waits for 32 requests, or
/// half a millisecond, when fewer are queued. At 64 connections in a flash
/// sale that takes the statements from about 15 requests each to about 50,
/// and the database's CPU per request to less than half.
const SNAPSHOT_GATHER: Gather = Gather {
    callers: 32,
    at_most: Duration::from_micros(500),
};

/// A coalescer of first reads of one kind, `run` reading a batch of them.
fn first_reads<I: Send + 'static, O: Send + 'static>(
    context: &'static str,
    run: impl Fn(Vec<I>) -> BatchFuture<O> + Send + Sync + 'static,
) -> Arc<Coalescer<I, O>> {
    Coalescer::new(
        context,
        SNAPSHOT_BATCHES,
        SNAPSHOT_BATCH_SIZE,
        SNAPSHOT_GATHER,
        run,
    )
}

/// How the use cases read many first reads in one statement on PostgreSQL:
/// of holds, and of the requests about a reservation (commit, release,
/// extension, void).
pub(crate) struct Readers {
    pub holds: fn(Sessions, Vec<SnapshotInput>) -> BatchFuture<HoldSnapshotRow>,
    pub reservations:
        fn(Sessions, Vec<ReservationInput>) -> BatchFuture<Vec<ReservationSnapshotRow>>,
}

/// PostgreSQL's coalesced first reads.
struct Batched {
    holds: Arc<Coalescer<SnapshotInput, HoldSnapshotRow>>,
    reservations: Arc<Coalescer<ReservationInput, Vec<ReservationSnapshotRow>>>,
}

/// The configured backend, how answers are rendered, and the policy.
#[derive(Clone)]
pub struct Store {
    backend: Backend,
    render: Arc<dyn Render>,
    settings: Arc<StoreSettings>,
    /// PostgreSQL: the first reads of concurrent requests, read together.
    batched: Option<Arc<Batched>>,
}

#[derive(Clone)]
enum Backend {
    Postgres(postgres::PgStore),
    Sqlite(sqlite::SqliteStore),
}

impl Store {
    /// Opens the database at `url` (not yet migrated); stored answers are
    /// rendered by `render`. On PostgreSQL, `readers` read the first reads
    /// of concurrent requests in one statement per batch.
    pub(crate) fn connect(
        url: &DatabaseUrl,
        settings: &StoreSettings,
        render: Arc<dyn Render>,
        readers: Readers,
    ) -> StoreResult<Self> {
        let (backend, batched) = match url {
            DatabaseUrl::Postgres(url) => {
                let pg = postgres::PgStore::connect(url, settings)?;
                let (sessions, holds) = (pg.sessions().clone(), readers.holds);
                let holds = first_reads("read the asset to hold", move |inputs| {
                    holds(sessions.clone(), inputs)
                });
                let (sessions, reservations) = (pg.sessions().clone(), readers.reservations);
                let reservations = first_reads("read the reservation", move |inputs| {
                    reservations(sessions.clone(), inputs)
                });
                let batched = Batched {
                    holds,
                    reservations,
                };
                (Backend::Postgres(pg), Some(Arc::new(batched)))
            }
            DatabaseUrl::Sqlite(path) => {
                let lite = sqlite::SqliteStore::open(path, settings)?;
                (Backend::Sqlite(lite), None)
            }
        };
        Ok(Self {
            backend,
            render,
            settings: Arc::new(settings.clone()),
            batched,
        })
    }

    /// PostgreSQL's coalesced first read of concurrent holds.
    pub(crate) fn hold_snapshots(&self) -> Option<&Arc<Coalescer<SnapshotInput, HoldSnapshotRow>>> {
        self.batched.as_ref().map(|b| &b.holds)
    }

    /// PostgreSQL's coalesced first read of concurrent requests about a
    /// reservation.
    pub(crate) fn reservation_snapshots(
        &self,
    ) -> Option<&Arc<Coalescer<ReservationInput, Vec<ReservationSnapshotRow>>>> {
        self.batched.as_ref().map(|b| &b.reservations)
    }

    /// Writes a consistent copy of a live embedded database to `target`.
    pub async fn backup(&self, target: &std::path::Path) -> StoreResult<()> {
        match &self.backend {
            Backend::Sqlite(s) => s.backup(target).await,
            Backend::Postgres(_) => Err(StoreError::Config(
                "backup copies the embedded SQLite database; for PostgreSQL use pg_basebackup \
                 or pg_dump"
                    .into(),
            )),
        }
    }

    pub fn settings(&self) -> &StoreSettings {
        &self.settings
    }

    pub(crate) fn policy(&self) -> &Policy {
        &self.settings.policy
    }

    pub(crate) fn render(&self, answer: Answer<'_>) -> Rendered {
        self.render.render(answer)
    }

    /// The embedded database, when that is the backend.
    pub fn sqlite(&self) -> Option<&sqlite::SqliteStore> {
        match &self.backend {
            Backend::Sqlite(s) => Some(s),
            Backend::Postgres(_) => None,
        }
    }

    pub(crate) fn postgres(&self) -> Option<&postgres::PgStore> {
        match &self.backend {
            Backend::Postgres(s) => Some(s),
            Backend::Sqlite(_) => None,
        }
    }

    pub async fn migrate(&self) -> StoreResult<()> {
        match &self.backend {
            Backend::Postgres(s) => s.migrate().await,
            Backend::Sqlite(s) => s.migrate().await,
        }
    }

    /// Checks that the event feed can go on from where its pollers are (see
    /// `PgStore::check_feed`); SQLite's positions need no check.
    pub async fn check_feed(&self) -> StoreResult<()> {
        match &self.backend {
            Backend::Postgres(s) => s.check_feed().await,
            Backend::Sqlite(_) => Ok(()),
        }
    }

    pub fn pool_status(&self) -> PoolStatus {
        match &self.backend {
            Backend::Postgres(s) => s.pool_status(),
            Backend::Sqlite(s) => s.pool_status(),
        }
    }

    /// Where the data lives, for the start-up line (no credentials).
    pub fn describe(&self) -> String {
        match &self.backend {
            Backend::Postgres(s) => s.describe(),
            Backend::Sqlite(s) => s.describe(),
        }
    }

    /// PostgreSQL: the database's URL (credentials included), for a
    /// connection of a command's own.
    pub(crate) fn postgres_url(&self) -> Option<&str> {
        match &self.backend {
            Backend::Postgres(s) => Some(s.url()),
            Backend::Sqlite(_) => None,
        }
    }

    /// Runs a use case within the call timeout, with a gate that tells a
    /// failure that wrote nothing from one whose COMMIT may have been sent.
    ///
    /// The use case's future goes to the heap once, here: it is the largest
    /// part of a request's state, and the request's own future (which actix
    /// moves, and boxes) then carries a pointer to it instead of a copy.
    pub(crate) fn bounded<'a, T: 'a>(
        &self,
        context: &'static str,
        call: impl Future<Output = StoreResult<T>> + 'a,
    ) -> impl Future<Output = StoreResult<T>> + 'a {
        let timeout = self.settings.call_timeout;
        let call = Box::pin(call);
        async move {
            let gate = outcome::Gate::new();
            let call = outcome::with_gate(gate.clone(), call);
            match tokio::time::timeout(timeout, call).await {
                Ok(Ok(value)) => Ok(value),
                Ok(Err(e)) => Err(e.with_outcome(gate.outcome())),
                Err(_) => Err(StoreError::unavailable(
                    context,
                    format!("no answer within {timeout:?} (timeout)"),
                )
                .with_outcome(gate.abandon())),
            }
        }
    }

    /// Runs `work`, which only reads, on a connection outside any
    /// transaction (behind a pooler, in one of its own).
    pub(crate) async fn run<T, F>(&self, context: &'static str, work: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: AsyncFnOnce(&mut Conn<'_>) -> StoreResult<T> + Send + 'static,
    {
        match &self.backend {
            Backend::Postgres(s) => {
                s.sessions()
                    .run(async |c| work(&mut Conn::Pg(c)).await)
                    .await
            }
            Backend::Sqlite(s) => {
                s.read(context, move |c| conn::on_sqlite(work(&mut Conn::Lite(c))))
                    .await
            }
        }
    }

    /// Runs `work` in one write transaction: committed when it succeeds,
    /// rolled back when it fails. `None` when it found the state moved
    /// ([`Abort::Retry`]) or a key, a payment or an id was taken by a
    /// concurrent request (a unique violation): the caller reads again.
    pub(crate) async fn write<T, F>(&self, context: &'static str, work: F) -> StoreResult<Option<T>>
    where
        T: Send + 'static,
        F: AsyncFnOnce(&mut Conn<'_>) -> Result<T, Abort> + Send + 'static,
    {
        let result = match &self.backend {
            Backend::Postgres(s) => {
                s.sessions()
                    .transaction(async |c| work(&mut Conn::Pg(c)).await)
                    .await
            }
            Backend::Sqlite(s) => {
                s.write(context, move |c| conn::on_sqlite(work(&mut Conn::Lite(c))))
                    .await?
            }
        };
        moved_or(result)
    }

    /// Waits until the writes in flight on `asset` have ended, committed or
    /// rolled back, so that a read after it sees what they kept. Every
    /// change writes the asset's row (its events are numbered there), so a
    /// row lock that shares with none of them is granted only after them.
    pub(crate) async fn after_writes_on(&self, asset: &str) -> StoreResult<()> {
        const CONTEXT: &str = "wait for the writes on the asset";
        match &self.backend {
            Backend::Postgres(s) => {
                let asset = asset.to_owned();
                s.sessions()
                    .run(async move |c| {
                        let wait =
                            diesel::sql_query("SELECT 1 FROM assets WHERE id = $1 FOR SHARE")
                                .bind::<diesel::sql_types::Text, _>(asset);
                        Conn::Pg(c).execute(wait).await.context(CONTEXT)?;
                        Ok(())
                    })
                    .await
            }
            Backend::Sqlite(s) => s.after_writes(CONTEXT).await,
        }
    }

    /// Like [`Store::write`], for work that on PostgreSQL is one statement
    /// sent on its own, which commits as it ends (one round trip); on
    /// SQLite it is a transaction as any other.
    pub(crate) async fn write_statement<T, F>(
        &self,
        context: &'static str,
        work: F,
    ) -> StoreResult<Option<T>>
    where
        T: Send + 'static,
        F: AsyncFnOnce(&mut Conn<'_>) -> Result<T, Abort> + Send + 'static,
    {
        let result = match &self.backend {
            Backend::Postgres(s) => {
                let mut conn = s.sessions().conn().await?;
                if s.sessions().pooled() {
                    s.sessions()
                        .within(&mut conn, async |c| work(&mut Conn::Pg(c)).await)
                        .await
                } else {
                    outcome::sent_alone(work(&mut Conn::Pg(&mut conn))).await
                }
            }
            Backend::Sqlite(s) => {
                s.write(context, move |c| conn::on_sqlite(work(&mut Conn::Lite(c))))
                    .await?
            }
        };
        moved_or(result)
    }
}

/// How a write ended: its value, `None` when it asked to read again or lost
/// a unique key to a concurrent request, or its error.
fn moved_or<T>(result: Result<T, Abort>) -> StoreResult<Option<T>> {
    match result {
        Ok(value) => Ok(Some(value)),
        Err(Abort::Retry) => Ok(None),
        Err(Abort::Failed(e)) if is_unique_violation(&e) => Ok(None),
        Err(other) => Err(other.into_error()),
    }
}
