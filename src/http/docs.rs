//! The parts of the OpenAPI document that are derived from tables rather
//! than handler annotations: which problems each operation can answer, with
//! the `error_code`s it can carry and an example rendered by the real code.

use serde_json::Value;
use utoipa::openapi::content::ContentBuilder;
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::path::{Operation, Parameter, ParameterBuilder, ParameterIn};
use utoipa::openapi::response::ResponseBuilder;
use utoipa::openapi::schema::{
    Discriminator, ObjectBuilder, OneOfBuilder, RefBuilder, Schema, SchemaType, Type,
};
use utoipa::openapi::{OpenApi, Ref, RefOr, Required};

use super::error::{PROBLEM_JSON, REPLAYED};
use super::operations::{self, Rule};
use crate::domain::{AssetStatus, DataKind, FieldError};
use crate::reply::{self, ErrorCode, Problem};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};

/// The `Idempotency-Key` request header.
fn idempotency_key() -> Parameter {
    let value = ObjectBuilder::new()
        .schema_type(SchemaType::Type(Type::String))
        .min_length(Some(1))
        .max_length(Some(255))
        .pattern(Some("^[\\x20-\\x7E]*[\\x21-\\x7E][\\x20-\\x7E]*$"));
    ParameterBuilder::new()
        .name("Idempotency-Key")
        .parameter_in(ParameterIn::Header)
        .required(Required::True)
        .description(Some(
            "Makes the request safe to retry: a new random value per request (a\n\
             UUID is fine), the same value when retrying it. 1 to 255 printable\n\
             ASCII characters.",
        ))
        .schema(Some(value))
        .example(Some(serde_json::json!("8f14e45f-hold-1")))
        .build()
}

/// A parameter of an operation, `description` of it and `schema` its value.
/// Only path parameters are required.
pub fn parameter(
    name: &str,
    parameter_in: ParameterIn,
    description: impl Into<String>,
    schema: impl Into<RefOr<Schema>>,
) -> Parameter {
    let required = match parameter_in {
        ParameterIn::Path => Required::True,
        _ => Required::False,
    };
    ParameterBuilder::new()
        .name(name)
        .parameter_in(parameter_in)
        .required(required)
        .description(Some(description))
        .schema(Some(schema))
        .build()
}

use ErrorCode::*;

/// An example body for `code`, rendered by the code that sends it.
fn example(code: ErrorCode) -> Value {
    let problem = match code {
        AssetUnavailable => reply::asset_unavailable(
            AssetStatus::Held,
            chrono::DateTime::parse_from_rfc3339("2026-11-29T14:30:00Z")
                .ok()
                .map(|t| t.with_timezone(&chrono::Utc)),
        ),
        ValidationFailed => reply::validation_failed(vec![FieldError::new(
            "buyer_id",
            "must be 1 to 64 characters",
        )]),
        IdempotencyKeyReused => reply::key_reused(),
        AssetNotFound => reply::asset_not_found(),
        ReservationNotFound => reply::reservation_not_found(),
        RefundNotFound => reply::refund_not_found(),
        EventNotFound => reply::event_not_found(),
        PaymentNotFound => reply::payment_not_found(),
        ServiceUnavailable => reply::service_unavailable(crate::store::WriteOutcome::Unknown),
        HoldLimitReached => reply::hold_limit_reached(5),
        WaitlistFull => reply::waitlist_full(1000),
        WaitlistNotOpen => reply::waitlist_not_open(AssetStatus::Sold),
        SaleNotOpen => reply::sale_not_open(
            chrono::DateTime::parse_from_rfc3339("2026-12-01T09:00:00Z")
                .map(|t| t.with_timezone(&chrono::Utc))
                .unwrap_or_default(),
        ),
        other => Problem::new(other, describe(other)),
    };
    serde_json::from_str(&problem.into_reply().body).unwrap_or(Value::Null)
}

/// The example of `code` when it has every member its schema requires
/// (the codes about a reservation, an asset or a payment have none).
fn complete_example(code: ErrorCode) -> Option<Value> {
    let example = example(code);
    members(code)
        .iter()
        .all(|(member, always)| !always || example.get(member).is_some())
        .then_some(example)
}

/// What each code means, for descriptions and examples.
pub fn describe(code: ErrorCode) -> &'static str {
    match code {
        MalformedJson => "The body is not JSON, or not a JSON object.",
        IdempotencyKeyInvalid => {
            "The Idempotency-Key header is missing, empty, too long or not \
            printable ASCII, or the request carries it twice (whatever the values)."
        }
        Unauthenticated => "No API key, or an unknown one.",
        Forbidden => {
            "This API key's role may not do this; or a change (any method but GET, HEAD and \
            OPTIONS) signed in with HTTP Basic came from another site: its Sec-Fetch-Site is not \
            same-origin or none, or without that header its Origin names another host; or a \
            browser's preflight was refused (see CORS above)."
        }
        NotFound => "No such route.",
        AssetNotFound => "No asset has this id.",
        ReservationNotFound => "No reservation has this id.",
        RefundNotFound => "No refund has this id.",
        EventNotFound => "No event has this id.",
        MethodNotAllowed => "The path exists but not with this method; see Allow.",
        AssetExists => "An asset with this id already exists.",
        AssetUnavailable => {
            "Held by another buyer (try later: see hold_expires_at), sold, or \
            withdrawn from sale: see asset_status."
        }
        HoldExpired => "The hold lapsed before the commit; the payment is refunded (see refund).",
        ReservationNotActive => {
            "The reservation is released, committed or expired; a payment \
            carried is refunded (see refund)."
        }
        AlreadyCommitted => {
            "Committed before with another payment; this payment is refunded \
            (see refund)."
        }
        PaymentReferenceUsed => {
            "This payment_reference already has its one fate through another \
            reservation (it bought it, or was refunded): nothing changed and no refund; see \
                payment."
        }
        PaymentNotFound => "No payment with this reference reached holdfast.",
        IdempotencyKeyInUse => "A request with this key is still running; retry shortly.",
        HoldLimitReached => "The buyer already has the maximum of live holds.",
        WaitlistNotOpen => {
            "Only an asset held by another buyer has a waiting list (see asset_status); an \
            available one is simply held."
        }
        WaitlistFull => "The asset has its most waiters (HOLDFAST_WAITLIST_MAX).",
        WaitlistEntryNotFound => "This buyer of this client is not waiting for this asset.",
        PaymentAmountMismatch => {
            "The payment took another currency, or less than the reservation's price: it is \
            refunded (reason AMOUNT_MISMATCH) and the hold stays, for a payment that pays."
        }
        SaleNotOpen => "The asset's sale has not opened yet; see available_from.",
        HoldExtensionLimit => {
            "The hold would outlive HOLDFAST_HOLD_MAX_TOTAL_SECONDS from its \
            creation."
        }
        AssetHeld => "The asset has a live hold; withdraw with force to end it.",
        AssetSold => "The asset is sold; void the sale first.",
        PayloadTooLarge => "The body is over the size limit.",
        RequestHeadersTooLarge => "The request line and headers are over 32 KiB.",
        UnsupportedMediaType => {
            "The body is not sent as application/json. A change sent with an HTML form's \
            encoding (application/x-www-form-urlencoded, multipart/form-data, text/plain) is \
            refused, even with an empty body."
        }
        ValidationFailed => "Fields break their rules; see errors.",
        IdempotencyKeyReused => "This Idempotency-Key was used for a different request.",
        RateLimited => "Too many requests; see Retry-After.",
        Internal => "A bug; nothing internal is shown.",
        ServiceUnavailable => {
            "The database is unreachable or too slow; see Retry-After. \
            `write_outcome` says whether anything may have been written: NOT_APPLIED (nothing \
                was: retry freely) or UNKNOWN (a COMMIT may have been sent: where the operation \
                takes an Idempotency-Key, retry with the same key, which returns the stored \
                answer if it committed; otherwise read the resource back to learn whether the \
                change happened)."
        }
    }
}

/// Adds every operation's problem responses, each typed with the
/// `error_code`s that operation can answer with at that status: one plain
/// schema per code (`AssetUnavailableProblem`, …), and a union of them,
/// discriminated by `error_code`, where a status carries several.
pub fn document_problems(api: &mut OpenApi) {
    let mut used = Vec::new();
    for item in api.paths.paths.values_mut() {
        for operation in [
            &mut item.get,
            &mut item.post,
            &mut item.put,
            &mut item.patch,
            &mut item.delete,
        ]
        .into_iter()
        .flatten()
        {
            used.extend(add_problems(operation));
        }
    }
    let components = api.components.get_or_insert_with(Default::default);
    let Some(RefOr::T(Schema::Object(problem))) = components.schemas.get("Problem").cloned() else {
        return;
    };
    for &code in ErrorCode::ALL.iter().filter(|code| used.contains(code)) {
        let mut narrowed = problem.clone();
        narrowed.title = Some(problem_schema(code));
        narrowed.description = Some(format!("`{}`: {}", code.as_str(), describe(code)));
        let members = members(code);
        narrowed.properties.retain(|name, _| {
            COMMON.contains(&name.as_str()) || members.iter().any(|(m, _)| m == name)
        });
        narrowed.required.extend(
            members
                .iter()
                .filter(|(_, always)| *always)
                .map(|(m, _)| (*m).to_owned()),
        );
        narrowed.properties.insert(
            "error_code".to_owned(),
            ObjectBuilder::new()
                .schema_type(SchemaType::Type(Type::String))
                .enum_values(Some([code.as_str()]))
                .into(),
        );
        components
            .schemas
            .insert(problem_schema(code), RefOr::T(Schema::Object(narrowed)));
    }
}

/// The members of every problem.
const COMMON: [&str; 5] = ["type", "title", "status", "error_code", "message"];

/// The members a code's problem carries beyond [`COMMON`], each with
/// whether it is always sent (see the constructors in `reply`).
fn members(code: ErrorCode) -> &'static [(&'static str, bool)] {
    use ErrorCode::*;
    match code {
        AssetUnavailable => &[
            ("asset_status", true),
            ("hold_expires_at", false),
            ("waitlist_length", false),
        ],
        SaleNotOpen => &[("available_from", true)],
        HoldLimitReached => &[("limit", true)],
        HoldExpired | AlreadyCommitted | PaymentAmountMismatch => {
            &[("reservation", true), ("refund", true)]
        }
        ReservationNotActive => &[("reservation", true), ("refund", false)],
        PaymentReferenceUsed => &[("reservation", true), ("payment", true)],
        HoldExtensionLimit => &[("reservation", true)],
        AssetHeld | AssetSold => &[("asset", true)],
        ValidationFailed => &[("errors", false)],
        WaitlistNotOpen => &[("asset_status", true)],
        WaitlistFull => &[("waitlist_max", true)],
        ServiceUnavailable => &[("write_outcome", true)],
        AssetExists => &[("conflicts", false)],
        _ => &[],
    }
}

/// The name of the schema of one code's problem: `ASSET_UNAVAILABLE` is
/// `AssetUnavailableProblem`.
fn problem_schema(code: ErrorCode) -> String {
    pascal(code.as_str()) + "Problem"
}

/// `ASSET_UNAVAILABLE` or `waitlist_skipped` as a schema name's words:
/// `AssetUnavailable`, `WaitlistSkipped`.
fn pascal(snake: &str) -> String {
    let mut name = String::new();
    for word in snake.split('_') {
        let mut letters = word.chars();
        if let Some(first) = letters.next() {
            name.extend(first.to_uppercase());
            name.extend(letters.flat_map(char::to_lowercase));
        }
    }
    name
}

/// The body of a problem response that carries `codes`: the one code's
/// schema, or their union discriminated by `error_code`.
fn problems_schema(codes: &[ErrorCode]) -> RefOr<Schema> {
    match codes {
        [code] => RefOr::Ref(Ref::from_schema_name(problem_schema(*code))),
        _ => {
            let mut discriminator = Discriminator::new("error_code");
            let mut one_of = OneOfBuilder::new();
            for code in codes {
                let name = problem_schema(*code);
                discriminator.mapping.insert(
                    code.as_str().to_owned(),
                    format!("#/components/schemas/{name}"),
                );
                one_of = one_of.item(Ref::from_schema_name(name));
            }
            one_of.discriminator(Some(discriminator)).into()
        }
    }
}

fn add_problems(operation: &mut Operation) -> Vec<ErrorCode> {
    let mut used = Vec::new();
    let Some(id) = operation.operation_id.clone() else {
        return used;
    };
    let Some(op) = operations::find(&id) else {
        return used;
    };
    if op.keyed() {
        add_key(operation);
    }
    for (status, codes) in op.all_problems() {
        used.extend_from_slice(&codes);
        let schema = problems_schema(&codes);
        let description = codes
            .iter()
            .map(|c| format!("`{}`: {}", c.as_str(), describe(*c)))
            .collect::<Vec<_>>()
            .join(" ");
        let mut response = ResponseBuilder::new().description(description).content(
            PROBLEM_JSON,
            ContentBuilder::new()
                .schema(Some(schema))
                .example(codes.first().and_then(|c| complete_example(*c)))
                .build(),
        );
        if status == 503 || status == 429 {
            response = response.header(
                "Retry-After",
                HeaderBuilder::new()
                    .schema(ObjectBuilder::new().schema_type(SchemaType::Type(Type::Integer)))
                    .description(Some("Seconds to wait before retrying."))
                    .build(),
            );
        }
        operation
            .responses
            .responses
            .insert(status.to_string(), RefOr::T(response.build()));
    }
    if let Rule::Roles(roles) = op.rule {
        operation.security = Some(vec![
            SecurityRequirement::new(BEARER, Vec::<String>::new()),
            SecurityRequirement::new(BASIC, Vec::<String>::new()),
        ]);
        let roles = roles
            .iter()
            .map(|r| r.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        let note = format!("\n\nRoles: {roles}.");
        operation.description = Some(operation.description.take().unwrap_or_default() + &note);
    }
    used
}

/// What every operation under an `Idempotency-Key` documents: the header,
/// and on its 200 the mark of a replay (unless the 200 says it its own way)
/// and the `Location` of the 201 it may replay.
fn add_key(operation: &mut Operation) {
    operation
        .parameters
        .get_or_insert_with(Vec::new)
        .push(idempotency_key());
    let location = match operation.responses.responses.get("201") {
        Some(RefOr::T(created)) => created.headers.get("Location").cloned(),
        _ => None,
    };
    if let Some(RefOr::T(ok)) = operation.responses.responses.get_mut("200") {
        if let Some(location) = location {
            ok.headers.entry("Location".to_owned()).or_insert(location);
        }
        ok.headers.entry(REPLAYED.to_owned()).or_insert_with(|| {
            HeaderBuilder::new()
                .schema(ObjectBuilder::new().schema_type(SchemaType::Type(Type::String)))
                .description(Some(
                    "`true` when this is the stored answer to an earlier request with this \
                         key",
                ))
                .build()
        });
    }
}

/// The scheme name of API keys in the document.
pub const BEARER: &str = "api_key";

/// The scheme name of API keys sent by a browser (HTTP Basic).
pub const BASIC: &str = "api_key_basic";

/// `Event` as a union discriminated by `data_kind`: one schema per kind of
/// `data` (`ReservationEvent`, `SummaryEvent`, …), each the event's own
/// fields with `data` of that kind's schema. The event's `type` alone does
/// not decide: a storefront sees another client's `reservation.held` as a
/// summary.
pub fn document_events(api: &mut OpenApi) {
    let components = api.components.get_or_insert_with(Default::default);
    let Some(RefOr::T(Schema::Object(event))) = components.schemas.get("Event").cloned() else {
        return;
    };
    let mut discriminator = Discriminator::new("data_kind");
    let mut one_of = OneOfBuilder::new().description(event.description.clone());
    for (kind, data) in DataKind::SCHEMAS {
        let mut variant = event.clone();
        let name = format!("{}Event", pascal(kind.as_str()));
        variant.title = Some(name.clone());
        variant.properties.insert(
            "data_kind".to_owned(),
            ObjectBuilder::new()
                .schema_type(SchemaType::Type(Type::String))
                .enum_values(Some([kind.as_str()]))
                .into(),
        );
        variant.properties.insert(
            "data".to_owned(),
            RefOr::Ref(
                RefBuilder::new()
                    .ref_location_from_schema_name(data)
                    .description(Some(format!(
                        "The {data} as the API showed it at that moment."
                    )))
                    .build(),
            ),
        );
        discriminator.mapping.insert(
            kind.as_str().to_owned(),
            format!("#/components/schemas/{name}"),
        );
        one_of = one_of.item(Ref::from_schema_name(name.clone()));
        components
            .schemas
            .insert(name, RefOr::T(Schema::Object(variant)));
    }
    components.schemas.insert(
        "Event".to_owned(),
        one_of.discriminator(Some(discriminator)).into(),
    );
}

/// The answers' objects whose every member is sent, `null` when it has no
/// value: each member is required, so that a generated type reads
/// `price: Price | null` rather than `price?: Price | null`.
const ALWAYS_SENT: [&str; 9] = [
    "Asset",
    "Reservation",
    "Refund",
    "Payment",
    "EventSummary",
    "AssetList",
    "EventList",
    "RefundList",
    "ReservationList",
];

/// Marks every member of [`ALWAYS_SENT`]'s objects, and of each event,
/// required.
pub fn document_always_sent(api: &mut OpenApi) {
    let components = api.components.get_or_insert_with(Default::default);
    for (name, schema) in components.schemas.iter_mut() {
        let event = name.ends_with("Event") && name != "Event";
        if let RefOr::T(Schema::Object(object)) = schema {
            if event || ALWAYS_SENT.contains(&name.as_str()) {
                object.required = object.properties.keys().cloned().collect();
            }
        }
    }
}

/// Declares the two ways to present an API key: `Authorization: Bearer
/// <token>`, and for browsers HTTP Basic with the token as the password.
pub fn document_security(api: &mut OpenApi) {
    let components = api.components.get_or_insert_with(Default::default);
    components.add_security_scheme(
        BEARER,
        SecurityScheme::Http(
            HttpBuilder::new()
                .scheme(HttpAuthScheme::Bearer)
                .description(Some(
                    "An API key from `holdfast keys new`, sent as `Authorization: Bearer <token>`. \
                     Without configured keys (open mode, loopback only) none is needed.",
                ))
                .build(),
        ),
    );
    components.add_security_scheme(
        BASIC,
        SecurityScheme::Http(
            HttpBuilder::new()
                .scheme(HttpAuthScheme::Basic)
                .description(Some(
                    "The same API key as the password of HTTP Basic, with any user name: \
                     `Authorization: Basic base64(user:token)`. This is how a browser signs in \
                     to the console at `/console`, whose 401 asks for Basic credentials; the \
                     browser then sends them with the page's own requests to `/v1/…`. \
                     Same keys, same roles, same constant-time check as the bearer scheme.",
                ))
                .build(),
        ),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn examples_carry_their_code() {
        for code in ErrorCode::ALL {
            assert_eq!(example(*code)["error_code"], code.as_str());
        }
    }

    /// A code's rendered problem has no member its schema leaves out.
    #[test]
    fn examples_carry_only_their_members() {
        let mut complete = 0;
        for &code in ErrorCode::ALL {
            let example = example(code);
            for member in example.as_object().into_iter().flat_map(|m| m.keys()) {
                assert!(
                    COMMON.contains(&member.as_str())
                        || members(code).iter().any(|(m, _)| m == member),
                    "{} sends {member}",
                    code.as_str()
                );
            }
            complete += usize::from(complete_example(code).is_some());
        }
        assert!(
            complete > ErrorCode::ALL.len() / 2,
            "{complete} complete examples"
        );
    }
}
