//! The use cases, written once above the backends: read a consistent
//! snapshot, decide by the domain rules, then make the one conditional write.
//! A write that finds the state moved (lost race, key taken concurrently)
//! reads again and decides again, so every answer reflects committed state.

use std::future::Future;

use chrono::Duration;

use super::error::is_unique_violation;
use super::rows::PaymentRow;
use super::{
    CommitOutcome, CommitRequest, CompleteRefundOutcome, CompleteRefundRequest, ExtendOutcome,
    ExtendRequest, HoldOutcome, HoldRequest, Idempotency, ReleaseOutcome, ReleaseRequest,
    StoreError, StoreResult, StoredAnswer, SweepReport, VoidOutcome, VoidRequest,
};
use crate::domain::{
    commit_decision, extension_allowed, hold_decision, release_decision, AssetId, CommitDecision,
    EventId, HoldDecision, HoldTarget, Payment, PaymentFate, PaymentOutcome, PaymentReference,
    Refund, RefundId, RefundReason, RefundStatus, ReleaseDecision, Reservation, ReservationId,
    ReservationStatus, Timestamp,
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

/// The primitives each backend provides; every write is one transaction.
pub(crate) trait Backend {
    fn hold_snapshot(
        &self,
        asset: &AssetId,
        idempotency: &Idempotency,
    ) -> impl Future<Output = StoreResult<Snapshot<HoldTarget>>> + Send;

    /// Claims the asset for the draft; with `reclaim`, first expires its
    /// lapsed hold in the same transaction. With a per-buyer limit, the
    /// buyer's live holds are counted under a lock of that buyer's own.
    fn claim(
        &self,
        draft: &HoldDraft<'_>,
        reclaim: bool,
    ) -> impl Future<Output = StoreResult<Claim>> + Send;

    /// The stored reservation (without refunds), the stored answer, and the
    /// fate of `payment` when one is given.
    fn reservation_snapshot(
        &self,
        id: &ReservationId,
        idempotency: &Idempotency,
        payment: Option<PaymentKey<'_>>,
    ) -> impl Future<Output = StoreResult<Snapshot<Reservation>>> + Send;

    /// The database clock and the fates of `reference`: in `scope` (and the
    /// scope `''` of sales recorded before scopes), or in every scope.
    fn payment_fates(
        &self,
        scope: Option<&str>,
        reference: &str,
    ) -> impl Future<Output = StoreResult<(Timestamp, Vec<PaymentRow>)>> + Send;

    /// The reservation with its refunds, by effective status at `now`.
    fn load_reservation(
        &self,
        id: &ReservationId,
        now: Timestamp,
    ) -> impl Future<Output = StoreResult<Option<Reservation>>> + Send;

    /// Sells the asset to a hold still live at the write's own clock, and
    /// records that `payment` bought it. `None` when it was no longer live;
    /// a unique violation when the payment got a fate meanwhile.
    fn commit(
        &self,
        reservation: &Reservation,
        payment: PaymentKey<'_>,
        idempotency: &Idempotency,
    ) -> impl Future<Output = StoreResult<Option<Reply>>> + Send;

    /// Records the refund of `payment` as its fate (expiring a lapsed hold
    /// first); a unique violation when the payment got a fate meanwhile.
    fn refund(
        &self,
        reservation: &Reservation,
        payment: PaymentKey<'_>,
        reason: RefundReason,
        idempotency: &Idempotency,
        now: Timestamp,
    ) -> impl Future<Output = StoreResult<Reply>> + Send;

    /// The refund and the answer stored under the request's key.
    fn refund_snapshot(
        &self,
        id: &RefundId,
        idempotency: &Idempotency,
    ) -> impl Future<Output = StoreResult<Snapshot<Refund>>> + Send;

    /// Marks a REQUESTED refund COMPLETED. `None` when it no longer was REQUESTED.
    fn complete_refund(
        &self,
        refund: &Refund,
        idempotency: &Idempotency,
    ) -> impl Future<Output = StoreResult<Option<Reply>>> + Send;

    /// Deletes up to `limit` delivered events past retention; how many.
    fn purge_events_batch(&self, limit: i64) -> impl Future<Output = StoreResult<u64>> + Send;

    /// Expires up to `limit` lapsed holds in one transaction; how many.
    fn expire_batch(&self, limit: i64) -> impl Future<Output = StoreResult<u64>> + Send;

    /// Deletes up to `limit` stored answers past retention; how many.
    fn purge_batch(&self, limit: i64) -> impl Future<Output = StoreResult<u64>> + Send;

    /// Moves a live hold's expiry to `hold_seconds` from the write's own
    /// clock, within `max_total_seconds` of its creation. `None` when it was
    /// no longer live, or the cap was passed.
    fn extend(
        &self,
        reservation: &Reservation,
        hold_seconds: i64,
        max_total_seconds: i64,
        idempotency: &Idempotency,
    ) -> impl Future<Output = StoreResult<Option<Reply>>> + Send;

    /// Undoes a sale: COMMITTED becomes VOIDED, the asset AVAILABLE, and
    /// with `refund` the payment is given back (part of its one fate). `None`
    /// when it was no longer the asset's sale. `actor` is named in the events.
    fn void(
        &self,
        reservation: &Reservation,
        refund: bool,
        actor: &str,
        idempotency: &Idempotency,
    ) -> impl Future<Output = StoreResult<Option<Reply>>> + Send;

    /// Sells the asset to a lapsed hold when nobody held or bought it since:
    /// one conditional update, and `payment` recorded as its buyer. `None`
    /// otherwise; a unique violation when the payment got a fate meanwhile.
    fn commit_late(
        &self,
        reservation: &Reservation,
        payment: PaymentKey<'_>,
        idempotency: &Idempotency,
    ) -> impl Future<Output = StoreResult<Option<Reply>>> + Send;

    /// Ends a hold still live at the write's own clock. `None` when it was
    /// no longer live.
    fn release(
        &self,
        reservation: &Reservation,
        idempotency: &Idempotency,
    ) -> impl Future<Output = StoreResult<Option<Reply>>> + Send;
}

fn replay_or_reused(stored: StoredAnswer, idempotency: &Idempotency) -> Result<Reply, ()> {
    stored.replay_for(&idempotency.fingerprint).ok_or(())
}

/// What a conditional write found: its answer, or `None` when the state moved
/// under it (the row changed, or a concurrent duplicate took the key), so
/// that the caller reads again.
fn moved_on_conflict(written: StoreResult<Option<Reply>>) -> StoreResult<Option<Reply>> {
    match written {
        Err(e) if is_unique_violation(&e) => Ok(None),
        other => other,
    }
}

/// A reservation's snapshot before any decision.
enum Found {
    /// The key already has an answer: its replay, or `Err` when the key
    /// was used for another request.
    Answered(Result<Reply, ()>),
    /// No such reservation, or not one the caller may see.
    Missing,
    /// The reservation by its effective status, and the database clock.
    Reservation(Reservation, Timestamp),
}

async fn find_reservation<B: Backend>(
    backend: &B,
    id: &ReservationId,
    idempotency: &Idempotency,
    visible_to: Option<&String>,
) -> StoreResult<Found> {
    Ok(
        find_paid_reservation(backend, id, idempotency, visible_to, None)
            .await?
            .0,
    )
}

/// [`find_reservation`], and the fate of the payment a commit carries.
async fn find_paid_reservation<B: Backend>(
    backend: &B,
    id: &ReservationId,
    idempotency: &Idempotency,
    visible_to: Option<&String>,
    payment: Option<PaymentKey<'_>>,
) -> StoreResult<(Found, Option<PaymentFate>)> {
    let snap = backend
        .reservation_snapshot(id, idempotency, payment)
        .await?;
    if let Some(stored) = snap.stored {
        return Ok((Found::Answered(replay_or_reused(stored, idempotency)), None));
    }
    let found = match snap
        .row
        .filter(|r| visible_to.is_none_or(|o| &r.owner == o))
    {
        Some(row) => Found::Reservation(row.effective(snap.now), snap.now),
        None => Found::Missing,
    };
    Ok((found, snap.fate))
}

fn contention(context: &'static str) -> StoreError {
    StoreError::unavailable(context, "the row kept changing under concurrent requests")
}

pub(crate) async fn hold<B: Backend>(backend: &B, req: &HoldRequest) -> StoreResult<HoldOutcome> {
    for _ in 0..MAX_ATTEMPTS {
        let snap = backend
            .hold_snapshot(&req.asset_id, &req.idempotency)
            .await?;
        if let Some(stored) = snap.stored {
            return Ok(match replay_or_reused(stored, &req.idempotency) {
                Ok(reply) => HoldOutcome::Replayed(reply),
                Err(()) => HoldOutcome::KeyReused,
            });
        }
        let reclaim = match hold_decision(snap.row, snap.now) {
            HoldDecision::NotFound => return Ok(HoldOutcome::NotFound),
            HoldDecision::SaleNotOpen { available_from } => {
                return Ok(HoldOutcome::SaleNotOpen { available_from })
            }
            HoldDecision::Unavailable {
                status,
                hold_expires_at,
            } => {
                return Ok(HoldOutcome::Unavailable {
                    status,
                    hold_expires_at,
                })
            }
            HoldDecision::Claim => false,
            HoldDecision::Reclaim => true,
        };
        let reservation = Reservation {
            reservation_id: ReservationId::generate().to_string(),
            asset_id: req.asset_id.to_string(),
            buyer_id: req.buyer_id.to_string(),
            status: ReservationStatus::Held,
            expires_at: snap.now + Duration::seconds(req.hold_seconds),
            created_at: snap.now,
            committed_at: None,
            released_at: None,
            payment_reference: None,
            voided_at: None,
            refunds: Vec::new(),
            owner: req.owner.clone(),
            payment_scope: None,
        };
        let draft = HoldDraft {
            request: req,
            reply: reply::hold_created(&reservation),
            reservation,
            event_id: EventId::generate(),
        };
        match backend.claim(&draft, reclaim).await {
            Ok(Claim::Claimed) => return Ok(HoldOutcome::Created(draft.reply)),
            Ok(Claim::LimitReached) => {
                return Ok(HoldOutcome::LimitReached {
                    limit: req.max_live_holds.unwrap_or_default(),
                })
            }
            // Taken meanwhile, or the key was used concurrently: look again.
            Ok(Claim::Taken) => continue,
            Err(e) if is_unique_violation(&e) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(contention("hold the asset"))
}

pub(crate) async fn commit<B: Backend>(
    backend: &B,
    req: &CommitRequest,
) -> StoreResult<CommitOutcome> {
    let payment = PaymentKey {
        scope: &req.payment_scope,
        reference: req.payment_reference.as_str(),
    };
    let mut late_refused = !req.accept_late;
    for _ in 0..MAX_ATTEMPTS {
        let (found, fate) = find_paid_reservation(
            backend,
            &req.reservation_id,
            &req.idempotency,
            None,
            Some(payment),
        )
        .await?;
        let (reservation, now) = match found {
            Found::Answered(Ok(reply)) => return Ok(CommitOutcome::Replayed(reply)),
            Found::Answered(Err(())) => return Ok(CommitOutcome::KeyReused),
            Found::Missing => return Ok(CommitOutcome::NotFound),
            Found::Reservation(reservation, now) => (reservation, now),
        };
        // Every write below either lands, or finds the state moved (a lost
        // race, a key or a payment taken by a concurrent request) and reads
        // again: the payments table's key decides, not this read.
        let written = match commit_decision(
            &reservation.reservation_id,
            reservation.status,
            fate.as_ref(),
        ) {
            CommitDecision::Commit => backend
                .commit(&reservation, payment, &req.idempotency)
                .await
                .map(|reply| reply.map(CommitOutcome::Committed)),
            CommitDecision::Refuse(RefundReason::HoldExpired) if !late_refused => {
                let written = backend
                    .commit_late(&reservation, payment, &req.idempotency)
                    .await;
                if let Ok(None) = written {
                    // Taken meanwhile: the payment is refunded instead.
                    late_refused = true;
                }
                written.map(|reply| reply.map(CommitOutcome::CommittedLate))
            }
            CommitDecision::Refuse(reason) => backend
                .refund(&reservation, payment, reason, &req.idempotency, now)
                .await
                .map(|reply| Some(CommitOutcome::Refunded { reply, reason })),
            CommitDecision::AlreadyCommittedWithThisPayment => {
                let current = reload(backend, &req.reservation_id, now).await?;
                return Ok(CommitOutcome::AlreadyCommitted(current));
            }
            CommitDecision::RefundedBefore => {
                let current = reload(backend, &req.reservation_id, now).await?;
                let refund_id = fate.and_then(|f| f.refund_id);
                let refund = current
                    .refunds
                    .iter()
                    .find(|r| Some(&r.refund_id) == refund_id.as_ref())
                    .cloned()
                    .ok_or_else(|| {
                        StoreError::Corrupt(format!(
                            "the refund of reservation {} for this payment vanished",
                            current.reservation_id
                        ))
                    })?;
                let reason = refund.reason;
                let reply = reply::commit_refused(reason, &current, &refund).into_reply();
                return Ok(CommitOutcome::Refused { reply, reason });
            }
            CommitDecision::SaleVoided => {
                let current = reload(backend, &req.reservation_id, now).await?;
                let refund = own_refund(&current, payment);
                let reply = reply::sale_voided(&current, refund).into_reply();
                return Ok(CommitOutcome::SaleVoided(reply));
            }
            CommitDecision::UsedElsewhere => {
                let current = reload(backend, &req.reservation_id, now).await?;
                let mut fates =
                    payments(backend, Some(payment.scope), &req.payment_reference).await?;
                let Some((_, payment)) = fates.pop() else {
                    // Its fate went away between two reads: impossible
                    // unless rows were deleted by hand; read again.
                    continue;
                };
                return Ok(CommitOutcome::PaymentReferenceUsed {
                    reservation: Box::new(current),
                    payment: Box::new(payment),
                });
            }
        };
        match written {
            Ok(Some(outcome)) => return Ok(outcome),
            Ok(None) => continue,
            Err(e) if is_unique_violation(&e) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(contention("commit the reservation"))
}

/// The refund of a sale's own payment, when its void gave it back.
fn own_refund<'a>(reservation: &'a Reservation, payment: PaymentKey<'_>) -> Option<&'a Refund> {
    reservation.refunds.iter().find(|r| {
        r.reason == RefundReason::SaleVoided
            && r.payment_reference == payment.reference
            && Some(&r.payment_scope) == reservation.payment_scope.as_ref()
    })
}

/// The fates of `reference` with their reservation and refund: in `scope`,
/// or in every scope.
pub(crate) async fn payments<B: Backend>(
    backend: &B,
    scope: Option<&str>,
    reference: &PaymentReference,
) -> StoreResult<Vec<(String, Payment)>> {
    let (now, rows) = backend.payment_fates(scope, reference.as_str()).await?;
    let mut found = Vec::with_capacity(rows.len());
    for row in rows {
        let id = super::rows::parse_reservation_id(&row.reservation_id)?;
        let reservation = reload(backend, &id, now).await?;
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

pub(crate) async fn release<B: Backend>(
    backend: &B,
    req: &ReleaseRequest,
) -> StoreResult<ReleaseOutcome> {
    for _ in 0..MAX_ATTEMPTS {
        let (reservation, now) = match find_reservation(
            backend,
            &req.reservation_id,
            &req.idempotency,
            req.visible_to.as_ref(),
        )
        .await?
        {
            Found::Answered(Ok(reply)) => return Ok(ReleaseOutcome::Replayed(reply)),
            Found::Answered(Err(())) => return Ok(ReleaseOutcome::KeyReused),
            Found::Missing => return Ok(ReleaseOutcome::NotFound),
            Found::Reservation(reservation, now) => (reservation, now),
        };
        match release_decision(reservation.status) {
            ReleaseDecision::Release => {
                let written = backend.release(&reservation, &req.idempotency).await;
                if let Some(reply) = moved_on_conflict(written)? {
                    return Ok(ReleaseOutcome::Released(reply));
                }
            }
            ReleaseDecision::AlreadyReleased => {
                let current = reload(backend, &req.reservation_id, now).await?;
                return Ok(ReleaseOutcome::AlreadyReleased(current));
            }
            ReleaseDecision::NotActive => {
                let current = reload(backend, &req.reservation_id, now).await?;
                return Ok(ReleaseOutcome::NotActive(current));
            }
        }
    }
    Err(contention("release the reservation"))
}

pub(crate) async fn extend<B: Backend>(
    backend: &B,
    req: &ExtendRequest,
) -> StoreResult<ExtendOutcome> {
    for _ in 0..MAX_ATTEMPTS {
        let (reservation, now) = match find_reservation(
            backend,
            &req.reservation_id,
            &req.idempotency,
            req.visible_to.as_ref(),
        )
        .await?
        {
            Found::Answered(Ok(reply)) => return Ok(ExtendOutcome::Replayed(reply)),
            Found::Answered(Err(())) => return Ok(ExtendOutcome::KeyReused),
            Found::Missing => return Ok(ExtendOutcome::NotFound),
            Found::Reservation(reservation, now) => (reservation, now),
        };
        if reservation.status != ReservationStatus::Held {
            let current = reload(backend, &req.reservation_id, now).await?;
            return Ok(ExtendOutcome::NotActive(current));
        }
        let until = now + Duration::seconds(req.hold_seconds);
        if !extension_allowed(reservation.created_at, until, req.max_total_seconds) {
            let current = reload(backend, &req.reservation_id, now).await?;
            return Ok(ExtendOutcome::LimitReached(current));
        }
        let written = backend
            .extend(
                &reservation,
                req.hold_seconds,
                req.max_total_seconds,
                &req.idempotency,
            )
            .await;
        if let Some(reply) = moved_on_conflict(written)? {
            return Ok(ExtendOutcome::Extended(reply));
        }
    }
    Err(contention("extend the hold"))
}

pub(crate) async fn void<B: Backend>(backend: &B, req: &VoidRequest) -> StoreResult<VoidOutcome> {
    for _ in 0..MAX_ATTEMPTS {
        let (reservation, now) =
            match find_reservation(backend, &req.reservation_id, &req.idempotency, None).await? {
                Found::Answered(Ok(reply)) => return Ok(VoidOutcome::Replayed(reply)),
                Found::Answered(Err(())) => return Ok(VoidOutcome::KeyReused),
                Found::Missing => return Ok(VoidOutcome::NotFound),
                Found::Reservation(reservation, now) => (reservation, now),
            };
        match reservation.status {
            ReservationStatus::Committed => {
                let written = backend
                    .void(&reservation, req.refund, &req.actor, &req.idempotency)
                    .await;
                if let Some(reply) = moved_on_conflict(written)? {
                    return Ok(VoidOutcome::Voided(reply));
                }
            }
            ReservationStatus::Voided => {
                let current = reload(backend, &req.reservation_id, now).await?;
                return Ok(VoidOutcome::AlreadyVoided(current));
            }
            _ => {
                let current = reload(backend, &req.reservation_id, now).await?;
                return Ok(VoidOutcome::NotActive(current));
            }
        }
    }
    Err(contention("void the sale"))
}

async fn reload<B: Backend>(
    backend: &B,
    id: &ReservationId,
    now: Timestamp,
) -> StoreResult<Reservation> {
    backend
        .load_reservation(id, now)
        .await?
        .ok_or_else(|| StoreError::Corrupt(format!("reservation {id} vanished")))
}

/// One janitor pass: lapsed holds batch by batch, then stored answers past
/// retention, each batch its own short transaction.
pub(crate) async fn sweep<B: Backend>(backend: &B, batch: i64) -> StoreResult<SweepReport> {
    let batch = batch.max(1);
    let mut report = SweepReport::default();
    loop {
        let expired = backend.expire_batch(batch).await?;
        report.expired += expired;
        if expired < batch as u64 {
            break;
        }
    }
    loop {
        let purged = backend.purge_batch(batch).await?;
        report.purged_keys += purged;
        if purged < batch as u64 {
            break;
        }
    }
    loop {
        let purged = backend.purge_events_batch(batch).await?;
        report.purged_events += purged;
        if purged < batch as u64 {
            break;
        }
    }
    Ok(report)
}

/// The payment system reports a refund done: REQUESTED becomes COMPLETED once.
pub(crate) async fn complete_refund<B: Backend>(
    backend: &B,
    req: &CompleteRefundRequest,
) -> StoreResult<CompleteRefundOutcome> {
    for _ in 0..MAX_ATTEMPTS {
        let snap = backend
            .refund_snapshot(&req.refund_id, &req.idempotency)
            .await?;
        if let Some(stored) = snap.stored {
            return Ok(match replay_or_reused(stored, &req.idempotency) {
                Ok(reply) => CompleteRefundOutcome::Replayed(reply),
                Err(()) => CompleteRefundOutcome::KeyReused,
            });
        }
        let Some(refund) = snap.row else {
            return Ok(CompleteRefundOutcome::NotFound);
        };
        if refund.status == RefundStatus::Completed {
            return Ok(CompleteRefundOutcome::AlreadyCompleted(refund));
        }
        let written = backend.complete_refund(&refund, &req.idempotency).await;
        if let Some(reply) = moved_on_conflict(written)? {
            return Ok(CompleteRefundOutcome::Completed(reply));
        }
    }
    Err(contention("complete the refund"))
}
