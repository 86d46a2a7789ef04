//! The bytes a request answers with. Built once, sent as is, and stored as is
//! when the request changed something, so that a replay is byte-identical.

use serde::Serialize;
use serde_json::{Map, Value};

use crate::domain::{
    format_timestamp, Asset, AssetStatus, AssetUnavailable, FieldError, Payment, PaymentOutcome,
    Refund, RefundReason, Reservation, Timestamp, WriteOutcome,
};
use crate::store::{Answer, Render, Rendered};

/// An HTTP answer reduced to what idempotency stores: status, body, Location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    pub body: String,
    pub location: Option<String>,
    pub problem: bool,
    /// Set when this answer is a replay of a stored one.
    pub replayed: bool,
}

impl Reply {
    pub fn json(status: u16, value: &impl Serialize) -> Self {
        Self {
            status,
            body: to_json(value),
            location: None,
            problem: false,
            replayed: false,
        }
    }

    /// A stored answer sent again: a stored 201 replays as 200.
    pub fn replay(status: u16, body: String, location: Option<String>) -> Self {
        Self {
            status: if status == 201 { 200 } else { status },
            problem: status >= 400,
            body,
            location,
            replayed: true,
        }
    }
}

impl From<Rendered> for Reply {
    /// A stored answer sent again: a stored 201 replays as 200.
    fn from(stored: Rendered) -> Self {
        Reply::replay(stored.status, stored.body, stored.location)
    }
}

/// The answer the store keeps for a change, exactly as the client is
/// answered: the store renders what it keeps with this, and the handlers
/// answer the same outcome with [`answer`], so a replay is byte-identical.
#[derive(Debug, Clone, Copy, Default)]
pub struct Rendering;

impl Render for Rendering {
    fn render(&self, kept: Answer<'_>) -> Rendered {
        let reply = answer(kept);
        Rendered {
            status: reply.status,
            body: reply.body,
            location: reply.location,
        }
    }
}

/// The reply to an answer that a change keeps under its key.
pub fn answer(kept: Answer<'_>) -> Reply {
    match kept {
        Answer::Held(reservation) => hold_created(reservation),
        Answer::Changed(reservation) => reservation_ok(reservation),
        Answer::Refused {
            reason,
            reservation,
            refund,
        } => commit_refused(reason, reservation, refund).into_reply(),
        Answer::RefundCompleted(refund) => Reply::json(200, refund),
        Answer::Waiting { entry, joined } => Reply::json(if joined { 201 } else { 200 }, entry),
        Answer::Batch { created, unchanged } => Reply::json(
            200,
            &serde_json::json!({"created": created, "unchanged": unchanged}),
        ),
    }
}

fn to_json(value: &impl Serialize) -> String {
    // Serialising our own plain data types cannot fail: no maps with
    // non-string keys, no failing Serialize impls.
    serde_json::to_string(value).unwrap_or_else(|_| String::from("{}"))
}

macro_rules! error_codes {
    ($($variant:ident => $status:literal, $text:literal;)+) => {
        /// Every `error_code` the service can answer with.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, utoipa::ToSchema)]
        #[serde(rename_all = "SCREAMING_SNAKE_CASE")]
        pub enum ErrorCode {
            $($variant),+
        }

        impl ErrorCode {
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self { $(ErrorCode::$variant => $text),+ }
            }

            pub fn status(self) -> u16 {
                match self { $(ErrorCode::$variant => $status),+ }
            }
        }
    };
}

error_codes! {
    MalformedJson => 400, "MALFORMED_JSON";
    IdempotencyKeyInvalid => 400, "IDEMPOTENCY_KEY_INVALID";
    Unauthenticated => 401, "UNAUTHENTICATED";
    Forbidden => 403, "FORBIDDEN";
    NotFound => 404, "NOT_FOUND";
    AssetNotFound => 404, "ASSET_NOT_FOUND";
    ReservationNotFound => 404, "RESERVATION_NOT_FOUND";
    RefundNotFound => 404, "REFUND_NOT_FOUND";
    EventNotFound => 404, "EVENT_NOT_FOUND";
    PaymentNotFound => 404, "PAYMENT_NOT_FOUND";
    MethodNotAllowed => 405, "METHOD_NOT_ALLOWED";
    AssetExists => 409, "ASSET_EXISTS";
    AssetUnavailable => 409, "ASSET_UNAVAILABLE";
    HoldExpired => 409, "HOLD_EXPIRED";
    ReservationNotActive => 409, "RESERVATION_NOT_ACTIVE";
    AlreadyCommitted => 409, "ALREADY_COMMITTED";
    PaymentReferenceUsed => 409, "PAYMENT_REFERENCE_USED";
    IdempotencyKeyInUse => 409, "IDEMPOTENCY_KEY_IN_USE";
    HoldLimitReached => 409, "HOLD_LIMIT_REACHED";
    PaymentAmountMismatch => 409, "PAYMENT_AMOUNT_MISMATCH";
    WaitlistNotOpen => 409, "WAITLIST_NOT_OPEN";
    WaitlistFull => 409, "WAITLIST_FULL";
    WaitlistEntryNotFound => 404, "WAITLIST_ENTRY_NOT_FOUND";
    SaleNotOpen => 409, "SALE_NOT_OPEN";
    HoldExtensionLimit => 409, "HOLD_EXTENSION_LIMIT";
    AssetHeld => 409, "ASSET_HELD";
    AssetSold => 409, "ASSET_SOLD";
    PayloadTooLarge => 413, "PAYLOAD_TOO_LARGE";
    UnsupportedMediaType => 415, "UNSUPPORTED_MEDIA_TYPE";
    RequestHeadersTooLarge => 431, "REQUEST_HEADERS_TOO_LARGE";
    ValidationFailed => 422, "VALIDATION_FAILED";
    IdempotencyKeyReused => 422, "IDEMPOTENCY_KEY_REUSED";
    RateLimited => 429, "RATE_LIMITED";
    Internal => 500, "INTERNAL";
    ServiceUnavailable => 503, "SERVICE_UNAVAILABLE";
}

/// The reason phrase used as a problem's `title`.
pub fn title(status: u16) -> &'static str {
    match status {
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        413 => "Content Too Large",
        415 => "Unsupported Media Type",
        431 => "Request Header Fields Too Large",
        422 => "Unprocessable Content",
        429 => "Too Many Requests",
        503 => "Service Unavailable",
        _ => "Internal Server Error",
    }
}

/// An RFC 9457 problem with our `error_code` and `message`, plus extra members.
#[derive(Debug, Clone)]
pub struct Problem {
    pub code: ErrorCode,
    pub message: String,
    pub extra: Map<String, Value>,
}

impl Problem {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            extra: Map::new(),
        }
    }

    pub fn with(mut self, member: &str, value: impl Serialize) -> Self {
        let value = serde_json::to_value(value).unwrap_or(Value::Null);
        self.extra.insert(member.to_owned(), value);
        self
    }

    pub fn status(&self) -> u16 {
        self.code.status()
    }

    pub fn into_reply(self) -> Reply {
        let status = self.status();
        let mut body = Map::new();
        body.insert("type".into(), Value::from("about:blank"));
        body.insert("title".into(), Value::from(title(status)));
        body.insert("status".into(), Value::from(status));
        body.insert("error_code".into(), Value::from(self.code.as_str()));
        body.insert("message".into(), Value::from(self.message));
        body.extend(self.extra);
        Reply {
            status,
            body: to_json(&body),
            location: None,
            problem: true,
            replayed: false,
        }
    }
}

pub fn reservation_location(reservation: &Reservation) -> String {
    format!("/v1/reservations/{}", reservation.reservation_id)
}

pub fn hold_created(reservation: &Reservation) -> Reply {
    let mut reply = Reply::json(201, reservation);
    reply.location = Some(reservation_location(reservation));
    reply
}

pub fn reservation_ok(reservation: &Reservation) -> Reply {
    Reply::json(200, reservation)
}

/// The 409 of a hold on a taken asset, as bytes. The losers of a flash sale
/// all get the same answer: each thread keeps its last rendering and reuses
/// it while the asset's status and expiry are the same (a pure function of
/// both, so never stale).
pub fn asset_unavailable_reply(seen: AssetUnavailable) -> Reply {
    type Rendered = (AssetUnavailable, Reply);
    thread_local! {
        static LAST: std::cell::RefCell<Option<Rendered>> = const { std::cell::RefCell::new(None) };
    }
    LAST.with(|last| {
        let mut last = last.borrow_mut();
        match &*last {
            Some((last_seen, reply)) if *last_seen == seen => reply.clone(),
            _ => {
                let reply = asset_unavailable(seen.status, seen.hold_expires_at)
                    .with("waitlist_length", seen.waitlist_length)
                    .into_reply();
                *last = Some((seen, reply.clone()));
                reply
            }
        }
    })
}

pub fn asset_unavailable(status: AssetStatus, hold_expires_at: Option<Timestamp>) -> Problem {
    let mut p = Problem::new(
        ErrorCode::AssetUnavailable,
        "Asset is currently reserved by another buyer or already sold.",
    )
    .with("asset_status", status);
    if let Some(e) = hold_expires_at {
        p = p.with("hold_expires_at", format_timestamp(&e));
    }
    p
}

/// The 409 of a commit that could not be honoured, carrying its refund.
pub fn commit_refused(reason: RefundReason, reservation: &Reservation, refund: &Refund) -> Problem {
    let (code, message) = match reason {
        RefundReason::HoldExpired => (
            ErrorCode::HoldExpired,
            "The hold expired before the commit; the payment is to be refunded.",
        ),
        RefundReason::ReservationReleased => (
            ErrorCode::ReservationNotActive,
            "The reservation was released; the payment is to be refunded.",
        ),
        RefundReason::AlreadyCommitted => (
            ErrorCode::AlreadyCommitted,
            "The reservation was already committed with another payment; this payment is to be \
                refunded.",
        ),
        RefundReason::SaleVoided => (
            ErrorCode::ReservationNotActive,
            "The sale was voided; the payment is to be refunded.",
        ),
        RefundReason::AmountMismatch => (
            ErrorCode::PaymentAmountMismatch,
            "The payment took less than the reservation's price, or another currency; it is to \
                be refunded, and the hold stays until it lapses.",
        ),
    };
    Problem::new(code, message)
        .with("reservation", reservation)
        .with("refund", refund)
}

/// The 409 of a payment that already has its one fate through another
/// reservation: no refund (`refund` is absent), and `payment` says what the
/// payment did.
pub fn payment_reference_used(reservation: &Reservation, payment: &Payment) -> Problem {
    let message = match payment.fate {
        PaymentOutcome::Bought => format!(
            "This payment_reference bought reservation {}; it cannot pay for another, and \
                nothing is refunded.",
            payment.reservation.reservation_id
        ),
        PaymentOutcome::Refunded => format!(
            "This payment_reference was refunded through reservation {}; it cannot pay for \
                another, and is not refunded twice.",
            payment.reservation.reservation_id
        ),
    };
    Problem::new(ErrorCode::PaymentReferenceUsed, message)
        .with("reservation", reservation)
        .with("payment", payment)
}

/// The 409 of a voided sale's own payment sent again: the void settled it
/// (with the refund it carries, or outside holdfast); nothing new.
pub fn sale_voided(reservation: &Reservation, refund: Option<&Refund>) -> Problem {
    let problem = Problem::new(
        ErrorCode::ReservationNotActive,
        match refund {
            Some(_) => {
                "The sale was voided and this payment refunded by the void; nothing new \
                is refunded."
            }
            None => {
                "The sale was voided and this payment settled outside holdfast; nothing is \
                refunded."
            }
        },
    )
    .with("reservation", reservation);
    match refund {
        Some(refund) => problem.with("refund", refund),
        None => problem,
    }
}

pub fn reservation_not_active(reservation: &Reservation) -> Problem {
    Problem::new(
        ErrorCode::ReservationNotActive,
        format!(
            "The reservation is {} and can no longer change.",
            reservation.status
        ),
    )
    .with("reservation", reservation)
}

pub fn sale_not_open(available_from: Timestamp) -> Problem {
    Problem::new(
        ErrorCode::SaleNotOpen,
        "The sale of this asset has not opened yet; hold it from available_from on.",
    )
    .with("available_from", format_timestamp(&available_from))
}

pub fn hold_extension_limit(reservation: &Reservation, max_total_seconds: i64) -> Problem {
    Problem::new(
        ErrorCode::HoldExtensionLimit,
        format!(
            "A hold may last at most {max_total_seconds} seconds from its creation; commit \
            or release it."
        ),
    )
    .with("reservation", reservation)
}

pub fn asset_held(asset: &Asset) -> Problem {
    Problem::new(
        ErrorCode::AssetHeld,
        "The asset is held by a buyer; withdraw it with {\"force\": true} to end that hold.",
    )
    .with("asset", asset)
}

pub fn asset_sold(asset: &Asset) -> Problem {
    Problem::new(
        ErrorCode::AssetSold,
        "The asset is sold; void the sale first.",
    )
    .with("asset", asset)
}

pub fn hold_limit_reached(limit: i64) -> Problem {
    Problem::new(
        ErrorCode::HoldLimitReached,
        format!(
            "This buyer already has {limit} live holds, the most allowed; release or commit \
            one first."
        ),
    )
    .with("limit", limit)
}

pub fn key_reused() -> Problem {
    Problem::new(
        ErrorCode::IdempotencyKeyReused,
        "This Idempotency-Key was already used for a different request.",
    )
}

pub fn key_in_use() -> Problem {
    Problem::new(
        ErrorCode::IdempotencyKeyInUse,
        "An earlier request with this Idempotency-Key is still running; retry shortly.",
    )
}

pub fn validation_failed(errors: Vec<FieldError>) -> Problem {
    Problem::new(
        ErrorCode::ValidationFailed,
        "The request has invalid fields.",
    )
    .with("errors", errors)
}

pub fn asset_not_found() -> Problem {
    Problem::new(ErrorCode::AssetNotFound, "No asset has this id.")
}

pub fn reservation_not_found() -> Problem {
    Problem::new(
        ErrorCode::ReservationNotFound,
        "No reservation has this id.",
    )
}

pub fn waitlist_entry_not_found() -> Problem {
    Problem::new(
        ErrorCode::WaitlistEntryNotFound,
        "This buyer of this client is not waiting for this asset.",
    )
}

pub fn waitlist_not_open(status: AssetStatus) -> Problem {
    Problem::new(
        ErrorCode::WaitlistNotOpen,
        "Only an asset held by another buyer has a waiting list: hold an available asset \
         instead; a sold or withdrawn one has no queue.",
    )
    .with("asset_status", status)
}

pub fn waitlist_full(max: i64) -> Problem {
    Problem::new(
        ErrorCode::WaitlistFull,
        format!("At most {max} buyers may wait for one asset."),
    )
    .with("waitlist_max", max)
}

pub fn refund_not_found() -> Problem {
    Problem::new(ErrorCode::RefundNotFound, "No refund has this id.")
}

pub fn payment_not_found() -> Problem {
    Problem::new(
        ErrorCode::PaymentNotFound,
        "No payment with this reference reached holdfast.",
    )
}

pub fn event_not_found() -> Problem {
    Problem::new(ErrorCode::EventNotFound, "No event has this id.")
}

/// The 503 of a database that did not answer in time, saying whether the
/// request may have changed something.
pub fn service_unavailable(outcome: WriteOutcome) -> Problem {
    let message = match outcome {
        WriteOutcome::NotApplied => {
            "The database is unreachable or too slow; nothing was changed. Retry later."
        }
        WriteOutcome::Unknown => {
            "The database did not confirm in time; the change may have been committed. \
             Retry with the same Idempotency-Key: if it committed, the stored answer is \
             returned; if not, the request runs again."
        }
    };
    Problem::new(ErrorCode::ServiceUnavailable, message).with("write_outcome", outcome)
}

/// The 503 of a change whose COMMIT may have been sent, for an operation
/// that takes no Idempotency-Key: no answer is stored to replay, so the
/// client reads the resource back to learn whether the change happened.
pub fn unconfirmed_without_key() -> Problem {
    Problem::new(
        ErrorCode::ServiceUnavailable,
        "The database did not confirm in time; the change may have been committed. \
         Read the resource back to learn whether it happened before sending the \
         request again.",
    )
    .with("write_outcome", WriteOutcome::Unknown)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeZone, Utc};

    #[test]
    fn a_kept_rejection_is_the_same_bytes_as_a_fresh_one() {
        let at = Utc.with_ymd_and_hms(2026, 11, 29, 12, 0, 0).unwrap();
        let later = at + chrono::Duration::seconds(5);
        for (status, expiry) in [
            (AssetStatus::Held, Some(at)),
            (AssetStatus::Held, Some(at)),
            (AssetStatus::Held, Some(later)),
            (AssetStatus::Sold, None),
            (AssetStatus::Held, Some(at)),
        ] {
            let kept = asset_unavailable_reply(AssetUnavailable {
                status,
                hold_expires_at: expiry,
                waitlist_length: 2,
            });
            let fresh = asset_unavailable(status, expiry).with("waitlist_length", 2);
            assert_eq!(kept, fresh.into_reply());
        }
    }

    #[test]
    fn problem_has_the_contract_members() {
        let reply = Problem::new(ErrorCode::AssetExists, "taken")
            .with("x", 1)
            .into_reply();
        assert_eq!(reply.status, 409);
        assert!(reply.problem);
        let v: Value = serde_json::from_str(&reply.body).unwrap();
        assert_eq!(v["type"], "about:blank");
        assert_eq!(v["title"], "Conflict");
        assert_eq!(v["status"], 409);
        assert_eq!(v["error_code"], "ASSET_EXISTS");
        assert_eq!(v["message"], "taken");
        assert_eq!(v["x"], 1);
    }

    #[test]
    fn replay_turns_created_into_ok() {
        let r = Reply::replay(201, "{}".into(), Some("/x".into()));
        assert_eq!(r.status, 200);
        assert!(r.replayed);
        assert_eq!(Reply::replay(409, "{}".into(), None).status, 409);
    }

    #[test]
    fn every_code_is_upper_snake_and_serialises_as_its_text() {
        for code in ErrorCode::ALL {
            let s = code.as_str();
            assert!(s.chars().all(|c| c.is_ascii_uppercase() || c == '_'), "{s}");
            assert_eq!(serde_json::to_value(code).unwrap(), s);
        }
    }
}
