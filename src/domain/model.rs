use serde::Serialize;
use utoipa::ToSchema;

use super::time::{serde_ts, Timestamp};

macro_rules! text_enum {
    ($(#[$meta:meta])* $name:ident { $($variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, ToSchema)]
        #[serde(rename_all = "SCREAMING_SNAKE_CASE")]
        pub enum $name {
            $($variant),+
        }

        text_enum!(@methods $name { $($variant => $text),+ });
    };
    (@methods $name:ident { $($variant:ident => $text:literal),+ $(,)? }) => {
        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }

            pub fn parse(s: &str) -> Option<Self> {
                match s {
                    $($text => Some($name::$variant),)+
                    _ => None,
                }
            }

            /// Parses `s`, or says which values there are.
            pub fn parse_or_list(s: &str) -> Result<Self, String> {
                Self::parse(s)
                    .ok_or_else(|| format!("must be one of {}", [$($text),+].join(", ")))
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

text_enum!(
    /// The effective status of an asset.
    AssetStatus {
        Available => "AVAILABLE",
        Held => "HELD",
        Sold => "SOLD",
        Withdrawn => "WITHDRAWN",
    }
);
text_enum!(
    /// The effective status of a reservation: HELD ends COMMITTED, RELEASED
    /// or EXPIRED; a COMMITTED sale may later be VOIDED.
    ReservationStatus {
        Held => "HELD",
        Committed => "COMMITTED",
        Released => "RELEASED",
        Expired => "EXPIRED",
        Voided => "VOIDED",
    }
);
text_enum!(
    /// Why a payment is to be given back.
    RefundReason {
        HoldExpired => "HOLD_EXPIRED",
        ReservationReleased => "RESERVATION_RELEASED",
        AlreadyCommitted => "ALREADY_COMMITTED",
        SaleVoided => "SALE_VOIDED",
    }
);
text_enum!(
    /// REQUESTED until the payment system reports the refund done.
    RefundStatus { Requested => "REQUESTED", Completed => "COMPLETED" }
);
/// What an event reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, ToSchema)]
pub enum EventType {
    #[serde(rename = "reservation.held")]
    ReservationHeld,
    #[serde(rename = "reservation.committed")]
    ReservationCommitted,
    #[serde(rename = "reservation.released")]
    ReservationReleased,
    #[serde(rename = "reservation.expired")]
    ReservationExpired,
    #[serde(rename = "refund.requested")]
    RefundRequested,
    #[serde(rename = "refund.completed")]
    RefundCompleted,
    #[serde(rename = "reservation.extended")]
    ReservationExtended,
    #[serde(rename = "reservation.voided")]
    ReservationVoided,
    #[serde(rename = "asset.withdrawn")]
    AssetWithdrawn,
    #[serde(rename = "asset.reinstated")]
    AssetReinstated,
}

text_enum!(@methods EventType {
    ReservationHeld => "reservation.held",
    ReservationCommitted => "reservation.committed",
    ReservationReleased => "reservation.released",
    ReservationExpired => "reservation.expired",
    RefundRequested => "refund.requested",
    RefundCompleted => "refund.completed",
    ReservationExtended => "reservation.extended",
    ReservationVoided => "reservation.voided",
    AssetWithdrawn => "asset.withdrawn",
    AssetReinstated => "asset.reinstated",
});

/// A one-of-a-kind asset as clients see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct Asset {
    /// Chosen by the operator.
    #[schema(pattern = "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$", example = "EQ-88392")]
    pub id: String,
    #[schema(
        min_length = 1,
        max_length = 255,
        pattern = "^[^\\x00-\\x1F\\x7F-\\x9F]*[^\\x00-\\x20\\x7F-\\x9F][^\\x00-\\x1F\\x7F-\\x9F]*$",
        example = "Caterpillar 320 excavator"
    )]
    pub name: String,
    /// The effective status: a lapsed hold reads AVAILABLE.
    pub status: AssetStatus,
    /// Set while HELD.
    #[serde(serialize_with = "serde_ts::option::serialize")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub hold_expires_at: Option<Timestamp>,
    /// Set while HELD or SOLD.
    pub current_reservation_id: Option<String>,
    /// Holds before this instant answer 409 SALE_NOT_OPEN; null when on sale.
    #[serde(serialize_with = "serde_ts::option::serialize")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub available_from: Option<Timestamp>,
    /// Grows by one on every state change of the asset.
    #[schema(minimum = 1)]
    pub version: i64,
    #[serde(serialize_with = "serde_ts::serialize")]
    #[schema(value_type = String, format = DateTime)]
    pub created_at: Timestamp,
    #[serde(serialize_with = "serde_ts::serialize")]
    #[schema(value_type = String, format = DateTime)]
    pub updated_at: Timestamp,
}

impl Asset {
    /// Applies the expiry rule to a stored row read at `now`.
    pub fn effective(mut self, now: Timestamp) -> Self {
        if self.status == AssetStatus::Held && self.hold_expires_at.is_none_or(|e| e <= now) {
            self.status = AssetStatus::Available;
            self.hold_expires_at = None;
            self.current_reservation_id = None;
        }
        self
    }
}

/// A buyer's hold on an asset and what became of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct Reservation {
    #[schema(
        pattern = "^res_[0-9A-HJKMNP-TV-Z]{26}$",
        example = "res_01HZX49R8T39QK6G7Y1W2V3N4P"
    )]
    pub reservation_id: String,
    pub asset_id: String,
    pub buyer_id: String,
    /// The effective status: a lapsed hold reads EXPIRED.
    pub status: ReservationStatus,
    #[serde(serialize_with = "serde_ts::serialize")]
    #[schema(value_type = String, format = DateTime)]
    pub expires_at: Timestamp,
    #[serde(serialize_with = "serde_ts::serialize")]
    #[schema(value_type = String, format = DateTime)]
    pub created_at: Timestamp,
    #[serde(serialize_with = "serde_ts::option::serialize")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub committed_at: Option<Timestamp>,
    #[serde(serialize_with = "serde_ts::option::serialize")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub released_at: Option<Timestamp>,
    pub payment_reference: Option<String>,
    /// When a COMMITTED sale was voided; its payment reference stays used.
    #[serde(serialize_with = "serde_ts::option::serialize")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub voided_at: Option<Timestamp>,
    /// Every refund triggered for this reservation, oldest first.
    pub refunds: Vec<Refund>,
    /// The client (API key name) that created it; not shown.
    #[serde(skip)]
    pub owner: String,
}

impl Reservation {
    /// Applies the expiry rule to a stored row read at `now`.
    pub fn effective(mut self, now: Timestamp) -> Self {
        if self.status == ReservationStatus::Held && self.expires_at <= now {
            self.status = ReservationStatus::Expired;
        }
        self
    }
}

/// A payment that holdfast could not honour and asks the payment system to give back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct Refund {
    #[schema(
        pattern = "^rf_[0-9A-HJKMNP-TV-Z]{26}$",
        example = "rf_01HZX4B2Q7C3M9D8E6F5G4H3J2"
    )]
    pub refund_id: String,
    pub reservation_id: String,
    pub asset_id: String,
    pub payment_reference: String,
    pub reason: RefundReason,
    pub status: RefundStatus,
    #[serde(serialize_with = "serde_ts::serialize")]
    #[schema(value_type = String, format = DateTime)]
    pub created_at: Timestamp,
    /// When the payment system reported the refund done.
    #[serde(serialize_with = "serde_ts::option::serialize")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub completed_at: Option<Timestamp>,
}

impl Refund {
    /// A new refund request for `payment` on `reservation`.
    pub fn requested(
        reservation: &Reservation,
        payment: &str,
        reason: RefundReason,
        now: Timestamp,
    ) -> Self {
        Refund {
            refund_id: super::RefundId::generate().to_string(),
            reservation_id: reservation.reservation_id.clone(),
            asset_id: reservation.asset_id.clone(),
            payment_reference: payment.to_owned(),
            reason,
            status: RefundStatus::Requested,
            created_at: now,
            completed_at: None,
        }
    }
}

/// One entry of an asset's timeline, written in the same transaction as the change.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Event {
    #[schema(example = "evt_01HZX4C6W0R1T2Y3U4I5O6P7A8")]
    pub id: String,
    #[serde(rename = "type")]
    pub event_type: EventType,
    pub asset_id: String,
    /// 1, 2, 3 … in commit order for this asset.
    #[schema(minimum = 1)]
    pub sequence: i64,
    #[serde(serialize_with = "serde_ts::serialize")]
    #[schema(value_type = String, format = DateTime)]
    pub created_at: Timestamp,
    /// The reservation or refund as the API showed it at that moment.
    #[schema(value_type = Object)]
    pub data: Box<serde_json::value::RawValue>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serialized(v: impl Serialize) -> String {
        serde_json::to_value(v)
            .unwrap()
            .as_str()
            .unwrap()
            .to_owned()
    }

    #[test]
    fn every_enum_serialises_as_its_text() {
        for v in AssetStatus::ALL {
            assert_eq!(serialized(v), v.as_str());
        }
        for v in ReservationStatus::ALL {
            assert_eq!(serialized(v), v.as_str());
        }
        for v in RefundReason::ALL {
            assert_eq!(serialized(v), v.as_str());
        }
        for v in RefundStatus::ALL {
            assert_eq!(serialized(v), v.as_str());
        }
        for v in EventType::ALL {
            assert_eq!(serialized(v), v.as_str());
            assert_eq!(EventType::parse(v.as_str()), Some(*v));
        }
    }
}
