//! The store: one method per atomic use case. Each backend decides every
//! transition with one conditional write inside one short transaction.

mod audit;
mod coalesce;
mod error;
mod flow;
mod home;
mod outcome;
mod plans;
pub mod postgres;
mod rows;
mod schema;
pub mod sqlite;
mod statements;

use std::time::Duration;

use flow::{Backend, UseCases};

pub use audit::Finding;
pub use error::StoreError;
pub use outcome::WriteOutcome;

use crate::domain::{
    Asset, AssetId, AssetStatus, BuyerId, Event, EventId, IdempotencyKey, Payment,
    PaymentReference, Refund, RefundId, RefundReason, RefundStatus, Reservation, ReservationId,
    ReservationStatus, Timestamp,
};
use crate::reply::Reply;

pub type StoreResult<T> = Result<T, StoreError>;

/// Counts every statement a connection sends (each one a round trip), as
/// `holdfast_db_statements_total`.
fn statement_counter() -> impl FnMut(diesel::connection::InstrumentationEvent<'_>) + Send + 'static
{
    let statements = metrics::counter!("holdfast_db_statements_total");
    move |event| {
        if let diesel::connection::InstrumentationEvent::StartQuery { .. } = event {
            statements.increment(1);
        }
    }
}

/// [`statement_counter`], and the marks of every COMMIT on the gate of the
/// call that sends it (PostgreSQL, where calls run on the request's task);
/// `committed` is called after each one that succeeded.
fn watched_counter(
    mut committed: impl FnMut() + Send + 'static,
) -> impl FnMut(diesel::connection::InstrumentationEvent<'_>) + Send + 'static {
    let mut count = statement_counter();
    let mut watch = outcome::CommitWatch::default();
    move |event| {
        if watch.on_event(&event) {
            committed();
        }
        count(event);
    }
}

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
    /// The client (API key name) holding on the buyer's behalf.
    pub owner: String,
    /// Most live holds one (owner, buyer) may have; `None` for no limit.
    pub max_live_holds: Option<i64>,
}

/// What a request with an `Idempotency-Key` came to: its own outcome, or
/// what every keyed request can come to (a stored answer sent again, a key
/// used for another request, a target that does not exist).
#[derive(Debug)]
pub enum Keyed<T> {
    Done(T),
    Replayed(Reply),
    KeyReused,
    NotFound,
}

#[derive(Debug)]
pub enum HoldOutcome {
    Created(Reply),
    Unavailable {
        status: AssetStatus,
        hold_expires_at: Option<Timestamp>,
    },
    /// The buyer already has the most live holds allowed; nothing changed.
    LimitReached {
        limit: i64,
    },
    /// The asset's sale opens at `available_from`; nothing changed.
    SaleNotOpen {
        available_from: Timestamp,
    },
}

#[derive(Debug, Clone)]
pub struct CommitRequest {
    pub reservation_id: ReservationId,
    pub payment_reference: PaymentReference,
    /// The scope of the reference: the payments client's key name.
    pub payment_scope: String,
    pub idempotency: Idempotency,
    /// After the hold lapsed, still sell when nobody held or bought the
    /// asset since (HOLDFAST_LATE_COMMIT=accept-if-free).
    pub accept_late: bool,
}

#[derive(Debug, Clone)]
pub struct ExtendRequest {
    pub reservation_id: ReservationId,
    pub hold_seconds: i64,
    /// No hold may last longer than this from its creation.
    pub max_total_seconds: i64,
    pub idempotency: Idempotency,
    /// Only reservations of this owner exist for the caller; `None` sees all.
    pub visible_to: Option<String>,
}

#[derive(Debug)]
pub enum ExtendOutcome {
    Extended(Reply),
    /// Not a live hold: nothing changed.
    NotActive(Reservation),
    /// The hold would outlive its cap: nothing changed.
    LimitReached(Reservation),
}

#[derive(Debug, Clone)]
pub struct VoidRequest {
    pub reservation_id: ReservationId,
    /// Give the payment back (a SALE_VOIDED refund); false after a chargeback.
    pub refund: bool,
    pub idempotency: Idempotency,
    /// The API key voiding the sale, named in its events.
    pub actor: String,
}

#[derive(Debug)]
pub enum VoidOutcome {
    Voided(Reply),
    /// Voided before: nothing changed.
    AlreadyVoided(Reservation),
    /// Not a sale: nothing changed.
    NotActive(Reservation),
}

#[derive(Debug)]
pub enum CommitOutcome {
    Committed(Reply),
    /// Committed after the hold lapsed, the asset being free (accept-if-free).
    CommittedLate(Reply),
    /// Committed before with the same payment: 200, nothing changed.
    AlreadyCommitted(Reservation),
    /// 409 with the refund this request created (stored for replay).
    Refunded {
        reply: Reply,
        reason: RefundReason,
    },
    /// 409 with the refund an earlier request created for this payment.
    Refused {
        reply: Reply,
        reason: RefundReason,
    },
    /// The sale this payment bought was voided: 409, nothing new.
    SaleVoided(Reply),
    /// The payment has its fate through another reservation: 409, nothing changed.
    PaymentReferenceUsed {
        reservation: Box<Reservation>,
        payment: Box<Payment>,
    },
}

#[derive(Debug, Clone)]
pub struct ReleaseRequest {
    pub reservation_id: ReservationId,
    pub idempotency: Idempotency,
    /// Only reservations of this owner exist for the caller; `None` sees all.
    pub visible_to: Option<String>,
}

#[derive(Debug)]
pub enum ReleaseOutcome {
    Released(Reply),
    /// Released before: 200, nothing changed.
    AlreadyReleased(Reservation),
    NotActive(Reservation),
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
}

/// A place in the global event feed. On PostgreSQL, the writing
/// transaction's id and the insertion position; on SQLite, the event's
/// position.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct FeedCursor {
    pub tx: i64,
    pub position: i64,
}

/// One page of the event feed: the events after `after`, at most `limit`.
#[derive(Debug, Clone, Copy)]
pub struct FeedPage {
    pub after: FeedCursor,
    pub limit: i64,
    /// Only the events parked after too many failed deliveries; else only
    /// those whose order is final.
    pub dead: bool,
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

/// What withdrawing an asset did.
#[derive(Debug)]
pub enum WithdrawOutcome {
    Withdrawn(Asset),
    /// Withdrawn before: nothing changed.
    Unchanged(Asset),
    /// A live hold and no `force`: nothing changed.
    Held(Asset),
    Sold(Asset),
    NotFound,
}

/// What reinstating an asset did.
#[derive(Debug)]
pub enum ReinstateOutcome {
    Reinstated(Asset),
    /// Not withdrawn: nothing changed.
    Unchanged(Asset),
    NotFound,
}

/// Filter and position of one page of a list in id order (assets; refunds,
/// whose ids sort in creation order): at most `limit` rows with this status,
/// whose id sorts after `after`.
#[derive(Debug, Clone)]
pub struct StatusPage<S> {
    pub status: Option<S>,
    pub after: Option<String>,
    pub limit: i64,
}

pub type AssetPage = StatusPage<AssetStatus>;
pub type RefundPage = StatusPage<RefundStatus>;

/// Filter and position of one page of reservations, newest first.
#[derive(Debug, Clone)]
pub struct ReservationPage {
    pub buyer_id: Option<String>,
    pub asset_id: Option<String>,
    pub status: Option<ReservationStatus>,
    /// Only this client's reservations; `None` for all.
    pub owner: Option<String>,
    /// Only reservations whose id sorts before this one.
    pub before: Option<String>,
    pub limit: i64,
}

/// What one janitor pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepReport {
    pub expired: u64,
    pub purged_keys: u64,
    pub purged_events: u64,
}

/// Connections of the pool, for the gauges.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStatus {
    pub size: usize,
    pub in_use: usize,
    pub waiting: usize,
}

/// Settings the store needs from the configuration.
#[derive(Debug, Clone)]
pub struct StoreSettings {
    pub pool_size: usize,
    pub acquire_timeout: Duration,
    pub statement_timeout: Duration,
    pub lock_timeout: Duration,
    /// The longest any one store call may take, end to end; past it the call
    /// is abandoned and answered 503 (it may still commit: a retry replays).
    pub call_timeout: Duration,
    pub idempotency_retention: Duration,
    /// Delivered events older than this are purged; `None` keeps them all.
    pub event_retention: Option<Duration>,
    pub sweep_batch: i64,
    /// SQLite's `PRAGMA synchronous`.
    pub sqlite_synchronous: SqliteSynchronous,
    /// PostgreSQL: keep statements prepared and settings on the session.
    /// Off behind a pooler in transaction mode (PgBouncer), where a session
    /// lasts one transaction: every unit of work is then a transaction of its
    /// own that sets its timeouts, and no statement outlives it.
    pub pg_prepared_statements: bool,
    /// PostgreSQL: where migrations run, when not through the service's own
    /// URL (a direct connection beside a pooler).
    pub migration_url: Option<String>,
}

/// How SQLite syncs its commits to disk (`PRAGMA synchronous`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SqliteSynchronous {
    /// Every commit is on disk before it is answered.
    Full,
    /// Commits are on disk at the next checkpoint; a power cut may lose the
    /// last ones (a crash of the process alone loses nothing).
    Normal,
}

impl SqliteSynchronous {
    pub fn as_pragma(self) -> &'static str {
        match self {
            SqliteSynchronous::Full => "FULL",
            SqliteSynchronous::Normal => "NORMAL",
        }
    }
}

/// Where the data lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DatabaseUrl {
    Postgres(String),
    Sqlite(std::path::PathBuf),
}

impl DatabaseUrl {
    /// `postgres://…` (or `postgresql://…`), or `sqlite://PATH`.
    pub fn parse(url: &str) -> Result<Self, String> {
        let url = url.trim();
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(DatabaseUrl::Postgres(url.to_owned()));
        }
        match url.strip_prefix("sqlite://") {
            Some("") => Err("sqlite:// needs a file path, e.g. sqlite://holdfast.db".into()),
            Some(path) => Ok(DatabaseUrl::Sqlite(path.into())),
            None => Err(format!("{url:?} is neither sqlite://PATH nor postgres://…")),
        }
    }
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

/// Runs a store call within the call timeout, with a gate that tells a
/// failure that wrote nothing from one whose COMMIT may have been sent.
macro_rules! bounded {
    ($self:ident, $context:literal, $store:ident => $call:expr) => {
        bounded!($self, $context, pg $store => $call, lite $store => $call)
    };
    (
        $self:ident, $context:literal,
        pg $pg:ident => $pg_call:expr,
        lite $lite:ident => $lite_call:expr
    ) => {{
        let timeout = $self.settings().call_timeout;
        let gate = outcome::Gate::new();
        let call = outcome::with_gate(gate.clone(), async {
            match $self {
                Store::Postgres($pg) => $pg_call.await,
                Store::Sqlite($lite) => $lite_call.await,
            }
        });
        match tokio::time::timeout(timeout, call).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(e.with_outcome(gate.outcome())),
            Err(_) => Err(StoreError::unavailable(
                $context,
                format!("no answer within {timeout:?} (timeout)"),
            )
            .with_outcome(gate.abandon())),
        }
    }};
}

/// A shared statement (`statements.rs`) run within the call timeout, on a
/// connection of either backend with its clock: `|now| name(args…)`.
macro_rules! shared {
    ($self:ident, $context:literal, read |$now:ident| $name:ident($($arg:expr),* $(,)?)) => {
        bounded!($self, $context,
            pg s => s.read(async |c, $now| statements::pg::$name(c, $($arg),*).await),
            lite s => s.read($context, move |c| {
                let $now = sqlite::clock();
                statements::lite::$name(c, $($arg),*)
            }))
    };
    ($self:ident, $context:literal, write |$now:ident| $name:ident($($arg:expr),* $(,)?)) => {
        bounded!($self, $context,
            pg s => s.sessions().transaction(async |c| {
                let $now = postgres::db_now(c).await?;
                statements::pg::$name(c, $($arg),*).await
            }),
            lite s => s.write_now($context, move |c, $now| statements::lite::$name(c, $($arg),*)))
    };
}

impl Store {
    /// Opens the database at `url` (not yet migrated).
    pub async fn open(url: &DatabaseUrl, settings: &StoreSettings) -> StoreResult<Self> {
        match url {
            DatabaseUrl::Postgres(url) => {
                Ok(Self::Postgres(postgres::PgStore::connect(url, settings)?))
            }
            DatabaseUrl::Sqlite(path) => {
                Ok(Self::Sqlite(sqlite::SqliteStore::open(path, settings)?))
            }
        }
    }

    pub async fn migrate(&self) -> StoreResult<()> {
        dispatch!(self, s => s.migrate().await)
    }

    /// Checks that the event feed can go on from where its pollers are (see
    /// `PgStore::check_feed`); SQLite's positions need no check.
    pub async fn check_feed(&self) -> StoreResult<()> {
        match self {
            Store::Postgres(s) => s.check_feed().await,
            Store::Sqlite(_) => Ok(()),
        }
    }

    pub async fn ping(&self) -> StoreResult<()> {
        bounded!(self, "answer a ping", s => s.ping())
    }

    /// `None` when an asset with this id exists.
    pub async fn create_asset(
        &self,
        id: &AssetId,
        name: &str,
        available_from: Option<Timestamp>,
    ) -> StoreResult<Option<Asset>> {
        let (id, name) = (id.clone(), name.to_owned());
        shared!(
            self,
            "create an asset",
            write | now | create_asset(&id, &name, available_from, now)
        )
    }

    /// `None` when the asset does not exist.
    pub async fn set_available_from(
        &self,
        id: &AssetId,
        available_from: Option<Timestamp>,
    ) -> StoreResult<Option<Asset>> {
        let id = id.clone();
        shared!(
            self,
            "set when the sale opens",
            write | now | set_available_from(&id, available_from, now)
        )
    }

    /// `actor` (the API key acting) is named in the events.
    pub async fn withdraw(
        &self,
        id: &AssetId,
        force: bool,
        actor: &str,
    ) -> StoreResult<WithdrawOutcome> {
        bounded!(self, "withdraw the asset", s => s.withdraw(id, force, actor))
    }

    pub async fn reinstate(&self, id: &AssetId, actor: &str) -> StoreResult<ReinstateOutcome> {
        bounded!(self, "reinstate the asset", s => s.reinstate(id, actor))
    }

    pub async fn get_asset(&self, id: &AssetId) -> StoreResult<Option<Asset>> {
        let id = id.to_string();
        shared!(self, "read an asset", read | now | asset(&id, now))
    }

    /// Up to `page.limit` assets in id order, by effective status.
    pub async fn list_assets(&self, page: &AssetPage) -> StoreResult<Vec<Asset>> {
        let page = page.clone();
        shared!(self, "list assets", read | now | assets_page(&page, now))
    }

    /// Up to `limit` of the asset's events after sequence number `after`,
    /// oldest first; `None` when the asset does not exist.
    pub async fn asset_events(
        &self,
        id: &AssetId,
        after: i64,
        limit: i64,
    ) -> StoreResult<Option<Vec<Event>>> {
        let id = id.to_string();
        shared!(
            self,
            "read an asset's events",
            read | _now | asset_events(&id, after, limit)
        )
    }

    /// The reservation; with `visible_to`, only when that client owns it.
    pub async fn get_reservation(
        &self,
        id: &ReservationId,
        visible_to: Option<&str>,
    ) -> StoreResult<Option<Reservation>> {
        let (id, visible_to) = (id.to_string(), visible_to.map(str::to_owned));
        shared!(
            self,
            "read a reservation",
            read | now | load_reservation(&id, now, visible_to.as_deref())
        )
    }

    pub async fn hold(&self, req: &HoldRequest) -> StoreResult<Keyed<HoldOutcome>> {
        bounded!(self, "hold the asset", s => s.hold(req))
    }

    pub async fn commit(&self, req: &CommitRequest) -> StoreResult<Keyed<CommitOutcome>> {
        bounded!(self, "commit the reservation", s => s.commit(req))
    }

    pub async fn release(&self, req: &ReleaseRequest) -> StoreResult<Keyed<ReleaseOutcome>> {
        bounded!(self, "release the reservation", s => s.release(req))
    }

    pub async fn extend(&self, req: &ExtendRequest) -> StoreResult<Keyed<ExtendOutcome>> {
        bounded!(self, "extend the hold", s => s.extend(req))
    }

    pub async fn void(&self, req: &VoidRequest) -> StoreResult<Keyed<VoidOutcome>> {
        bounded!(self, "void the sale", s => s.void(req))
    }

    /// The fate of `reference` in `scope` (sales recorded before scopes
    /// count in every scope), or in every scope when `scope` is `None`.
    pub async fn payments(
        &self,
        scope: Option<&str>,
        reference: &PaymentReference,
    ) -> StoreResult<Vec<(String, Payment)>> {
        bounded!(self, "read a payment", s => s.payments(scope, reference))
    }

    pub async fn list_reservations(&self, page: &ReservationPage) -> StoreResult<Vec<Reservation>> {
        let page = page.clone();
        shared!(
            self,
            "list reservations",
            read | now | reservations_page(&page, now)
        )
    }

    pub async fn complete_refund(
        &self,
        req: &CompleteRefundRequest,
    ) -> StoreResult<Keyed<CompleteRefundOutcome>> {
        bounded!(self, "complete the refund", s => s.complete_refund(req))
    }

    pub async fn list_refunds(&self, page: &RefundPage) -> StoreResult<Vec<Refund>> {
        let page = page.clone();
        shared!(self, "list refunds", read | _now | refunds_page(&page))
    }

    /// One page of the event feed (or of its dead events), oldest first.
    pub async fn event_feed(&self, page: FeedPage) -> StoreResult<Vec<(FeedCursor, Event)>> {
        bounded!(self, "read the event feed", s => s.event_feed(page))
    }

    /// Schedules an event for delivery again; `None` when it does not exist.
    pub async fn redeliver(&self, id: &EventId) -> StoreResult<Option<Event>> {
        let id = id.to_string();
        shared!(
            self,
            "schedule an event again",
            write | _now | redeliver(&id)
        )
    }

    /// Claims up to `limit` due events; each stays claimed for `lease`.
    pub async fn claim_deliveries(
        &self,
        limit: i64,
        lease: Duration,
    ) -> StoreResult<Vec<Delivery>> {
        bounded!(self, "claim events to deliver", s => s.claim_deliveries(limit, lease))
    }

    pub async fn finish_delivery(&self, id: &str, result: &DeliveryResult) -> StoreResult<()> {
        bounded!(self, "record a delivery", s => s.finish_delivery(id, result))
    }

    /// Expires lapsed holds and purges idempotency records past retention.
    pub async fn sweep(&self) -> StoreResult<SweepReport> {
        dispatch!(self, s => s.sweep(s.settings()).await)
    }

    /// Checks every invariant; events older than `events_since` may have been
    /// purged and are not required.
    pub async fn audit(&self, events_since: Timestamp) -> StoreResult<Vec<Finding>> {
        let postgres = matches!(self, Store::Postgres(_));
        match self {
            Store::Postgres(s) => {
                s.read(async |c, _| statements::pg::audit(c, events_since, postgres).await)
                    .await
            }
            Store::Sqlite(s) => {
                s.read("audit the invariants", move |c| {
                    statements::lite::audit(c, events_since, postgres)
                })
                .await
            }
        }
    }

    /// Writes a consistent copy of a live embedded database to `target`.
    pub async fn backup(&self, target: &std::path::Path) -> StoreResult<()> {
        match self {
            Store::Sqlite(s) => s.backup(target).await,
            Store::Postgres(_) => Err(StoreError::Config(
                "backup copies the embedded SQLite database; for PostgreSQL use pg_basebackup \
                 or pg_dump"
                    .into(),
            )),
        }
    }

    pub fn settings(&self) -> &StoreSettings {
        dispatch!(self, s => s.settings())
    }

    pub fn pool_status(&self) -> PoolStatus {
        dispatch!(self, s => s.pool_status())
    }

    /// Where the data lives, for the start-up line (no credentials).
    pub fn describe(&self) -> String {
        dispatch!(self, s => s.describe())
    }

    /// Assets per effective status; statuses no asset has are left out.
    pub async fn asset_counts(&self) -> StoreResult<Vec<(AssetStatus, i64)>> {
        shared!(self, "count assets", read | now | asset_counts(now))
    }
}
