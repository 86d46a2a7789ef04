//! Pure rules of the service: identifiers, statuses, validation and the
//! decisions that do not need the database. No I/O lives here.

mod catalogue;
mod ids;
mod model;
mod rules;
mod time;

pub use catalogue::{
    attributes_from, attributes_patch_schema, attributes_schema, check_metadata, is_attribute_key,
    is_currency, merged, metadata_schema, pays, AttributeValue, Attributes, Metadata, Price,
};
pub use ids::{
    printable_schema, AssetId, BuyerId, EventId, IdempotencyKey, PaymentReference, RefundId,
    ReservationId,
};
pub use model::{
    Asset, AssetStatus, AssetUnavailable, ClearedEntry, DataKind, Event, EventSummary, EventType,
    Payment, PaymentFate, PaymentOutcome, Refund, RefundReason, RefundStatus, Reservation,
    ReservationStatus, Via, WaitlistCleared, WaitlistEntry, WaitlistSkipped, WriteOutcome,
};
pub use rules::{
    commit_decision, extension_allowed, hold_decision, release_decision, withdraw_decision,
    CommitDecision, HoldBounds, HoldDecision, HoldTarget, ReleaseDecision, WithdrawDecision,
};
pub use time::{format_timestamp, parse_instant, Timestamp};

/// One field that failed validation, reported to the client as is.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct FieldError {
    /// The JSON member (or query parameter) at fault.
    pub field: String,
    /// What is wrong with it, in words a developer can act on.
    pub message: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}
