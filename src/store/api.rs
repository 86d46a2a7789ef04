//! What the store is asked and what it answers: one request and one typed
//! outcome per use case, the pages of the lists, and the settings the store
//! is built with. Nothing here knows HTTP: the outcomes are values, and the
//! bytes of an answer stored for replay come from the [`Render`] the store
//! was built with.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::domain::{
    Asset, AssetId, AssetStatus, AssetUnavailable, AttributeValue, Attributes, BuyerId, Event,
    FieldError, IdempotencyKey, Metadata, Payment, PaymentReference, Price, Refund, RefundId,
    RefundReason, RefundStatus, Reservation, ReservationId, ReservationStatus, Timestamp,
    WaitlistEntry,
};

/// The authenticated caller, as the store needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Client {
    /// Its API key's name; the one open client without keys.
    pub name: String,
    /// A storefront: only its own reservations exist for it.
    pub own_only: bool,
}

impl Client {
    /// A caller that sees every client's reservations.
    pub fn seeing_all(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            own_only: false,
        }
    }

    /// Whether a reservation of `owner` exists for this caller.
    pub fn sees(&self, owner: &str) -> bool {
        !self.own_only || self.name == owner
    }

    /// The client whose reservations alone this caller sees, if only its own.
    pub fn own_filter(&self) -> Option<&str> {
        self.own_only.then_some(self.name.as_str())
    }
}

/// The Idempotency-Key a request came with.
#[derive(Debug, Clone)]
pub struct Idempotency {
    /// The client whose key it is: keys are scoped by client.
    pub client: String,
    pub key: IdempotencyKey,
    /// Hash of method, route, path parameters and canonical body.
    pub fingerprint: String,
    /// This attempt, marked as running on this instance.
    pub running: Option<std::sync::Arc<super::Mark>>,
}

impl Idempotency {
    /// Whether an earlier attempt of this request still runs here.
    pub(crate) fn behind(&self) -> bool {
        self.running.as_ref().is_some_and(|mark| mark.behind())
    }
}

/// An answer as the client was given it, to be given again on a replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    pub status: u16,
    pub body: String,
    pub location: Option<String>,
}

/// The answers a write stores under its Idempotency-Key, before they are
/// bytes.
#[derive(Debug, Clone, Copy)]
pub enum Answer<'a> {
    /// A new hold.
    Held(&'a Reservation),
    /// A reservation as a change left it.
    Changed(&'a Reservation),
    /// A payment refused, with the refund that gives it back.
    Refused {
        reason: RefundReason,
        reservation: &'a Reservation,
        refund: &'a Refund,
    },
    /// A refund the payment system reported done.
    RefundCompleted(&'a Refund),
    /// A buyer's place in a waiting list: new (`joined`) or as it was.
    Waiting {
        entry: &'a WaitlistEntry,
        joined: bool,
    },
    /// A batch of assets created: the ids created and those already there.
    Batch {
        created: &'a [String],
        unchanged: &'a [String],
    },
}

/// Turns a stored answer into bytes, exactly as the client is answered:
/// given to the store when it is built, so that the store writes the very
/// bytes a replay sends, without knowing statuses itself.
pub trait Render: Send + Sync + 'static {
    fn render(&self, answer: Answer<'_>) -> Rendered;
}

/// What a request with an `Idempotency-Key` came to: its own outcome, or
/// what every keyed request can come to (a stored answer sent again, a key
/// used for another request, a target that does not exist).
#[derive(Debug)]
pub enum Keyed<T> {
    Done(T),
    Replayed(Rendered),
    KeyReused,
    NotFound,
    /// An earlier attempt of the same request still runs.
    InUse,
}

/// The rules the store applies, fixed when it is built.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    /// Most live holds one (client, buyer) may have; `None` for no limit.
    pub max_live_holds: Option<i64>,
    /// No hold may last longer than this from its creation.
    pub hold_max_total_seconds: i64,
    /// After the hold lapsed, still sell when nobody held or bought the
    /// asset since (HOLDFAST_LATE_COMMIT=accept-if-free).
    pub accept_late_commits: bool,
    /// How long the hold handed to the first waiter lasts.
    pub waitlist_hold_seconds: i64,
    /// The most buyers that may wait for one asset.
    pub waitlist_max: i64,
    /// The longest an offer may last from its creation, extensions included.
    pub offer_max_seconds: i64,
    /// The shortest an offer may last (the shortest hold).
    pub offer_min_seconds: i64,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            max_live_holds: Some(5),
            hold_max_total_seconds: 7200,
            accept_late_commits: false,
            waitlist_hold_seconds: 900,
            waitlist_max: 1000,
            offer_max_seconds: 14 * 86_400,
            offer_min_seconds: 30,
        }
    }
}

impl Policy {
    /// The least reservation id a hold live at `at` can have. A hold lasts
    /// at most `hold_max_total_seconds` from its creation (a waiter's hold
    /// `waitlist_hold_seconds`), and its id is made at its creation
    /// ([`ReservationId::at`]), so that the buyer's live holds are a range of
    /// `reservations_buyer_idx` (buyer, id) as short as the buyer's last
    /// hours, however long the buyer's history. A day more covers ids made by
    /// an application server's clock before ids took the database's, and a
    /// longest hold shortened by a restart since.
    pub fn live_holds_since(&self, at: Timestamp) -> String {
        ids_since(self.longest_hold(), at)
    }

    /// The least reservation id that any reservation live at `at` can
    /// have, offers included (`offer_max_seconds`): see
    /// [`Policy::live_holds_since`].
    pub fn live_since(&self, at: Timestamp) -> String {
        ids_since(self.longest_hold().max(self.offer_max_seconds), at)
    }

    /// The longest a hold (not an offer) lives from its creation.
    fn longest_hold(&self) -> i64 {
        self.hold_max_total_seconds.max(self.waitlist_hold_seconds)
    }
}

/// The least reservation id made `longest` seconds and a day before `at`.
fn ids_since(longest: i64, at: Timestamp) -> String {
    let since = chrono::Duration::try_seconds(longest.saturating_add(86_400))
        .and_then(|span| at.checked_sub_signed(span))
        .unwrap_or(chrono::DateTime::UNIX_EPOCH);
    ReservationId::floor(since).to_string()
}

#[derive(Debug, Clone)]
pub struct HoldRequest {
    pub asset_id: AssetId,
    pub buyer_id: BuyerId,
    pub hold_seconds: i64,
    pub idempotency: Idempotency,
    /// The client holding on the buyer's behalf, who owns the reservation.
    pub client: String,
    /// The shop's own references, kept with the reservation.
    pub metadata: Option<Metadata>,
    /// When the request arrived, on this instance's monotonic clock: the
    /// hold is decided on the asset as it stood then (`hold_decision`), a
    /// moment placed on the database's clock by the first read.
    pub arrived: std::time::Instant,
}

#[derive(Debug)]
pub enum HoldOutcome {
    Created(Box<Reservation>),
    /// The same buyer of the same client holds it already (live): that
    /// reservation, unchanged.
    Own(Box<Reservation>),
    Unavailable(AssetUnavailable),
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
pub struct OfferRequest {
    pub asset_id: AssetId,
    pub buyer_id: BuyerId,
    /// The storefront client that owns the reservation.
    pub client: String,
    /// When the offer lapses.
    pub expires_at: Timestamp,
    pub metadata: Option<Metadata>,
    pub idempotency: Idempotency,
    /// The admin making the offer, named in its event.
    pub by: String,
    /// When the request arrived: the offer is decided on the asset as it
    /// stood then, as a hold is.
    pub arrived: std::time::Instant,
}

#[derive(Debug)]
pub enum OfferOutcome {
    Created(Box<Reservation>),
    Unavailable(AssetUnavailable),
    /// `expires_at` must lie within these, by the database's clock.
    OutOfRange {
        earliest: Timestamp,
        latest: Timestamp,
    },
}

#[derive(Debug, Clone)]
pub struct JoinRequest {
    pub asset_id: AssetId,
    pub buyer_id: BuyerId,
    /// The client queueing on the buyer's behalf, who owns the entry.
    pub client: String,
    pub idempotency: Idempotency,
    /// When the request arrived: only a hold that began before it is
    /// queued for.
    pub arrived: std::time::Instant,
}

#[derive(Debug)]
pub enum JoinOutcome {
    Joined(WaitlistEntry),
    /// This buyer of this client waits already: its entry, as it is.
    Already(WaitlistEntry),
    /// Only an asset held by someone else has a queue: it is `status` (or
    /// held by this very buyer).
    NotOpen(AssetStatus),
    /// The queue has its most waiters.
    Full {
        max: i64,
    },
}

#[derive(Debug, Clone)]
pub struct CommitRequest {
    pub reservation_id: ReservationId,
    pub payment_reference: PaymentReference,
    /// The payments client: references are scoped by it.
    pub client: String,
    /// What the payment took, when the payment system says.
    pub amount: Option<Price>,
    pub idempotency: Idempotency,
}

#[derive(Debug)]
pub enum CommitOutcome {
    Committed(Reservation),
    /// Committed after the hold lapsed, the asset being free (accept-if-free).
    CommittedLate(Reservation),
    /// Committed before with the same payment: nothing changed.
    AlreadyCommitted(Reservation),
    /// Refused with the refund this request created.
    Refunded {
        reason: RefundReason,
        reservation: Reservation,
        refund: Refund,
    },
    /// Refused with the refund an earlier request created for this payment.
    Refused {
        reason: RefundReason,
        reservation: Reservation,
        refund: Refund,
    },
    /// The sale this payment bought was voided (and the void's refund, if it
    /// gave one): nothing new.
    SaleVoided {
        reservation: Reservation,
        refund: Option<Refund>,
    },
    /// The payment has its fate through another reservation: nothing changed.
    PaymentReferenceUsed {
        reservation: Box<Reservation>,
        payment: Box<Payment>,
    },
}

#[derive(Debug, Clone)]
pub struct ReleaseRequest {
    pub reservation_id: ReservationId,
    pub idempotency: Idempotency,
    pub client: Client,
}

#[derive(Debug)]
pub enum ReleaseOutcome {
    Released(Reservation),
    /// Released before: nothing changed.
    AlreadyReleased(Reservation),
    NotActive(Reservation),
}

/// When an extended hold lapses.
#[derive(Debug, Clone, Copy)]
pub enum Until {
    /// This many seconds from now (the database's clock).
    Seconds(i64),
    /// At this instant.
    At(Timestamp),
}

#[derive(Debug, Clone)]
pub struct ExtendRequest {
    pub reservation_id: ReservationId,
    pub until: Until,
    pub idempotency: Idempotency,
    pub client: Client,
}

#[derive(Debug)]
pub enum ExtendOutcome {
    Extended(Reservation),
    /// Not a live hold: nothing changed.
    NotActive(Reservation),
    /// The hold would outlive its cap (`max_total_seconds` from its
    /// creation): nothing changed.
    LimitReached {
        reservation: Reservation,
        max_total_seconds: i64,
    },
    /// The new expiry is not ahead of now: nothing changed.
    NotAhead(Reservation),
}

#[derive(Debug, Clone)]
pub struct VoidRequest {
    pub reservation_id: ReservationId,
    /// Give the payment back (a SALE_VOIDED refund); false after a chargeback.
    pub refund: bool,
    pub idempotency: Idempotency,
    /// The client voiding the sale, named in its events.
    pub client: String,
}

#[derive(Debug)]
pub enum VoidOutcome {
    Voided(Reservation),
    /// Voided before: nothing changed.
    AlreadyVoided(Reservation),
    /// Not a sale: nothing changed.
    NotActive(Reservation),
}

#[derive(Debug, Clone)]
pub struct CompleteRefundRequest {
    pub refund_id: RefundId,
    pub idempotency: Idempotency,
}

#[derive(Debug)]
pub enum CompleteRefundOutcome {
    Completed(Refund),
    /// Completed before: nothing changed.
    AlreadyCompleted(Refund),
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

/// Filter and position of one page of a list in id order (assets; refunds,
/// whose ids sort in creation order): at most `limit` rows with this status,
/// whose id sorts after `after`.
#[derive(Debug, Clone)]
pub struct StatusPage<S> {
    pub status: Option<S>,
    pub after: Option<String>,
    pub limit: i64,
}

pub type RefundPage = StatusPage<RefundStatus>;

/// Items in a page of assets, reservations or refunds when the request
/// names no limit.
pub const PAGE_DEFAULT: i64 = 50;

/// Items in a page of an asset's events when the request names no limit.
pub const EVENTS_PAGE_DEFAULT: i64 = 500;

/// Filters and position of one page of assets in id order (bytes of the
/// id): at most `limit`, after `after`, matching every filter given.
#[derive(Debug, Clone, Default)]
pub struct AssetPage {
    /// By effective status.
    pub status: Option<AssetStatus>,
    /// Ids that start with this, exactly (case included).
    pub id_prefix: Option<String>,
    /// Every one of these attributes, each equal in kind and value.
    pub attributes: Vec<(String, AttributeValue)>,
    /// Priced in this currency at most this amount.
    pub price_max: Option<Price>,
    pub after: Option<String>,
    pub limit: i64,
}

/// A new asset: its id and catalogue data, and when its sale opens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewAsset {
    pub id: AssetId,
    pub name: String,
    pub price: Option<Price>,
    pub attributes: Attributes,
    pub available_from: Option<Timestamp>,
}

/// A change of an asset: its catalogue data (which changes no version and
/// never a hold; an `asset.updated` event) and when its sale opens (a new
/// version). `None` leaves a member as it is.
#[derive(Debug, Clone, Default)]
pub struct AssetChange {
    pub name: Option<String>,
    /// `Some(None)` removes the price.
    pub price: Option<Option<Price>>,
    /// A JSON Merge Patch of the attributes: `None` values remove keys.
    pub attributes: Option<BTreeMap<String, Option<AttributeValue>>>,
    pub available_from: Option<Option<Timestamp>>,
}

/// What changing an asset did.
#[derive(Debug)]
pub enum ChangeOutcome {
    Changed(Asset),
    /// The attributes would be more than an asset may have: nothing changed.
    TooManyAttributes(FieldError),
    NotFound,
}

/// What creating a batch of assets did: all of them, or none.
#[derive(Debug)]
pub enum BatchOutcome {
    /// The ids created and the ids already there with the same data, in
    /// item order.
    Created {
        created: Vec<String>,
        unchanged: Vec<String>,
    },
    /// These items (index, id) name existing assets with other data:
    /// nothing was written.
    Conflicts(Vec<(usize, String)>),
}

/// Filter and position of one page of reservations, newest first.
#[derive(Debug, Clone)]
pub struct ReservationPage {
    pub buyer_id: Option<String>,
    pub asset_id: Option<String>,
    pub status: Option<ReservationStatus>,
    /// Only this client's reservations; `None` for all.
    pub client: Option<String>,
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

/// Settings the store is built with.
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
    pub policy: Policy,
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

#[cfg(test)]
mod tests {
    use super::Policy;
    use crate::domain::ReservationId;
    use chrono::{Duration, Utc};

    /// The id bounds cover every reservation that can still be live, and
    /// no more than a few days of a buyer's history.
    #[test]
    fn live_reservations_are_within_their_id_bounds() {
        let policy = Policy::default();
        let now = Utc::now();
        let made = |ago: Duration| ReservationId::at(now - ago).to_string();
        let longest_hold = Duration::seconds(policy.hold_max_total_seconds);
        let longest_offer = Duration::seconds(policy.offer_max_seconds);
        assert!(made(longest_hold) >= policy.live_holds_since(now));
        assert!(
            made(Duration::seconds(policy.waitlist_hold_seconds)) >= policy.live_holds_since(now)
        );
        assert!(made(longest_offer) >= policy.live_since(now));
        assert!(made(longest_hold + Duration::days(2)) < policy.live_holds_since(now));
        assert!(made(longest_offer + Duration::days(2)) < policy.live_since(now));
    }
}
