use serde::Serialize;
use utoipa::openapi::schema::ObjectBuilder;
use utoipa::ToSchema;

use super::catalogue::{attributes_schema, metadata_schema, Attributes, Metadata, Price};
use super::ids::{text_schema, AssetId, RefundId, ReservationId};
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
        AmountMismatch => "AMOUNT_MISMATCH",
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
    #[serde(rename = "asset.updated")]
    AssetUpdated,
    #[serde(rename = "waitlist.skipped")]
    WaitlistSkipped,
    #[serde(rename = "waitlist.cleared")]
    WaitlistCleared,
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
    AssetUpdated => "asset.updated",
    WaitlistSkipped => "waitlist.skipped",
    WaitlistCleared => "waitlist.cleared",
});

impl Event {
    /// A cleared queue as a storefront sees it: its own entries, without
    /// the client's name (nothing at all if the data cannot be read).
    fn cleared_for(mut self, viewer: &str) -> Self {
        let seen = serde_json::from_str::<WaitlistCleared>(self.data.get())
            .ok()
            .map(|mut cleared| {
                cleared
                    .entries
                    .retain(|e| e.client.as_deref() == Some(viewer));
                for entry in &mut cleared.entries {
                    entry.client = None;
                }
                cleared
            });
        self.data = serde_json::value::to_raw_value(&seen).unwrap_or_default();
        self
    }
}

/// How a hold was made when not by the buyer's own request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Via {
    /// An admin's offer to a named buyer.
    Offer,
    /// Handed to the first waiter when the hold before it ended.
    Waitlist,
}

impl Via {
    pub fn as_str(self) -> &'static str {
        match self {
            Via::Offer => "offer",
            Via::Waitlist => "waitlist",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "offer" => Some(Via::Offer),
            "waitlist" => Some(Via::Waitlist),
            _ => None,
        }
    }
}

/// `waitlist.skipped`: a waiter passed over when the asset came to it.
#[derive(Debug, Clone, Serialize, serde::Deserialize, ToSchema)]
pub struct WaitlistSkipped {
    pub asset_id: String,
    pub buyer_id: String,
    /// Why it was passed over (it already had its most live holds).
    pub reason: String,
}

/// `waitlist.cleared`: the queue emptied by a sale or a withdrawal.
#[derive(Debug, Clone, Serialize, serde::Deserialize, ToSchema)]
pub struct WaitlistCleared {
    pub asset_id: String,
    /// `sold` or `withdrawn`.
    pub reason: String,
    /// Every waiter it had, in queue order (a storefront sees its own).
    pub entries: Vec<ClearedEntry>,
}

/// One waiter of a cleared queue.
#[derive(Debug, Clone, Serialize, serde::Deserialize, ToSchema)]
pub struct ClearedEntry {
    pub buyer_id: String,
    pub position: i64,
    /// The client it waited for; shown to admins and payments clients.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
}

/// A buyer waiting for an asset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct WaitlistEntry {
    pub asset_id: String,
    pub buyer_id: String,
    /// 1 for the next buyer to get the asset; only ever decreases.
    #[schema(minimum = 1)]
    pub position: i64,
    #[serde(serialize_with = "serde_ts::serialize")]
    #[schema(value_type = String, format = DateTime)]
    pub joined_at: Timestamp,
    /// The client (API key name) it waits for; not shown.
    #[serde(skip)]
    pub client: String,
}

/// Why an asset cannot be held or offered now: what a 409
/// ASSET_UNAVAILABLE tells the buyer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AssetUnavailable {
    pub status: AssetStatus,
    pub hold_expires_at: Option<Timestamp>,
    /// How many buyers wait for it.
    pub waitlist_length: i64,
}

/// A one-of-a-kind asset as clients see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct Asset {
    #[schema(schema_with = chosen_asset_id)]
    pub id: String,
    #[schema(schema_with = Asset::name_schema)]
    pub name: String,
    /// What it sells for; null when it has no price.
    pub price: Option<Price>,
    #[schema(schema_with = attributes_schema)]
    pub attributes: Attributes,
    /// The effective status: a lapsed hold reads AVAILABLE.
    pub status: AssetStatus,
    /// Set while HELD.
    #[serde(serialize_with = "serde_ts::option::serialize")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub hold_expires_at: Option<Timestamp>,
    /// Set while HELD or SOLD. A storefront sees only its own reservation
    /// here: another client's is null.
    pub current_reservation_id: Option<String>,
    /// Holds before this instant answer 409 SALE_NOT_OPEN; null when on sale.
    #[serde(serialize_with = "serde_ts::option::serialize")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub available_from: Option<Timestamp>,
    /// Grows by one on every state change of the asset.
    #[schema(minimum = 1)]
    pub version: i64,
    /// How many buyers wait for it (`GET /v1/assets/{asset_id}/waitlist`).
    #[schema(minimum = 0)]
    pub waitlist_length: i64,
    #[serde(serialize_with = "serde_ts::serialize")]
    #[schema(value_type = String, format = DateTime)]
    pub created_at: Timestamp,
    #[serde(serialize_with = "serde_ts::serialize")]
    #[schema(value_type = String, format = DateTime)]
    pub updated_at: Timestamp,
    /// The client whose reservation holds or bought it, where read; not shown.
    #[serde(skip)]
    pub holder: Option<String>,
}

/// An asset's id: chosen by the operator.
fn chosen_asset_id() -> ObjectBuilder {
    AssetId::schema().description(Some("Chosen by the operator."))
}

impl Asset {
    /// The longest name, in characters.
    pub const NAME_MAX: usize = 255;

    /// A name: 1 to [`Asset::NAME_MAX`] characters, no control characters,
    /// not only spaces.
    pub fn name_schema() -> ObjectBuilder {
        text_schema(
            "^[^\\x00-\\x1F\\x7F-\\x9F]*[^\\x00-\\x20\\x7F-\\x9F][^\\x00-\\x1F\\x7F-\\x9F]*$",
            "Caterpillar 320 excavator",
        )
        .min_length(Some(1))
        .max_length(Some(Self::NAME_MAX))
    }

    /// The asset as `viewer` may see it: a storefront sees the current
    /// reservation only when it is its own. Availability is public.
    pub fn seen_by(mut self, viewer: Option<&str>) -> Self {
        if viewer.is_some_and(|v| self.holder.as_deref() != Some(v)) {
            self.current_reservation_id = None;
        }
        self
    }

    /// Applies the expiry rule to a stored row read at `now`. A lapsed hold
    /// makes the asset AVAILABLE, unless buyers wait for it: then it is the
    /// first waiter's as soon as the lapse is found (by the janitor or by the
    /// next write), and until then it reads HELD with neither reservation nor
    /// expiry.
    pub fn effective(mut self, now: Timestamp) -> Self {
        if self.status == AssetStatus::Held && self.hold_expires_at.is_none_or(|e| e <= now) {
            if self.waitlist_length == 0 {
                self.status = AssetStatus::Available;
            }
            self.hold_expires_at = None;
            self.current_reservation_id = None;
        }
        self
    }
}

/// A buyer's hold on an asset and what became of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct Reservation {
    #[schema(schema_with = reservation_id)]
    pub reservation_id: String,
    pub asset_id: String,
    pub buyer_id: String,
    /// The effective status: a lapsed hold reads EXPIRED.
    pub status: ReservationStatus,
    /// When the hold lapses, by the database's clock, which decides every
    /// expiry. A countdown on a device whose clock is off is off by as much:
    /// the answer's `Date` header gives the service's clock to correct it.
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
    /// The asset's price when the hold was made: the amount the buyer was
    /// shown, whatever the asset's price became since. Null when it had none.
    pub price: Option<Price>,
    /// Given with the hold. Null for a client that does not own the
    /// reservation (another storefront) and when none was given.
    #[schema(schema_with = nullable_metadata)]
    pub metadata: Option<Metadata>,
    /// How it was made, when not by the buyer's own hold: `offer` (an
    /// admin's offer to this buyer) or `waitlist` (handed to the first
    /// waiter when the hold before it ended).
    pub via: Option<Via>,
    /// The client (API key name) that created it and owns it; not shown.
    #[serde(skip)]
    pub client: String,
    /// The payments client that committed it with `payment_reference`
    /// (references are its own; `""` for sales recorded before payments had
    /// clients); not shown.
    #[serde(skip)]
    pub payment_client: Option<String>,
}

fn nullable_metadata() -> ObjectBuilder {
    metadata_schema().schema_type(utoipa::openapi::schema::SchemaType::from_iter([
        utoipa::openapi::Type::Object,
        utoipa::openapi::Type::Null,
    ]))
}

fn reservation_id() -> ObjectBuilder {
    text_schema(ReservationId::PATTERN, "res_01HZX49R8T39QK6G7Y1W2V3N4P")
}

impl Reservation {
    /// A new hold of `asset` for `buyer`, made by `client` at `now`, under
    /// a new id made at `now` (so that a buyer's live holds are found among
    /// the ids of the last hours: [`ReservationId::floor`]).
    pub fn held(
        asset: &impl std::fmt::Display,
        buyer: &impl std::fmt::Display,
        client: &str,
        now: Timestamp,
        expires_at: Timestamp,
    ) -> Self {
        Self {
            reservation_id: ReservationId::at(now).to_string(),
            asset_id: asset.to_string(),
            buyer_id: buyer.to_string(),
            status: ReservationStatus::Held,
            expires_at,
            created_at: now,
            committed_at: None,
            released_at: None,
            payment_reference: None,
            voided_at: None,
            refunds: Vec::new(),
            price: None,
            metadata: None,
            via: None,
            client: client.to_owned(),
            payment_client: None,
        }
    }

    /// This live hold, sold at `now` for the payment `reference` of `client`.
    pub fn sold(mut self, now: Timestamp, client: &str, reference: &str) -> Self {
        self.status = ReservationStatus::Committed;
        self.committed_at = Some(now);
        self.payment_reference = Some(reference.to_owned());
        self.payment_client = Some(client.to_owned());
        self
    }

    /// This live hold, released at `now`.
    pub fn released(mut self, now: Timestamp) -> Self {
        self.status = ReservationStatus::Released;
        self.released_at = Some(now);
        self
    }

    /// Applies the expiry rule to a stored row read at `now`.
    pub fn effective(mut self, now: Timestamp) -> Self {
        if self.status == ReservationStatus::Held && self.expires_at <= now {
            self.status = ReservationStatus::Expired;
        }
        self
    }
}

fn refund_id() -> ObjectBuilder {
    text_schema(RefundId::PATTERN, "rf_01HZX4B2Q7C3M9D8E6F5G4H3J2")
}

/// A payment that holdfast could not honour and asks the payment system to give back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct Refund {
    #[schema(schema_with = refund_id)]
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
    /// The payments client of `payment_reference` (see
    /// [`Reservation::payment_client`]); not shown.
    #[serde(skip)]
    pub payment_client: String,
}

impl Refund {
    /// A new refund request for `payment` (of payments `client`) on `reservation`.
    pub fn requested(
        reservation: &Reservation,
        client: &str,
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
            payment_client: client.to_owned(),
        }
    }
}

text_enum!(
    /// What became of a payment: it bought a reservation, or it is refunded.
    PaymentOutcome { Bought => "BOUGHT", Refunded => "REFUNDED" }
);

/// A payment reference's one fate, as the database records it: the
/// reservation it bought, or the refund that gives it back (and the
/// reservation it was sent to).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaymentFate {
    pub reservation_id: String,
    /// `Some` when the payment is refunded; `None` when it bought the reservation.
    pub refund_id: Option<String>,
}

impl PaymentFate {
    pub fn outcome(&self) -> PaymentOutcome {
        match self.refund_id {
            Some(_) => PaymentOutcome::Refunded,
            None => PaymentOutcome::Bought,
        }
    }
}

/// A payment reference and its one fate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct Payment {
    #[schema(example = "pay_7Hq2x9")]
    pub payment_reference: String,
    /// BOUGHT: it paid for `reservation` (a later void of that sale settles
    /// it with the void's own refund, or outside holdfast); REFUNDED: it is
    /// given back by `refund`, whichever reservation it was sent to.
    pub fate: PaymentOutcome,
    /// The reservation it bought, or the one it was sent to and refunded through.
    pub reservation: Reservation,
    /// REFUNDED: its refund. BOUGHT: the refund of a voided sale, if any.
    #[schema(nullable = true)]
    pub refund: Option<Refund>,
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
    /// The reservation, refund or asset as the API showed it at that moment.
    /// A storefront sees an event about another client's reservation as an
    /// [`EventSummary`] instead: what happened to the asset, nothing more.
    pub data_kind: DataKind,
    #[schema(schema_with = event_data)]
    pub data: Box<serde_json::value::RawValue>,
    /// The API key that voided a sale, or withdrew or reinstated the asset
    /// (forcing a hold's release included); null for everything else.
    pub actor: Option<String>,
    /// `reservation.held` of a hold made by an offer (`offer`) or handed to
    /// the first waiter (`waitlist`); null for everything else.
    pub via: Option<Via>,
    /// The client whose reservation this event reports (`None` for events
    /// about the asset alone); not shown.
    #[serde(skip)]
    pub client: Option<String>,
}

/// The schema of an event's `data`: one per [`DataKind`], which the
/// document's `Event` union replaces (see `http::docs`).
fn event_data() -> utoipa::openapi::Ref {
    utoipa::openapi::schema::RefBuilder::new()
        .ref_location_from_schema_name("Reservation")
        .description(Some(
            "The reservation, refund or asset as the API showed it at that moment\n\
             (`data_kind` says which).",
        ))
        .build()
}

/// What an event's `data` is; the discriminator of the document's `Event`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DataKind {
    /// A `Reservation`: the `reservation.*` events.
    Reservation,
    /// A `Refund`: `refund.requested`, `refund.completed`.
    Refund,
    /// An `Asset`: the `asset.*` events.
    Asset,
    /// An `EventSummary`: another client's reservation or refund, as a
    /// storefront sees it.
    Summary,
    /// A `WaitlistSkipped`.
    WaitlistSkipped,
    /// A `WaitlistCleared`.
    WaitlistCleared,
}

impl DataKind {
    /// Every kind with the schema of its `data`.
    pub const SCHEMAS: [(DataKind, &'static str); 6] = [
        (DataKind::Reservation, "Reservation"),
        (DataKind::Refund, "Refund"),
        (DataKind::Asset, "Asset"),
        (DataKind::Summary, "EventSummary"),
        (DataKind::WaitlistSkipped, "WaitlistSkipped"),
        (DataKind::WaitlistCleared, "WaitlistCleared"),
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DataKind::Reservation => "reservation",
            DataKind::Refund => "refund",
            DataKind::Asset => "asset",
            DataKind::Summary => "summary",
            DataKind::WaitlistSkipped => "waitlist_skipped",
            DataKind::WaitlistCleared => "waitlist_cleared",
        }
    }
}

impl EventType {
    /// What this event's `data` is, unredacted.
    pub fn data_kind(self) -> DataKind {
        use EventType::*;
        match self {
            ReservationHeld | ReservationCommitted | ReservationReleased | ReservationExpired
            | ReservationExtended | ReservationVoided => DataKind::Reservation,
            RefundRequested | RefundCompleted => DataKind::Refund,
            AssetWithdrawn | AssetReinstated | AssetUpdated => DataKind::Asset,
            WaitlistSkipped => DataKind::WaitlistSkipped,
            WaitlistCleared => DataKind::WaitlistCleared,
        }
    }
}

/// An event about another client's reservation, as a storefront sees it:
/// the asset and, for a hold, until when it is held. No reservation, buyer,
/// payment or refund.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct EventSummary {
    /// Always true: the data of this event is not shown to this client.
    #[schema(value_type = bool, example = true)]
    pub redacted: bool,
    pub asset_id: String,
    /// reservation.held and reservation.extended: when the hold lapses.
    #[serde(serialize_with = "serde_ts::option::serialize")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub hold_expires_at: Option<Timestamp>,
}

impl Event {
    /// The event as `viewer` may see it: a storefront sees another client's
    /// reservation events as a summary.
    pub fn seen_by(mut self, viewer: Option<&str>) -> Self {
        let Some(viewer) = viewer else { return self };
        if self.event_type == EventType::WaitlistCleared {
            return self.cleared_for(viewer);
        }
        let Some(client) = &self.client else {
            return self;
        };
        if client == viewer {
            return self;
        }
        let hold_expires_at = match self.event_type {
            EventType::ReservationHeld | EventType::ReservationExtended => {
                #[derive(serde::Deserialize)]
                struct Expiry {
                    expires_at: Option<String>,
                }
                serde_json::from_str::<Expiry>(self.data.get())
                    .ok()
                    .and_then(|e| e.expires_at)
                    .and_then(|t| chrono::DateTime::parse_from_rfc3339(&t).ok())
                    .map(|t| t.with_timezone(&chrono::Utc))
            }
            _ => None,
        };
        let summary = EventSummary {
            redacted: true,
            asset_id: self.asset_id.clone(),
            hold_expires_at,
        };
        // Never the original data, even if the summary could not be written.
        self.data = serde_json::value::to_raw_value(&summary).unwrap_or_default();
        self.data_kind = DataKind::Summary;
        self.actor = None;
        self
    }
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

/// Whether a request that answered 503 may have changed something.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum WriteOutcome {
    /// Nothing was written: the request may be sent again as it is.
    NotApplied,
    /// A COMMIT may have been sent: the change may have committed. A retry
    /// with the same Idempotency-Key answers the stored answer if it did; an
    /// operation without a key is read back instead.
    Unknown,
}
