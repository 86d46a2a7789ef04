//! Typed path parameters: each parses its segment of the route actix
//! matched (a bad one reads as a missing resource, 404) and documents it, so
//! that a parameter's pattern and parsing live in one type used by the
//! handler and its document alike.

use actix_web::dev::Payload;
use actix_web::{FromRequest, HttpRequest};
use utoipa::openapi::path::{Parameter, ParameterIn};
use utoipa::openapi::schema::{ObjectBuilder, SchemaType, Type};
use utoipa::IntoParams;

use super::docs::parameter;
use super::error::ApiError;
use crate::domain::{AssetId, BuyerId, EventId, PaymentReference, RefundId, ReservationId};
use crate::reply::{self, Problem};

macro_rules! path_param {
    (
        $(#[$meta:meta])*
        $name:ident($inner:ty): $param:literal,
        parse = $parse:expr,
        missing = $missing:path,
        pattern = $pattern:expr,
        description = $description:expr $(,)?
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone)]
        pub struct $name(pub $inner);

        impl FromRequest for $name {
            type Error = ApiError;
            type Future = std::future::Ready<Result<Self, ApiError>>;

            fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
                let parse: fn(&str) -> Option<$inner> = $parse;
                let missing: fn() -> Problem = $missing;
                std::future::ready(
                    req.match_info()
                        .get($param)
                        .and_then(parse)
                        .map($name)
                        .ok_or_else(|| missing().into()),
                )
            }
        }

        impl IntoParams for $name {
            fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
                let schema = ObjectBuilder::new()
                    .schema_type(SchemaType::Type(Type::String))
                    .pattern(Some($pattern));
                vec![parameter($param, ParameterIn::Path, $description, schema)]
            }
        }
    };
    // An id of a prefix and a ULID: its type parses and patterns it.
    (
        $(#[$meta:meta])*
        $name:ident($inner:ident): $param:literal,
        missing = $missing:path $(,)?
    ) => {
        path_param!(
            $(#[$meta])*
            $name($inner): $param,
            parse = $inner::parse,
            missing = $missing,
            pattern = $inner::PATTERN,
            description = format!("{} followed by a ULID", $inner::PREFIX),
        );
    };
}

path_param!(
    /// `{asset_id}`.
    AssetPath(AssetId): "asset_id",
    parse = |s| AssetId::parse(s).ok(),
    missing = reply::asset_not_found,
    pattern = AssetId::PATTERN,
    description = "The asset's id",
);

path_param!(
    /// `{reservation_id}`.
    ReservationPath(ReservationId): "reservation_id",
    missing = reply::reservation_not_found,
);

path_param!(
    /// `{refund_id}`.
    RefundPath(RefundId): "refund_id",
    missing = reply::refund_not_found,
);

path_param!(
    /// `{event_id}`.
    EventPath(EventId): "event_id",
    missing = reply::event_not_found,
);

path_param!(
    /// `{payment_reference}`.
    PaymentPath(PaymentReference): "payment_reference",
    parse = |s| PaymentReference::parse(&percent_decoded(s)?).ok(),
    missing = reply::payment_not_found,
    pattern = "^[^\\x00-\\x1F\\x7F-\\x9F]{1,128}$",
    description = "The payment system's reference",
);

path_param!(
    /// `{buyer_id}` of a waiting list's entry.
    WaiterPath(BuyerId): "buyer_id",
    parse = |s| BuyerId::parse(&percent_decoded(s)?).ok(),
    missing = reply::waitlist_entry_not_found,
    pattern = "^[^\\x00-\\x1F\\x7F-\\x9F]{1,64}$",
    description = "The waiting buyer",
);

/// A path segment with every `%XX` decoded (actix decodes only the
/// characters a path may carry as they are; a reference may hold any).
fn percent_decoded(segment: &str) -> Option<String> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = segment.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::percent_decoded;

    #[test]
    fn segments_are_percent_decoded_whole() {
        assert_eq!(percent_decoded("pay%2F1%20x").as_deref(), Some("pay/1 x"));
        assert_eq!(percent_decoded("plain").as_deref(), Some("plain"));
        assert_eq!(percent_decoded("bad%2"), None);
        assert_eq!(percent_decoded("%FF"), None);
    }
}
