//! The store: one method per atomic use case. Each backend decides every
//! transition with one conditional write inside one short transaction.

mod error;
mod flow;
pub mod postgres;
mod rows;
mod schema;
pub mod sqlite;

use std::time::Duration;

pub use error::StoreError;

use crate::config::{Config, DatabaseUrl};
use crate::domain::{
    Asset, AssetId, AssetStatus, BuyerId, Event, EventId, IdempotencyKey, PaymentReference, Refund,
    RefundId, RefundStatus, Reservation, ReservationId, Timestamp,
};
use crate::reply::Reply;

pub type StoreResult<T> = Result<T, StoreError>;

/// Who is asking, for the scope of idempotency keys.
#[derive(Debug, Clone)]
pub struct Idempotency {
    /// The caller's scope (its API key's name; one shared scope without auth).
    pub scope: String,
    pub key: IdempotencyKey,
    /// Hash of method, route, path parameters and canonical body.
    pub fingerprint: String,
}

/// A stored answer found for an idempotency key.
#[derive(Debug, Clone)]
pub struct StoredAnswer {
    pub fingerprint: String,
    pub status: u16,
    pub body: String,
    pub location: Option<String>,
}

impl StoredAnswer {
    /// A replay when the request matches the one stored, else `None` (422).
    pub fn replay_for(self, fingerprint: &str) -> Option<Reply> {
        (self.fingerprint == fingerprint)
            .then(|| Reply::replay(self.status, self.body, self.location))
    }
}

#[derive(Debug, Clone)]
pub struct HoldRequest {
    pub asset_id: AssetId,
    pub buyer_id: BuyerId,
    pub hold_seconds: i64,
    pub idempotency: Idempotency,
}

#[derive(Debug)]
pub enum HoldOutcome {
    Created(Reply),
    Replayed(Reply),
    KeyReused,
    NotFound,
    Unavailable {
        status: AssetStatus,
        hold_expires_at: Option<Timestamp>,
    },
}

#[derive(Debug, Clone)]
pub struct CommitRequest {
    pub reservation_id: ReservationId,
    pub payment_reference: PaymentReference,
    pub idempotency: Idempotency,
}

#[derive(Debug)]
pub enum CommitOutcome {
    Committed(Reply),
    /// Committed before with the same payment: 200, nothing changed.
    AlreadyCommitted(Reservation),
    /// 409 with a refund (stored for replay).
    Refused(Reply),
    PaymentReferenceUsed(Reservation),
    Replayed(Reply),
    KeyReused,
    NotFound,
}

#[derive(Debug, Clone)]
pub struct ReleaseRequest {
    pub reservation_id: ReservationId,
    pub idempotency: Idempotency,
}

#[derive(Debug)]
pub enum ReleaseOutcome {
    Released(Reply),
    /// Released before: 200, nothing changed.
    AlreadyReleased(Reservation),
    NotActive(Reservation),
    Replayed(Reply),
    KeyReused,
    NotFound,
}

#[derive(Debug, Clone)]
pub struct CompleteRefundRequest {
    pub refund_id: RefundId,
    pub idempotency: Idempotency,
}

#[derive(Debug)]
pub enum CompleteRefundOutcome {
    Completed(Reply),
    /// Completed before: 200, nothing changed.
    AlreadyCompleted(Refund),
    Replayed(Reply),
    KeyReused,
    NotFound,
}

/// Filter and position of one page of refunds, in id (creation) order.
#[derive(Debug, Clone)]
pub struct RefundPage {
    pub status: Option<RefundStatus>,
    pub after: Option<String>,
    pub limit: i64,
}

/// A place in the global event feed. On PostgreSQL, the writing
/// transaction's id and the insertion position; on SQLite, the row id.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct FeedCursor {
    pub tx: i64,
    pub position: i64,
}

/// An event claimed for delivery: the attempt it is on.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub event: Event,
    pub attempt: i32,
}

/// What became of one delivery attempt.
#[derive(Debug, Clone)]
pub enum DeliveryResult {
    Delivered,
    /// Try again after `retry_in`, or park the event as dead when `None`.
    Failed {
        error: String,
        retry_in: Option<Duration>,
    },
}

/// Filter and position of one page of assets.
#[derive(Debug, Clone)]
pub struct AssetPage {
    pub status: Option<AssetStatus>,
    /// Only assets whose id sorts after this one.
    pub after: Option<String>,
    pub limit: i64,
}

/// What one janitor pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepReport {
    pub expired: u64,
    pub purged_keys: u64,
    pub purged_events: u64,
}

/// Settings the store needs from the configuration.
#[derive(Debug, Clone)]
pub struct StoreSettings {
    pub pool_size: usize,
    pub acquire_timeout: Duration,
    pub statement_timeout: Duration,
    pub lock_timeout: Duration,
    pub idempotency_retention: Duration,
    /// Delivered events older than this are purged; `None` keeps them all.
    pub event_retention: Option<Duration>,
    pub sweep_batch: i64,
}

/// The configured backend.
#[derive(Clone)]
pub enum Store {
    Postgres(postgres::PgStore),
    Sqlite(sqlite::SqliteStore),
}

macro_rules! dispatch {
    ($self:ident, $store:ident => $call:expr) => {
        match $self {
            Store::Postgres($store) => $call,
            Store::Sqlite($store) => $call,
        }
    };
}

impl Store {
    /// Opens the configured database (not yet migrated).
    pub async fn open(config: &Config) -> StoreResult<Self> {
        let settings = config.store_settings();
        match config
            .database()
            .map_err(|e| StoreError::Config(e.to_string()))?
        {
            DatabaseUrl::Postgres(url) => {
                Ok(Self::Postgres(postgres::PgStore::connect(&url, &settings)?))
            }
            DatabaseUrl::Sqlite(path) => {
                Ok(Self::Sqlite(sqlite::SqliteStore::open(&path, &settings)?))
            }
        }
    }

    pub async fn migrate(&self) -> StoreResult<()> {
        dispatch!(self, s => s.migrate().await)
    }

    pub async fn ping(&self) -> StoreResult<()> {
        dispatch!(self, s => s.ping().await)
    }

    /// `None` when an asset with this id exists.
    pub async fn create_asset(&self, id: &AssetId, name: &str) -> StoreResult<Option<Asset>> {
        dispatch!(self, s => s.create_asset(id, name).await)
    }

    pub async fn get_asset(&self, id: &AssetId) -> StoreResult<Option<Asset>> {
        dispatch!(self, s => s.get_asset(id).await)
    }

    /// Up to `page.limit` assets in id order, by effective status.
    pub async fn list_assets(&self, page: &AssetPage) -> StoreResult<Vec<Asset>> {
        dispatch!(self, s => s.list_assets(page).await)
    }

    /// `None` when the asset does not exist.
    pub async fn asset_events(&self, id: &AssetId) -> StoreResult<Option<Vec<Event>>> {
        dispatch!(self, s => s.asset_events(id).await)
    }

    pub async fn get_reservation(&self, id: &ReservationId) -> StoreResult<Option<Reservation>> {
        dispatch!(self, s => s.get_reservation(id).await)
    }

    pub async fn hold(&self, req: &HoldRequest) -> StoreResult<HoldOutcome> {
        dispatch!(self, s => s.hold(req).await)
    }

    pub async fn commit(&self, req: &CommitRequest) -> StoreResult<CommitOutcome> {
        dispatch!(self, s => s.commit(req).await)
    }

    pub async fn release(&self, req: &ReleaseRequest) -> StoreResult<ReleaseOutcome> {
        dispatch!(self, s => s.release(req).await)
    }

    pub async fn complete_refund(
        &self,
        req: &CompleteRefundRequest,
    ) -> StoreResult<CompleteRefundOutcome> {
        dispatch!(self, s => flow::complete_refund(s, req).await)
    }

    pub async fn list_refunds(&self, page: &RefundPage) -> StoreResult<Vec<Refund>> {
        dispatch!(self, s => s.list_refunds(page).await)
    }

    /// Events after `after` whose order is final, oldest first.
    pub async fn event_feed(
        &self,
        after: FeedCursor,
        limit: i64,
    ) -> StoreResult<Vec<(FeedCursor, Event)>> {
        dispatch!(self, s => s.event_feed(after, limit, false).await)
    }

    /// Events parked after too many failed deliveries, oldest first.
    pub async fn dead_events(
        &self,
        after: FeedCursor,
        limit: i64,
    ) -> StoreResult<Vec<(FeedCursor, Event)>> {
        dispatch!(self, s => s.event_feed(after, limit, true).await)
    }

    /// Schedules an event for delivery again; `None` when it does not exist.
    pub async fn redeliver(&self, id: &EventId) -> StoreResult<Option<Event>> {
        dispatch!(self, s => s.redeliver(id).await)
    }

    /// Claims up to `limit` due events; each stays claimed for `lease`.
    pub async fn claim_deliveries(
        &self,
        limit: i64,
        lease: Duration,
    ) -> StoreResult<Vec<Delivery>> {
        dispatch!(self, s => s.claim_deliveries(limit, lease).await)
    }

    pub async fn finish_delivery(&self, id: &str, result: &DeliveryResult) -> StoreResult<()> {
        dispatch!(self, s => s.finish_delivery(id, result).await)
    }

    /// Expires lapsed holds and purges idempotency records past retention.
    pub async fn sweep(&self) -> StoreResult<SweepReport> {
        dispatch!(self, s => s.sweep().await)
    }

    /// Writes a consistent copy of a live embedded database to `target`.
    pub async fn backup(&self, target: &std::path::Path) -> StoreResult<()> {
        match self {
            Store::Sqlite(s) => s.backup(target).await,
            Store::Postgres(_) => Err(StoreError::Config(
                "backup copies the embedded SQLite database; for PostgreSQL use pg_dump".into(),
            )),
        }
    }

    /// Where the data lives, for the start-up line (no credentials).
    pub fn describe(&self) -> String {
        dispatch!(self, s => s.describe())
    }
}
