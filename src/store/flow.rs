//! The use cases, every decision written once above the backends: read a
//! consistent snapshot, decide by the domain rules, then hand the backend one
//! conditional [`Change`] together with what to write once it landed (the
//! answer, the events, the stored answer: [`Written`]), which the backend
//! writes in the same transaction. A change that finds the state moved (a
//! lost race, a key or a payment taken concurrently) reads again and decides
//! again, so every answer reflects committed state.

use std::future::Future;

use chrono::Duration;

use super::error::is_unique_violation;
use super::rows::{NewEvent, PaymentRow};
use super::{
    CommitOutcome, CommitRequest, CompleteRefundOutcome, CompleteRefundRequest, Delivery,
    DeliveryResult, ExtendOutcome, ExtendRequest, FeedCursor, FeedPage, HoldOutcome, HoldRequest,
    Idempotency, Keyed, ReinstateOutcome, ReleaseOutcome, ReleaseRequest, StoreError, StoreResult,
    StoreSettings, StoredAnswer, SweepReport, VoidOutcome, VoidRequest, WithdrawOutcome,
};
use crate::domain::{
    commit_decision, extension_allowed, hold_decision, release_decision, withdraw_decision, Asset,
    AssetId, AssetStatus, CommitDecision, Event, EventId, EventType, HoldDecision, HoldTarget,
    Payment, PaymentFate, PaymentOutcome, PaymentReference, Refund, RefundReason, RefundStatus,
    ReleaseDecision, Reservation, ReservationId, ReservationStatus, Timestamp, WithdrawDecision,
};
use crate::reply::{self, Reply};

/// How often a request re-reads after losing a race before giving up with 503.
const MAX_ATTEMPTS: usize = 8;

/// A consistent read: the database clock, the row, and the answer stored under
/// the request's idempotency key, all from one snapshot.
#[derive(Debug)]
pub(crate) struct Snapshot<T> {
    pub now: Timestamp,
    pub row: Option<T>,
    pub stored: Option<StoredAnswer>,
    /// The fate of the payment a commit carries, when it has one.
    pub fate: Option<PaymentFate>,
}

impl<T> Snapshot<T> {
    /// A read under no key: the row alone, at `now`.
    pub(crate) fn unkeyed(now: Timestamp, row: Option<T>) -> Self {
        Self {
            now,
            row,
            stored: None,
            fate: None,
        }
    }
}

/// A payment reference and its scope.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PaymentKey<'a> {
    pub scope: &'a str,
    pub reference: &'a str,
}

/// A hold ready to be written: the reservation, its reply and its event id.
#[derive(Debug)]
pub(crate) struct HoldDraft<'a> {
    pub request: &'a HoldRequest,
    pub reservation: Reservation,
    pub reply: Reply,
    pub event_id: EventId,
}

/// What a hold's write found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Claim {
    Claimed,
    /// Taken meanwhile: read again.
    Taken,
    /// The buyer is at the limit of live holds; nothing written.
    LimitReached,
}

/// One conditional write: it lands whole, or finds the state moved and
/// changes nothing.
#[derive(Debug, Clone)]
pub(crate) enum Change {
    /// Sell the asset to a hold still live at the write's own clock; the
    /// payment's fate is recorded with it.
    Commit {
        reservation: Reservation,
        scope: String,
        reference: String,
        /// The clock of the first read. PostgreSQL records it as the sale's
        /// time: its write is one statement, whose answer is built before it
        /// is sent. SQLite records the clock of its transaction.
        read_at: Timestamp,
    },
    /// End a hold still live at the write's own clock.
    Release {
        reservation: Reservation,
        /// As for `Commit`.
        read_at: Timestamp,
    },
    /// Move a live hold's expiry to `hold_seconds` from the write's clock,
    /// within `max_total_seconds` of its creation.
    Extend {
        reservation: Reservation,
        hold_seconds: i64,
        max_total_seconds: i64,
    },
    /// COMMITTED becomes VOIDED and the asset AVAILABLE; `refund` gives the
    /// payment back.
    Void {
        reservation: Reservation,
        refund: Option<Refund>,
    },
    /// Sell the asset to a lapsed hold when nobody held or bought it since.
    CommitLate {
        reservation: Reservation,
        scope: String,
        reference: String,
    },
    /// Record `refund` as its payment's fate (a lapsed hold nobody swept yet
    /// is expired first).
    Refund {
        reservation: Reservation,
        refund: Refund,
    },
    /// A REQUESTED refund becomes COMPLETED.
    CompleteRefund { refund: Refund },
    /// Take an asset off sale, if it still is at `version`: first expiring
    /// its lapsed hold or releasing its live one, as the snapshot showed.
    Withdraw {
        asset_id: String,
        version: i64,
        expire: Option<String>,
        release: Option<String>,
    },
    /// Put a WITHDRAWN asset back on sale.
    Reinstate { asset_id: String },
}

impl Change {
    /// The asset whose events the change numbers.
    pub(crate) fn asset_id(&self) -> &str {
        match self {
            Change::Commit { reservation, .. }
            | Change::Release { reservation, .. }
            | Change::Extend { reservation, .. }
            | Change::Void { reservation, .. }
            | Change::CommitLate { reservation, .. }
            | Change::Refund { reservation, .. } => &reservation.asset_id,
            Change::CompleteRefund { refund } => &refund.asset_id,
            Change::Withdraw { asset_id, .. } | Change::Reinstate { asset_id } => asset_id,
        }
    }
}

/// What a change wrote, for its answer and events.
#[derive(Debug, Default)]
pub(crate) struct Changed {
    /// The write's own clock.
    pub now: Option<Timestamp>,
    /// The reservation as changed (with its refunds where the change made one).
    pub reservation: Option<Reservation>,
    /// A reservation ended on the way (a withdrawal's expired or released hold).
    pub ended: Option<Reservation>,
    pub asset: Option<Asset>,
    pub refund: Option<Refund>,
    /// The event number the change took with it, if any.
    pub sequence: Option<i64>,
}

impl Changed {
    pub(crate) fn at(&self) -> StoreResult<Timestamp> {
        self.now
            .ok_or_else(|| StoreError::Corrupt("a change without its clock".into()))
    }

    fn reservation(&self) -> StoreResult<&Reservation> {
        self.reservation
            .as_ref()
            .ok_or_else(|| StoreError::Corrupt("a change lost its reservation".into()))
    }

    fn asset(&self) -> StoreResult<&Asset> {
        self.asset
            .as_ref()
            .ok_or_else(|| StoreError::Corrupt("a change lost its asset".into()))
    }
}

/// What goes with a change, in its transaction: its events in order (the
/// backend numbers them), and the answer to store under the request's key.
#[derive(Debug)]
pub(crate) struct Written<T> {
    pub value: T,
    pub events: Vec<NewEvent>,
    /// The reply to store, and the reservation it is about.
    pub answer: Option<(Reply, String)>,
}

/// Builds what goes with a change from what it wrote; pure, so that a
/// backend may run it inside its transaction on any thread.
pub(crate) type Assemble<T> = Box<dyn FnOnce(&Changed) -> StoreResult<Written<T>> + Send>;

/// The fates of a payment reference, and the database clock they were read at.
pub(crate) struct Fates {
    pub now: Timestamp,
    pub rows: Vec<PaymentRow>,
}

/// The primitives each backend provides: reads from one snapshot, and writes
/// each in one transaction.
pub(crate) trait Backend {
    /// The asset to hold and the answer stored under the request's key.
    fn hold_snapshot(
        &self,
        req: &HoldRequest,
    ) -> impl Future<Output = StoreResult<Snapshot<HoldTarget>>> + Send;

    /// Claims the asset for the draft; with `reclaim`, first expires its
    /// lapsed hold in the same transaction. With a per-buyer limit, the
    /// buyer's live holds are counted under a lock of that buyer's own.
    fn claim(
        &self,
        draft: &HoldDraft<'_>,
        reclaim: bool,
    ) -> impl Future<Output = StoreResult<Claim>> + Send;

    /// The stored reservation (without refunds), the answer stored under
    /// the target's key, and the fate of its payment when it has one.
    fn reservation_snapshot(
        &self,
        target: Target<'_>,
    ) -> impl Future<Output = StoreResult<Snapshot<Reservation>>> + Send;

    /// The refund and the answer stored under the request's key.
    fn refund_snapshot(
        &self,
        req: &CompleteRefundRequest,
    ) -> impl Future<Output = StoreResult<Snapshot<Refund>>> + Send;

    /// The stored asset (status as stored, not yet effective) and the clock.
    fn asset_snapshot(
        &self,
        id: &AssetId,
    ) -> impl Future<Output = StoreResult<Snapshot<Asset>>> + Send;

    /// A reservation read before (so it exists) read again, with its
    /// refunds, by effective status at `now`.
    fn reload(
        &self,
        id: &ReservationId,
        now: Timestamp,
    ) -> impl Future<Output = StoreResult<Reservation>> + Send;

    /// The fates of `reference` (in `scope`, or in every scope).
    fn payment_fates(
        &self,
        scope: Option<&str>,
        reference: &str,
    ) -> impl Future<Output = StoreResult<Fates>> + Send;

    /// Makes `change` and, in the same transaction, writes what `assemble`
    /// builds from it: its events (numbered from the one the change took,
    /// then the asset's next), and the answer under `idempotency`. `None`
    /// when the change found the state moved and wrote nothing; a unique
    /// violation when a key or a payment was taken concurrently.
    fn transition<T: Send + 'static>(
        &self,
        change: Change,
        idempotency: Option<&Idempotency>,
        assemble: Assemble<T>,
    ) -> impl Future<Output = StoreResult<Option<T>>> + Send;

    /// Expires up to `limit` lapsed holds in one transaction; how many.
    fn expire_batch(&self, limit: i64) -> impl Future<Output = StoreResult<u64>> + Send;

    /// One page of the event feed.
    fn event_feed(
        &self,
        page: FeedPage,
    ) -> impl Future<Output = StoreResult<Vec<(FeedCursor, Event)>>> + Send;

    /// Claims up to `limit` due events; each stays claimed for `lease`.
    fn claim_deliveries(
        &self,
        limit: i64,
        lease: std::time::Duration,
    ) -> impl Future<Output = StoreResult<Vec<Delivery>>> + Send;

    /// Records what became of one delivery attempt.
    fn finish_delivery(
        &self,
        id: &str,
        result: &DeliveryResult,
    ) -> impl Future<Output = StoreResult<()>> + Send;

    /// Deletes up to `limit` rows of `what` older than `retention`; how many.
    fn purge_batch(
        &self,
        what: Purge,
        limit: i64,
        retention: std::time::Duration,
    ) -> impl Future<Output = StoreResult<u64>> + Send;
}

/// What a janitor deletes once it is past its retention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Purge {
    /// Stored answers of idempotency keys.
    Keys,
    /// Delivered events.
    Events,
}

impl Purge {
    pub(crate) fn context(self) -> &'static str {
        match self {
            Purge::Keys => "purge idempotency records",
            Purge::Events => "purge delivered events",
        }
    }
}

/// What a request gets when its key already has an answer: that answer
/// again, or KEY_REUSED when the key was used for another request.
fn answered<T>(stored: StoredAnswer, idempotency: &Idempotency) -> Keyed<T> {
    match stored.replay_for(&idempotency.fingerprint) {
        Some(reply) => Keyed::Replayed(reply),
        None => Keyed::KeyReused,
    }
}

/// What a conditional write found: its answer, `None` when the state moved
/// under it (the row changed, or a concurrent duplicate took the key), so
/// that the caller reads again.
fn moved_on_conflict<T>(written: StoreResult<Option<T>>) -> StoreResult<Option<T>> {
    match written {
        Err(e) if is_unique_violation(&e) => Ok(None),
        other => other,
    }
}

/// Makes `change` and writes what goes with it under the request's key:
/// its answer, or `None` when it found the state moved (see
/// [`moved_on_conflict`]).
async fn keyed_write<B: Backend, T: Send + 'static>(
    backend: &B,
    change: Change,
    idempotency: &Idempotency,
    assemble: Assemble<T>,
) -> StoreResult<Option<T>> {
    moved_on_conflict(
        backend
            .transition(change, Some(idempotency), assemble)
            .await,
    )
}

/// An event about `reservation`, with data as the API shows it.
fn about(
    reservation: &Reservation,
    event_type: EventType,
    data: String,
    now: Timestamp,
) -> NewEvent {
    NewEvent::new(&reservation.asset_id, event_type, data, now).about(&reservation.reservation_id)
}

/// The events of holds a sweep or a write expired: one each, its data the
/// reservation as it became.
pub(crate) fn expired_event(reservation: &Reservation, sequence: i64, now: Timestamp) -> NewEvent {
    let data = serde_json::to_string(reservation).unwrap_or_default();
    let mut event = about(reservation, EventType::ReservationExpired, data, now);
    event.sequence = sequence;
    event
}

/// The change answered with the reservation as changed, one event of
/// `event_type` carrying that answer, and the answer stored.
fn answered_with(event_type: EventType) -> Assemble<Reply> {
    Box::new(move |changed: &Changed| {
        let reservation = changed.reservation()?;
        let reply = reply::reservation_ok(reservation);
        let event = about(reservation, event_type, reply.body.clone(), changed.at()?);
        Ok(Written {
            events: vec![event],
            answer: Some((reply.clone(), reservation.reservation_id.clone())),
            value: reply,
        })
    })
}

/// The reservation a keyed request is about, and what its first read
/// takes along.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Target<'a> {
    /// What the request does, for its 503 when the row keeps changing.
    context: &'static str,
    pub id: &'a ReservationId,
    pub idempotency: &'a Idempotency,
    /// Only reservations of this owner exist for the caller; `None` sees all.
    pub visible_to: Option<&'a String>,
    /// The payment a commit carries, whose fate is read with it.
    pub payment: Option<PaymentKey<'a>>,
}

impl<'a> Target<'a> {
    fn new(context: &'static str, id: &'a ReservationId, idempotency: &'a Idempotency) -> Self {
        Self {
            context,
            id,
            idempotency,
            visible_to: None,
            payment: None,
        }
    }

    /// Only a reservation of this owner exists for the caller (`None`: all do).
    fn visible_to(self, owner: Option<&'a String>) -> Self {
        Self {
            visible_to: owner,
            ..self
        }
    }

    /// The fate of this payment is read with the reservation.
    fn paying(self, payment: PaymentKey<'a>) -> Self {
        Self {
            payment: Some(payment),
            ..self
        }
    }

    /// Runs the keyed request. Its snapshot answers a stored answer's
    /// replay, a reused key, or a reservation the caller cannot see at once;
    /// else `act` decides on the reservation (by its effective status at the
    /// snapshot's clock, with the fate of the target's payment). While `act`
    /// answers `None` (its write found the state moved), the reservation is
    /// read again and decided again.
    async fn act<B: Backend, T, A>(self, backend: &B, mut act: A) -> StoreResult<Keyed<T>>
    where
        A: AsyncFnMut(Reservation, Timestamp, Option<PaymentFate>) -> StoreResult<Option<T>>,
    {
        for _ in 0..MAX_ATTEMPTS {
            let snap = backend.reservation_snapshot(self).await?;
            if let Some(stored) = snap.stored {
                return Ok(answered(stored, self.idempotency));
            }
            let visible = snap
                .row
                .filter(|r| self.visible_to.is_none_or(|o| &r.owner == o));
            let Some(reservation) = visible else {
                return Ok(Keyed::NotFound);
            };
            let reservation = reservation.effective(snap.now);
            if let Some(outcome) = act(reservation, snap.now, snap.fate).await? {
                return Ok(Keyed::Done(outcome));
            }
        }
        Err(contention(self.context))
    }
}

fn contention(context: &'static str) -> StoreError {
    StoreError::unavailable(context, "the row kept changing under concurrent requests")
}

/// The use cases, each written once for every backend: read a snapshot,
/// decide by the domain rules, and hand the backend the change to make.
pub(crate) trait UseCases: Backend + Sync + Sized {
    async fn hold(&self, req: &HoldRequest) -> StoreResult<Keyed<HoldOutcome>> {
        for _ in 0..MAX_ATTEMPTS {
            let snap = self.hold_snapshot(req).await?;
            if let Some(stored) = snap.stored {
                return Ok(answered(stored, &req.idempotency));
            }
            let reclaim = match hold_decision(snap.row, snap.now) {
                HoldDecision::NotFound => return Ok(Keyed::NotFound),
                HoldDecision::SaleNotOpen { available_from } => {
                    return Ok(Keyed::Done(HoldOutcome::SaleNotOpen { available_from }))
                }
                HoldDecision::Unavailable {
                    status,
                    hold_expires_at,
                } => {
                    return Ok(Keyed::Done(HoldOutcome::Unavailable {
                        status,
                        hold_expires_at,
                    }))
                }
                HoldDecision::Claim => false,
                HoldDecision::Reclaim => true,
            };
            let reservation = Reservation::held(
                ReservationId::generate().to_string(),
                &req.asset_id,
                &req.buyer_id,
                &req.owner,
                snap.now,
                snap.now + Duration::seconds(req.hold_seconds),
            );
            let draft = HoldDraft {
                request: req,
                reply: reply::hold_created(&reservation),
                reservation,
                event_id: EventId::generate(),
            };
            match self.claim(&draft, reclaim).await {
                Ok(Claim::Claimed) => return Ok(Keyed::Done(HoldOutcome::Created(draft.reply))),
                Ok(Claim::LimitReached) => {
                    return Ok(Keyed::Done(HoldOutcome::LimitReached {
                        limit: req.max_live_holds.unwrap_or_default(),
                    }))
                }
                // Taken meanwhile, or the key was used concurrently: look again.
                Ok(Claim::Taken) => continue,
                Err(e) if is_unique_violation(&e) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(contention("hold the asset"))
    }

    async fn commit(&self, req: &CommitRequest) -> StoreResult<Keyed<CommitOutcome>> {
        let payment = PaymentKey {
            scope: &req.payment_scope,
            reference: req.payment_reference.as_str(),
        };
        // The sale of the reservation for the payment: of its live hold, or
        // with `late`, of its lapsed one.
        let sell = async |reservation, now, late| {
            let (scope, reference) = (payment.scope.to_owned(), payment.reference.to_owned());
            let change = if late {
                Change::CommitLate {
                    reservation,
                    scope,
                    reference,
                }
            } else {
                Change::Commit {
                    reservation,
                    scope,
                    reference,
                    read_at: now,
                }
            };
            let sold = answered_with(EventType::ReservationCommitted);
            self.transition(change, Some(&req.idempotency), sold).await
        };
        let mut late_refused = !req.accept_late;
        Target::new(
            "commit the reservation",
            &req.reservation_id,
            &req.idempotency,
        )
        .paying(payment)
        .act(self, async |reservation, now, fate| {
            let id = reservation.reservation_id.clone();
            // Every write below either lands, or finds the state moved (a
            // lost race, a key or a payment taken by a concurrent request)
            // and reads again: the payments table's key decides, not this read.
            let written = match commit_decision(&id, reservation.status, fate.as_ref()) {
                CommitDecision::Commit => {
                    let written = sell(reservation, now, false).await;
                    written.map(|reply| reply.map(CommitOutcome::Committed))
                }
                CommitDecision::Refuse(RefundReason::HoldExpired) if !late_refused => {
                    let written = sell(reservation, now, true).await;
                    if let Ok(None) = written {
                        // Taken meanwhile: the payment is refunded instead.
                        late_refused = true;
                    }
                    written.map(|reply| reply.map(CommitOutcome::CommittedLate))
                }
                CommitDecision::Refuse(reason) => {
                    let (scope, reference) = (payment.scope, payment.reference);
                    let refund = Refund::requested(&reservation, scope, reference, reason, now);
                    let change = Change::Refund {
                        reservation,
                        refund,
                    };
                    let refused = refused_with(reason);
                    let written = self.transition(change, Some(&req.idempotency), refused);
                    let written = written.await;
                    written
                        .map(|reply| reply.map(|reply| CommitOutcome::Refunded { reply, reason }))
                }
                CommitDecision::AlreadyCommittedWithThisPayment => {
                    let current = self.reload(&req.reservation_id, now).await?;
                    return Ok(Some(CommitOutcome::AlreadyCommitted(current)));
                }
                CommitDecision::RefundedBefore => {
                    let current = self.reload(&req.reservation_id, now).await?;
                    let refund_id = fate.and_then(|f| f.refund_id);
                    let refund = current
                        .refunds
                        .iter()
                        .find(|r| Some(&r.refund_id) == refund_id.as_ref())
                        .cloned()
                        .ok_or_else(|| {
                            StoreError::Corrupt(format!(
                                "the refund of reservation {id} for this payment vanished"
                            ))
                        })?;
                    let reason = refund.reason;
                    let reply = reply::commit_refused(reason, &current, &refund).into_reply();
                    return Ok(Some(CommitOutcome::Refused { reply, reason }));
                }
                CommitDecision::SaleVoided => {
                    let current = self.reload(&req.reservation_id, now).await?;
                    let refund = own_refund(&current, payment);
                    let reply = reply::sale_voided(&current, refund).into_reply();
                    return Ok(Some(CommitOutcome::SaleVoided(reply)));
                }
                CommitDecision::UsedElsewhere => {
                    let current = self.reload(&req.reservation_id, now).await?;
                    let scope = Some(payment.scope);
                    let mut fates = self.payments(scope, &req.payment_reference).await?;
                    // Its fate went away between two reads: impossible
                    // unless rows were deleted by hand; read again.
                    return Ok(fates.pop().map(|(_, payment)| {
                        CommitOutcome::PaymentReferenceUsed {
                            reservation: Box::new(current),
                            payment: Box::new(payment),
                        }
                    }));
                }
            };
            moved_on_conflict(written)
        })
        .await
    }

    /// The fates of `reference` with their reservation and refund: in `scope`,
    /// or in every scope.
    async fn payments(
        &self,
        scope: Option<&str>,
        reference: &PaymentReference,
    ) -> StoreResult<Vec<(String, Payment)>> {
        let Fates { now, rows } = self.payment_fates(scope, reference.as_str()).await?;
        let mut found = Vec::with_capacity(rows.len());
        for row in rows {
            let id = super::rows::parse_reservation_id(&row.reservation_id)?;
            let reservation = self.reload(&id, now).await?;
            let key = PaymentKey {
                scope: &row.scope,
                reference: &row.reference,
            };
            let refund = match &row.refund_id {
                Some(refund_id) => reservation
                    .refunds
                    .iter()
                    .find(|r| &r.refund_id == refund_id)
                    .cloned(),
                None => own_refund(&reservation, key).cloned(),
            };
            let payment = Payment {
                payment_reference: row.reference.clone(),
                fate: if row.refund_id.is_some() {
                    PaymentOutcome::Refunded
                } else {
                    PaymentOutcome::Bought
                },
                reservation,
                refund,
            };
            found.push((row.scope, payment));
        }
        Ok(found)
    }

    async fn release(&self, req: &ReleaseRequest) -> StoreResult<Keyed<ReleaseOutcome>> {
        Target::new(
            "release the reservation",
            &req.reservation_id,
            &req.idempotency,
        )
        .visible_to(req.visible_to.as_ref())
        .act(self, async |reservation, now, _| {
            let unchanged = match release_decision(reservation.status) {
                ReleaseDecision::Release => {
                    let change = Change::Release {
                        reservation,
                        read_at: now,
                    };
                    let assemble = answered_with(EventType::ReservationReleased);
                    let written = keyed_write(self, change, &req.idempotency, assemble).await?;
                    return Ok(written.map(ReleaseOutcome::Released));
                }
                ReleaseDecision::AlreadyReleased => ReleaseOutcome::AlreadyReleased,
                ReleaseDecision::NotActive => ReleaseOutcome::NotActive,
            };
            let current = self.reload(&req.reservation_id, now).await?;
            Ok(Some(unchanged(current)))
        })
        .await
    }

    async fn extend(&self, req: &ExtendRequest) -> StoreResult<Keyed<ExtendOutcome>> {
        Target::new("extend the hold", &req.reservation_id, &req.idempotency)
            .visible_to(req.visible_to.as_ref())
            .act(self, async |reservation, now, _| {
                let until = now + Duration::seconds(req.hold_seconds);
                let refused = if reservation.status != ReservationStatus::Held {
                    ExtendOutcome::NotActive
                } else if !extension_allowed(reservation.created_at, until, req.max_total_seconds) {
                    ExtendOutcome::LimitReached
                } else {
                    let change = Change::Extend {
                        reservation,
                        hold_seconds: req.hold_seconds,
                        max_total_seconds: req.max_total_seconds,
                    };
                    let assemble = answered_with(EventType::ReservationExtended);
                    let written = keyed_write(self, change, &req.idempotency, assemble).await?;
                    return Ok(written.map(ExtendOutcome::Extended));
                };
                let current = self.reload(&req.reservation_id, now).await?;
                Ok(Some(refused(current)))
            })
            .await
    }

    async fn void(&self, req: &VoidRequest) -> StoreResult<Keyed<VoidOutcome>> {
        Target::new("void the sale", &req.reservation_id, &req.idempotency)
            .act(self, async |reservation, now, _| {
                let unchanged = match reservation.status {
                    ReservationStatus::Committed => {
                        // Part of the payment's one fate: it bought this sale.
                        let refund = match (
                            req.refund,
                            &reservation.payment_scope,
                            &reservation.payment_reference,
                        ) {
                            (true, Some(scope), Some(payment)) => Some(Refund::requested(
                                &reservation,
                                scope,
                                payment,
                                RefundReason::SaleVoided,
                                now,
                            )),
                            _ => None,
                        };
                        let change = Change::Void {
                            reservation,
                            refund,
                        };
                        let assemble = voided_by(req.actor.clone());
                        let written = keyed_write(self, change, &req.idempotency, assemble).await?;
                        return Ok(written.map(VoidOutcome::Voided));
                    }
                    ReservationStatus::Voided => VoidOutcome::AlreadyVoided,
                    _ => VoidOutcome::NotActive,
                };
                let current = self.reload(&req.reservation_id, now).await?;
                Ok(Some(unchanged(current)))
            })
            .await
    }

    /// Takes an asset off sale; with `force`, a live hold is released first.
    /// One conditional write guarded by the version the decision was made on.
    async fn withdraw(
        &self,
        id: &AssetId,
        force: bool,
        actor: &str,
    ) -> StoreResult<WithdrawOutcome> {
        for _ in 0..MAX_ATTEMPTS {
            let snap = self.asset_snapshot(id).await?;
            let Some(stored) = snap.row else {
                return Ok(WithdrawOutcome::NotFound);
            };
            let (version, held_by) = (stored.version, stored.current_reservation_id.clone());
            let lapsed = stored.status == AssetStatus::Held;
            let asset = stored.effective(snap.now);
            let lapsed = lapsed && asset.status == AssetStatus::Available;
            let release = match withdraw_decision(asset.status, force) {
                WithdrawDecision::AlreadyWithdrawn => return Ok(WithdrawOutcome::Unchanged(asset)),
                WithdrawDecision::Held => return Ok(WithdrawOutcome::Held(asset)),
                WithdrawDecision::Sold => return Ok(WithdrawOutcome::Sold(asset)),
                WithdrawDecision::ReleaseAndWithdraw => held_by.clone(),
                WithdrawDecision::Withdraw => None,
            };
            let change = Change::Withdraw {
                asset_id: id.to_string(),
                version,
                expire: if lapsed { held_by } else { None },
                release,
            };
            let actor = actor.to_owned();
            let written = self
                .transition(
                    change,
                    None,
                    Box::new(move |changed: &Changed| {
                        let at = changed.at()?;
                        let asset = changed.asset()?.clone();
                        let mut events = Vec::new();
                        if let Some(ended) = &changed.ended {
                            let data = reply::reservation_ok(ended).body;
                            events.push(match ended.status {
                                ReservationStatus::Expired => {
                                    about(ended, EventType::ReservationExpired, data, at)
                                }
                                _ => about(ended, EventType::ReservationReleased, data, at)
                                    .by(&actor),
                            });
                        }
                        let data = serde_json::to_string(&asset).unwrap_or_default();
                        events.push(
                            NewEvent::new(&asset.id, EventType::AssetWithdrawn, data, at)
                                .by(&actor),
                        );
                        Ok(Written {
                            value: asset,
                            events,
                            answer: None,
                        })
                    }),
                )
                .await?;
            if let Some(asset) = written {
                return Ok(WithdrawOutcome::Withdrawn(asset));
            }
        }
        Err(contention("withdraw the asset"))
    }

    /// Puts a WITHDRAWN asset back on sale; anything else stays as it is.
    async fn reinstate(&self, id: &AssetId, actor: &str) -> StoreResult<ReinstateOutcome> {
        let actor = actor.to_owned();
        let written = self
            .transition(
                Change::Reinstate {
                    asset_id: id.to_string(),
                },
                None,
                Box::new(move |changed: &Changed| {
                    let asset = changed.asset()?.clone();
                    let data = serde_json::to_string(&asset).unwrap_or_default();
                    let event =
                        NewEvent::new(&asset.id, EventType::AssetReinstated, data, changed.at()?)
                            .by(&actor);
                    Ok(Written {
                        value: asset,
                        events: vec![event],
                        answer: None,
                    })
                }),
            )
            .await?;
        if let Some(asset) = written {
            return Ok(ReinstateOutcome::Reinstated(asset));
        }
        let snap = self.asset_snapshot(id).await?;
        Ok(match snap.row {
            Some(asset) => ReinstateOutcome::Unchanged(asset.effective(snap.now)),
            None => ReinstateOutcome::NotFound,
        })
    }

    /// One janitor pass: lapsed holds batch by batch, then stored answers and
    /// delivered events past retention (events only when they have one), each
    /// batch its own short transaction.
    async fn sweep(&self, settings: &StoreSettings) -> StoreResult<SweepReport> {
        let batch = settings.sweep_batch.max(1);
        let retention = settings.idempotency_retention;
        let mut report = SweepReport {
            expired: batches(batch, || self.expire_batch(batch)).await?,
            purged_keys: batches(batch, || self.purge_batch(Purge::Keys, batch, retention)).await?,
            purged_events: 0,
        };
        if let Some(retention) = settings.event_retention {
            report.purged_events =
                batches(batch, || self.purge_batch(Purge::Events, batch, retention)).await?;
        }
        Ok(report)
    }

    /// The payment system reports a refund done: REQUESTED becomes COMPLETED once.
    async fn complete_refund(
        &self,
        req: &CompleteRefundRequest,
    ) -> StoreResult<Keyed<CompleteRefundOutcome>> {
        for _ in 0..MAX_ATTEMPTS {
            let snap = self.refund_snapshot(req).await?;
            if let Some(stored) = snap.stored {
                return Ok(answered(stored, &req.idempotency));
            }
            let Some(refund) = snap.row else {
                return Ok(Keyed::NotFound);
            };
            if refund.status == RefundStatus::Completed {
                return Ok(Keyed::Done(CompleteRefundOutcome::AlreadyCompleted(refund)));
            }
            let written = self
                .transition(
                    Change::CompleteRefund { refund },
                    Some(&req.idempotency),
                    Box::new(|changed: &Changed| {
                        let completed = changed
                            .refund
                            .as_ref()
                            .ok_or_else(|| StoreError::Corrupt("a refund went missing".into()))?;
                        let reply = Reply::json(200, completed);
                        let event = NewEvent::new(
                            &completed.asset_id,
                            EventType::RefundCompleted,
                            reply.body.clone(),
                            changed.at()?,
                        )
                        .about(&completed.reservation_id);
                        Ok(Written {
                            events: vec![event],
                            answer: Some((reply.clone(), completed.reservation_id.clone())),
                            value: reply,
                        })
                    }),
                )
                .await;
            if let Some(reply) = moved_on_conflict(written)? {
                return Ok(Keyed::Done(CompleteRefundOutcome::Completed(reply)));
            }
        }
        Err(contention("complete the refund"))
    }
}

impl<B: Backend + Sync> UseCases for B {}

/// The refund of a sale's own payment, when its void gave it back.
fn own_refund<'a>(reservation: &'a Reservation, payment: PaymentKey<'_>) -> Option<&'a Refund> {
    reservation.refunds.iter().find(|r| {
        r.reason == RefundReason::SaleVoided
            && r.payment_reference == payment.reference
            && Some(&r.payment_scope) == reservation.payment_scope.as_ref()
    })
}

/// A refused payment answered with the reservation and its refund (the
/// refund's event), and the answer stored.
fn refused_with(reason: RefundReason) -> Assemble<Reply> {
    Box::new(move |changed: &Changed| {
        let current = changed.reservation()?;
        let refund = changed
            .refund
            .as_ref()
            .ok_or_else(|| StoreError::Corrupt("a refund went missing".into()))?;
        let reply = reply::commit_refused(reason, current, refund).into_reply();
        let data = serde_json::to_string(refund).unwrap_or_default();
        Ok(Written {
            events: vec![about(
                current,
                EventType::RefundRequested,
                data,
                changed.at()?,
            )],
            answer: Some((reply.clone(), current.reservation_id.clone())),
            value: reply,
        })
    })
}

/// A void answered with the reservation as voided, its event and the
/// refund's (both naming `actor`), and the answer stored.
fn voided_by(actor: String) -> Assemble<Reply> {
    Box::new(move |changed: &Changed| {
        let current = changed.reservation()?;
        let at = changed.at()?;
        let reply = reply::reservation_ok(current);
        let mut events = vec![about(
            current,
            EventType::ReservationVoided,
            reply.body.clone(),
            at,
        )
        .by(&actor)];
        if let Some(refund) = &changed.refund {
            let data = serde_json::to_string(refund).unwrap_or_default();
            events.push(about(current, EventType::RefundRequested, data, at).by(&actor));
        }
        Ok(Written {
            events,
            answer: Some((reply.clone(), current.reservation_id.clone())),
            value: reply,
        })
    })
}

/// Runs `one` batch after another until one comes back short; how many
/// rows they took together.
async fn batches<F: Future<Output = StoreResult<u64>>>(
    batch: i64,
    mut one: impl FnMut() -> F,
) -> StoreResult<u64> {
    let mut total = 0;
    loop {
        let done = one().await?;
        total += done;
        if done < batch as u64 {
            return Ok(total);
        }
    }
}
