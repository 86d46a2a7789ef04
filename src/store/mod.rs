//! The store: one method per use case, each deciding every transition with
//! one conditional write inside one short transaction.
//!
//! Where things are:
//!
//! - [`api`]: what each use case is asked and answers (typed outcomes; the
//!   bytes of a stored answer come from the [`Render`] the store is built
//!   with), and the settings and [`Policy`] fixed at build time.
//! - `tx/`: the transitions, one module each. A module reads what its
//!   decision needs in one snapshot, decides with the domain rules, and
//!   makes one conditional write whose answer is built from that snapshot;
//!   where the two dialects' SQL differs, both are in the module side by
//!   side. `read.rs` has the plain reads, `feed.rs` the event feed and
//!   webhook deliveries, `sweep.rs` the janitor's pass.
//! - `conn.rs`: one connection of either backend, so that a statement both
//!   dialects share is written once; `postgres.rs` and `sqlite.rs` open the
//!   pools and run work on them.
//!
//! Decisions are made in the transition modules (with `crate::domain`'s
//! rules); the backends only run statements.

mod api;
mod audit;
mod coalesce;
mod columns;
mod conn;
mod db;
mod error;
mod feed;
mod grouped;
mod home;
mod outcome;
mod plans;
pub mod postgres;
mod read;
mod rows;
mod running;
mod schema;
pub mod sqlite;
mod sweep;
mod tx;

use std::sync::Arc;

pub use api::*;
pub use audit::Finding;

/// How many checks `holdfast audit` runs.
pub fn audit_checks() -> usize {
    audit::checks().len()
}
pub use db::Store;
pub use error::{StoreError, StoreResult};
pub use outcome::WriteOutcome;
pub use running::{Mark, Running};
/// The hold's statements on PostgreSQL, for the benchmark's pgbench scripts.
pub use tx::hold::{HOLD_SNAPSHOT_ONE_SQL, HOLD_SNAPSHOT_SQL, HOLD_SQL};
pub use tx::import::{ImportReport, Importer};
/// The batched first read of requests about reservations, for the tests of
/// its plan.
pub use tx::RESERVATION_SNAPSHOT_BATCH_SQL;

pub use tx::waitlist::LeaveOutcome;

use crate::domain::{
    Asset, AssetId, AssetStatus, BuyerId, Event, EventId, Payment, PaymentReference, Refund,
    Reservation, ReservationId, Timestamp, WaitlistEntry,
};

impl Store {
    /// Opens the database at `url` (not yet migrated); stored answers are
    /// rendered by `render`.
    pub async fn open(
        url: &DatabaseUrl,
        settings: &StoreSettings,
        render: Arc<dyn Render>,
    ) -> StoreResult<Self> {
        let readers = db::Readers {
            holds: |sessions, inputs| Box::pin(tx::hold::read_snapshots(sessions, inputs)),
            reservations: |sessions, inputs| Box::pin(tx::read_snapshots(sessions, inputs)),
        };
        Store::connect(url, settings, render, readers)
    }

    pub async fn ping(&self) -> StoreResult<()> {
        self.bounded("answer a ping", read::ping(self)).await
    }

    /// `None` when an asset with this id exists.
    pub async fn create_asset(&self, asset: &NewAsset) -> StoreResult<Option<Asset>> {
        let call = tx::catalogue::create(self, asset);
        self.bounded("create an asset", call).await
    }

    /// Creates a batch of assets under an Idempotency-Key, all or none.
    pub async fn create_assets(
        &self,
        items: &[NewAsset],
        idempotency: &Idempotency,
    ) -> StoreResult<Keyed<BatchOutcome>> {
        let call = tx::catalogue::create_many(self, items, idempotency);
        self.bounded("create the assets", call).await
    }

    /// A writer of catalogue imports, batch by batch (`holdfast import`).
    pub async fn importer(&self) -> StoreResult<Importer> {
        Importer::open(self).await
    }

    /// Changes an asset's catalogue data or when its sale opens; `client`
    /// (the API key acting) is named in the event.
    pub async fn update_asset(
        &self,
        id: &AssetId,
        change: &AssetChange,
        client: &str,
    ) -> StoreResult<ChangeOutcome> {
        let call = tx::catalogue::update(self, id, change, client);
        self.bounded("change the asset", call).await
    }

    /// Queues a buyer for an asset held by someone else.
    pub async fn join_waitlist(&self, req: &JoinRequest) -> StoreResult<Keyed<JoinOutcome>> {
        let call = tx::waitlist::join(self, req);
        self.bounded("join the waiting list", call).await
    }

    /// An asset's waiting list as `client` sees it; `None` when the asset
    /// does not exist.
    pub async fn waitlist(
        &self,
        asset: &AssetId,
        client: &Client,
    ) -> StoreResult<Option<Vec<WaitlistEntry>>> {
        let call = tx::waitlist::list(self, asset.as_str(), client);
        self.bounded("read the waiting list", call).await
    }

    /// Takes a buyer of `client` off an asset's waiting list.
    pub async fn leave_waitlist(
        &self,
        asset: &AssetId,
        client: &str,
        buyer: &BuyerId,
    ) -> StoreResult<LeaveOutcome> {
        let call = tx::waitlist::leave(self, asset.as_str(), client, buyer);
        self.bounded("leave the waiting list", call).await
    }

    /// Offers an AVAILABLE asset to a named buyer.
    pub async fn offer(&self, req: &OfferRequest) -> StoreResult<Keyed<OfferOutcome>> {
        self.bounded("make the offer", tx::offer::offer(self, req))
            .await
    }

    /// `client` (the API key acting) is named in the events.
    pub async fn withdraw(
        &self,
        id: &AssetId,
        force: bool,
        client: &str,
    ) -> StoreResult<WithdrawOutcome> {
        let call = tx::assets::withdraw(self, id, force, client);
        self.bounded("withdraw the asset", call).await
    }

    pub async fn reinstate(&self, id: &AssetId, client: &str) -> StoreResult<ReinstateOutcome> {
        let call = tx::assets::reinstate(self, id, client);
        self.bounded("reinstate the asset", call).await
    }

    pub async fn get_asset(&self, id: &AssetId) -> StoreResult<Option<Asset>> {
        self.bounded("read an asset", read::asset(self, id)).await
    }

    /// Up to `page.limit` assets in id order, by effective status.
    pub async fn list_assets(&self, page: &AssetPage) -> StoreResult<Vec<Asset>> {
        self.bounded("list assets", read::assets_page(self, page))
            .await
    }

    /// Assets per effective status; statuses no asset has are left out.
    pub async fn asset_counts(&self) -> StoreResult<Vec<(AssetStatus, i64)>> {
        self.bounded("count assets", read::asset_counts(self)).await
    }

    /// Up to `limit` of the asset's events after sequence number `after`,
    /// oldest first; `None` when the asset does not exist.
    pub async fn asset_events(
        &self,
        id: &AssetId,
        after: i64,
        limit: i64,
    ) -> StoreResult<Option<Vec<Event>>> {
        let call = read::asset_events(self, id, after, limit);
        self.bounded("read an asset's events", call).await
    }

    /// The reservation, when it exists for `client`.
    pub async fn get_reservation(
        &self,
        id: &ReservationId,
        client: &Client,
    ) -> StoreResult<Option<Reservation>> {
        let call = read::reservation(self, id, client);
        self.bounded("read a reservation", call).await
    }

    pub async fn list_reservations(&self, page: &ReservationPage) -> StoreResult<Vec<Reservation>> {
        let call = read::reservations_page(self, page);
        self.bounded("list reservations", call).await
    }

    pub async fn hold(&self, req: &HoldRequest) -> StoreResult<Keyed<HoldOutcome>> {
        self.bounded("hold the asset", tx::hold::hold(self, req))
            .await
    }

    pub async fn commit(&self, req: &CommitRequest) -> StoreResult<Keyed<CommitOutcome>> {
        self.bounded("commit the reservation", tx::commit::commit(self, req))
            .await
    }

    pub async fn release(&self, req: &ReleaseRequest) -> StoreResult<Keyed<ReleaseOutcome>> {
        self.bounded("release the reservation", tx::release::release(self, req))
            .await
    }

    pub async fn extend(&self, req: &ExtendRequest) -> StoreResult<Keyed<ExtendOutcome>> {
        self.bounded("extend the hold", tx::extend::extend(self, req))
            .await
    }

    pub async fn void(&self, req: &VoidRequest) -> StoreResult<Keyed<VoidOutcome>> {
        self.bounded("void the sale", tx::void::void(self, req))
            .await
    }

    /// The fate of `reference` for `client` (sales recorded before clients
    /// count for every client), or for every client when `client` is `None`.
    pub async fn payments(
        &self,
        client: Option<&str>,
        reference: &PaymentReference,
    ) -> StoreResult<Vec<(String, Payment)>> {
        let call = read::payment_of(self, client, reference);
        self.bounded("read a payment", call).await
    }

    pub async fn complete_refund(
        &self,
        req: &CompleteRefundRequest,
    ) -> StoreResult<Keyed<CompleteRefundOutcome>> {
        let call = tx::refund::complete(self, req);
        self.bounded("complete the refund", call).await
    }

    pub async fn list_refunds(&self, page: &RefundPage) -> StoreResult<Vec<Refund>> {
        self.bounded("list refunds", read::refunds_page(self, page))
            .await
    }

    /// One page of the event feed (or of its dead events), oldest first.
    pub async fn event_feed(&self, page: FeedPage) -> StoreResult<Vec<(FeedCursor, Event)>> {
        self.bounded("read the event feed", feed::page(self, page))
            .await
    }

    /// Schedules an event for delivery again; `None` when it does not exist.
    pub async fn redeliver(&self, id: &EventId) -> StoreResult<Option<Event>> {
        self.bounded("schedule an event again", feed::redeliver(self, id))
            .await
    }

    /// Claims up to `limit` due events; each stays claimed for `lease`.
    pub async fn claim_deliveries(
        &self,
        limit: i64,
        lease: std::time::Duration,
    ) -> StoreResult<Vec<Delivery>> {
        let call = feed::claim(self, limit, lease);
        self.bounded("claim events to deliver", call).await
    }

    pub async fn finish_delivery(&self, id: &str, result: &DeliveryResult) -> StoreResult<()> {
        let call = feed::finish(self, id, result);
        self.bounded("record a delivery", call).await
    }

    /// One janitor pass: expires lapsed holds and purges what is past its
    /// retention, each batch its own call; it ends after the batch under way
    /// once `go_on` says no (a shutdown).
    pub async fn sweep_while(&self, go_on: &(dyn Fn() -> bool + Sync)) -> StoreResult<SweepReport> {
        sweep::pass(self, go_on).await
    }

    /// Checks every invariant; events older than `events_since` may have been
    /// purged and are not required. `progress` hears of each finding as it
    /// comes, with the time its check took.
    pub async fn audit(
        &self,
        events_since: Timestamp,
        progress: &(dyn Fn(&Finding, std::time::Duration) + Sync),
    ) -> StoreResult<Vec<Finding>> {
        audit::run(self, events_since, progress).await
    }
}
