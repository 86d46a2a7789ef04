use super::model::{AssetStatus, PaymentFate, RefundReason, ReservationStatus};
use super::time::Timestamp;

/// The configured bounds of `hold_seconds`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HoldBounds {
    pub default: i64,
    pub min: i64,
    pub max: i64,
}

impl HoldBounds {
    /// The hold length a request asks for, or the default.
    pub fn hold_seconds(&self, requested: Option<i64>) -> Result<i64, String> {
        match requested {
            None => Ok(self.default),
            Some(s) if (self.min..=self.max).contains(&s) => Ok(s),
            Some(_) => Err(format!(
                "must be an integer from {} to {}",
                self.min, self.max
            )),
        }
    }
}

/// What a hold needs to know of the stored asset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HoldTarget {
    pub status: AssetStatus,
    pub hold_expires_at: Option<Timestamp>,
    pub available_from: Option<Timestamp>,
    /// When the asset last became free to hold (a release, a void, an
    /// expiry); `None` when it has been free since it was created.
    pub available_since: Option<Timestamp>,
}

/// What a hold request must do, judged from a consistent read of the asset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldDecision {
    NotFound,
    /// The asset's sale opens later: 409 and nothing is written.
    SaleNotOpen {
        available_from: Timestamp,
    },
    /// Taken: the answer is 409 and nothing is written.
    Unavailable {
        status: AssetStatus,
        hold_expires_at: Option<Timestamp>,
    },
    /// The asset is AVAILABLE: claim it.
    Claim,
    /// The asset's hold has lapsed: expire it and claim the asset in one transaction.
    Reclaim,
}

/// Decides a hold on the asset as it stood at `now`, the request's arrival
/// on the database's clock. A hold that lapsed later, an asset freed later
/// or a sale opened later do not count: a later attempt of the same request
/// may have been refused on them meanwhile. An asset freed later is
/// answered as HELD until the moment it became free, whatever kept it.
pub fn hold_decision(stored: Option<HoldTarget>, now: Timestamp) -> HoldDecision {
    let Some(target) = stored else {
        return HoldDecision::NotFound;
    };
    let free = match (target.status, target.hold_expires_at) {
        (AssetStatus::Available, _) => match target.available_since {
            // Freed after `now`: as it stood then, a hold had it until then.
            Some(since) if since > now => {
                return HoldDecision::Unavailable {
                    status: AssetStatus::Held,
                    hold_expires_at: Some(since),
                }
            }
            _ => HoldDecision::Claim,
        },
        (AssetStatus::Held, Some(expiry)) if expiry <= now => HoldDecision::Reclaim,
        (status, hold_expires_at) => {
            return HoldDecision::Unavailable {
                status,
                hold_expires_at,
            }
        }
    };
    match target.available_from {
        Some(available_from) if available_from > now => {
            HoldDecision::SaleNotOpen { available_from }
        }
        _ => free,
    }
}

/// What withdrawing an asset must do, by its effective status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WithdrawDecision {
    Withdraw,
    /// A live hold and `force`: release it, then withdraw.
    ReleaseAndWithdraw,
    /// Withdrawn before: 200, nothing changes.
    AlreadyWithdrawn,
    /// A live hold without `force`: 409 ASSET_HELD.
    Held,
    /// Sold: 409 ASSET_SOLD.
    Sold,
}

pub fn withdraw_decision(status: AssetStatus, force: bool) -> WithdrawDecision {
    match status {
        AssetStatus::Available => WithdrawDecision::Withdraw,
        AssetStatus::Held if force => WithdrawDecision::ReleaseAndWithdraw,
        AssetStatus::Held => WithdrawDecision::Held,
        AssetStatus::Sold => WithdrawDecision::Sold,
        AssetStatus::Withdrawn => WithdrawDecision::AlreadyWithdrawn,
    }
}

/// Whether a hold created at `created_at` may run until `until`, when no
/// hold may last longer than `max_total_seconds` from its creation.
pub fn extension_allowed(created_at: Timestamp, until: Timestamp, max_total_seconds: i64) -> bool {
    (until - created_at).num_milliseconds() <= max_total_seconds.saturating_mul(1000)
}

/// What a commit must do (CONTRACT.md's commit rules): first by the
/// payment's fate, then by the reservation's effective status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitDecision {
    /// A live hold and a payment without a fate: try to sell the asset.
    Commit,
    /// This payment bought this reservation: answer 200 with it.
    AlreadyCommittedWithThisPayment,
    /// This payment bought this reservation and the sale was voided since:
    /// 409, and no new refund (the void settled the payment).
    SaleVoided,
    /// This payment was refunded through this reservation: 409 with that
    /// same refund, nothing new.
    RefundedBefore,
    /// This payment has its fate through another reservation: 409
    /// PAYMENT_REFERENCE_USED, no refund, nothing changes.
    UsedElsewhere,
    /// A payment without a fate that cannot be honoured: refund it, 409.
    Refuse(RefundReason),
}

pub fn commit_decision(
    reservation_id: &str,
    status: ReservationStatus,
    fate: Option<&PaymentFate>,
) -> CommitDecision {
    match fate {
        Some(fate) if fate.reservation_id != reservation_id => CommitDecision::UsedElsewhere,
        Some(PaymentFate {
            refund_id: Some(_), ..
        }) => CommitDecision::RefundedBefore,
        Some(_) => match status {
            ReservationStatus::Voided => CommitDecision::SaleVoided,
            // Bought: COMMITTED (nothing else can carry a bought fate).
            _ => CommitDecision::AlreadyCommittedWithThisPayment,
        },
        None => match status {
            ReservationStatus::Held => CommitDecision::Commit,
            ReservationStatus::Expired => CommitDecision::Refuse(RefundReason::HoldExpired),
            ReservationStatus::Released => {
                CommitDecision::Refuse(RefundReason::ReservationReleased)
            }
            ReservationStatus::Committed => CommitDecision::Refuse(RefundReason::AlreadyCommitted),
            ReservationStatus::Voided => CommitDecision::Refuse(RefundReason::SaleVoided),
        },
    }
}

/// What a release must do, by the reservation's effective status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseDecision {
    Release,
    /// Released before: 200, nothing changes.
    AlreadyReleased,
    /// Committed or expired: 409 RESERVATION_NOT_ACTIVE.
    NotActive,
}

pub fn release_decision(status: ReservationStatus) -> ReleaseDecision {
    match status {
        ReservationStatus::Held => ReleaseDecision::Release,
        ReservationStatus::Released => ReleaseDecision::AlreadyReleased,
        ReservationStatus::Committed | ReservationStatus::Expired | ReservationStatus::Voided => {
            ReleaseDecision::NotActive
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{Duration, TimeZone, Utc};

    fn now() -> Timestamp {
        Utc.with_ymd_and_hms(2026, 11, 29, 12, 0, 0).unwrap()
    }

    fn target(status: AssetStatus, hold_expires_at: Option<Timestamp>) -> HoldTarget {
        HoldTarget {
            status,
            hold_expires_at,
            available_from: None,
            available_since: None,
        }
    }

    #[test]
    fn an_asset_freed_after_the_arrival_was_held_then() {
        let freed = now() + Duration::milliseconds(80);
        let target = HoldTarget {
            available_since: Some(freed),
            ..target(AssetStatus::Available, None)
        };
        assert_eq!(
            hold_decision(Some(target), now()),
            HoldDecision::Unavailable {
                status: AssetStatus::Held,
                hold_expires_at: Some(freed)
            }
        );
        assert_eq!(hold_decision(Some(target), freed), HoldDecision::Claim);
    }

    #[test]
    fn sale_opening_gates_only_free_assets() {
        let opens = now() + Duration::seconds(60);
        let gated = |status, expiry| HoldTarget {
            status,
            hold_expires_at: expiry,
            available_from: Some(opens),
            available_since: None,
        };
        assert_eq!(
            hold_decision(Some(gated(AssetStatus::Available, None)), now()),
            HoldDecision::SaleNotOpen {
                available_from: opens
            }
        );
        assert_eq!(
            hold_decision(Some(gated(AssetStatus::Available, None)), opens),
            HoldDecision::Claim
        );
        assert!(matches!(
            hold_decision(Some(gated(AssetStatus::Withdrawn, None)), now()),
            HoldDecision::Unavailable { .. }
        ));
    }

    #[test]
    fn withdraw_and_extension_rules() {
        assert_eq!(
            withdraw_decision(AssetStatus::Held, false),
            WithdrawDecision::Held
        );
        assert_eq!(
            withdraw_decision(AssetStatus::Held, true),
            WithdrawDecision::ReleaseAndWithdraw
        );
        assert_eq!(
            withdraw_decision(AssetStatus::Sold, true),
            WithdrawDecision::Sold
        );
        assert!(extension_allowed(
            now(),
            now() + Duration::seconds(7200),
            7200
        ));
        assert!(!extension_allowed(
            now(),
            now() + Duration::seconds(7201),
            7200
        ));
    }

    #[test]
    fn hold_seconds_default_and_bounds() {
        let b = HoldBounds {
            default: 600,
            min: 30,
            max: 3600,
        };
        assert_eq!(b.hold_seconds(None), Ok(600));
        assert_eq!(b.hold_seconds(Some(30)), Ok(30));
        assert_eq!(b.hold_seconds(Some(3600)), Ok(3600));
        assert!(b.hold_seconds(Some(29)).is_err());
        assert!(b.hold_seconds(Some(3601)).is_err());
    }

    #[test]
    fn hold_decisions_follow_effective_status() {
        let later = now() + Duration::seconds(5);
        let earlier = now() - Duration::seconds(5);
        assert_eq!(hold_decision(None, now()), HoldDecision::NotFound);
        assert_eq!(
            hold_decision(Some(target(AssetStatus::Available, None)), now()),
            HoldDecision::Claim
        );
        assert_eq!(
            hold_decision(Some(target(AssetStatus::Held, Some(earlier))), now()),
            HoldDecision::Reclaim
        );
        assert_eq!(
            hold_decision(Some(target(AssetStatus::Held, Some(now()))), now()),
            HoldDecision::Reclaim
        );
        assert_eq!(
            hold_decision(Some(target(AssetStatus::Held, Some(later))), now()),
            HoldDecision::Unavailable {
                status: AssetStatus::Held,
                hold_expires_at: Some(later)
            }
        );
        assert_eq!(
            hold_decision(Some(target(AssetStatus::Sold, None)), now()),
            HoldDecision::Unavailable {
                status: AssetStatus::Sold,
                hold_expires_at: None
            }
        );
    }

    #[test]
    fn commit_table() {
        use CommitDecision::*;
        use ReservationStatus::*;
        let bought = |id: &str| PaymentFate {
            reservation_id: id.into(),
            refund_id: None,
        };
        let refunded = |id: &str| PaymentFate {
            reservation_id: id.into(),
            refund_id: Some("rf_1".into()),
        };
        // A payment without a fate, by status.
        for (status, decision) in [
            (Held, Commit),
            (Expired, Refuse(RefundReason::HoldExpired)),
            (Released, Refuse(RefundReason::ReservationReleased)),
            (Committed, Refuse(RefundReason::AlreadyCommitted)),
            (Voided, Refuse(RefundReason::SaleVoided)),
        ] {
            assert_eq!(commit_decision("a", status, None), decision, "{status:?}");
        }
        // Its own fate through this reservation.
        assert_eq!(
            commit_decision("a", Committed, Some(&bought("a"))),
            AlreadyCommittedWithThisPayment
        );
        assert_eq!(commit_decision("a", Voided, Some(&bought("a"))), SaleVoided);
        for status in ReservationStatus::ALL {
            // A refunded payment, and a fate through another reservation,
            // whatever this one's state.
            for (fate, decision) in [
                (refunded("a"), RefundedBefore),
                (bought("b"), UsedElsewhere),
                (refunded("b"), UsedElsewhere),
            ] {
                assert_eq!(
                    commit_decision("a", *status, Some(&fate)),
                    decision,
                    "{status:?}"
                );
            }
        }
    }

    #[test]
    fn release_table() {
        use ReleaseDecision::*;
        use ReservationStatus::*;
        for (status, decision) in [
            (Held, Release),
            (Released, AlreadyReleased),
            (Committed, NotActive),
            (Expired, NotActive),
        ] {
            assert_eq!(release_decision(status), decision, "{status:?}");
        }
    }
}
