//! Request parsing at the edge: bodies, the Idempotency-Key header, the caller.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use actix_web::dev::Payload;
use actix_web::http::header;
use actix_web::{web, FromRequest, HttpRequest};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use utoipa::openapi::path::{Parameter, ParameterIn};
use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, SchemaFormat, SchemaType, Type};
use utoipa::IntoParams;

use super::access::Caller;
use super::docs::parameter;
use super::error::ApiError;
use super::AppState;
use crate::domain::{FieldError, IdempotencyKey};
use crate::keys::hex;
use crate::reply::{self, ErrorCode};
use crate::store::Idempotency;

/// The `Idempotency-Key` header, required on every reservation POST.
pub struct IdempotencyKeyHeader(pub IdempotencyKey);

impl FromRequest for IdempotencyKeyHeader {
    type Error = ApiError;
    type Future = std::future::Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let mut values = req.headers().get_all("Idempotency-Key");
        let value = values.next();
        // Two keys on one request: a proxy that kept the other one would
        // turn a retry into a second request.
        if value.is_some() && values.next().is_some() {
            return std::future::ready(Err(ApiError::new(
                ErrorCode::IdempotencyKeyInvalid,
                "send one Idempotency-Key header, not several",
            )));
        }
        let parsed = match value.map(|v| v.to_str()) {
            None => Err("the Idempotency-Key header is required".to_owned()),
            Some(Err(_)) => Err("the Idempotency-Key header must be printable ASCII".to_owned()),
            Some(Ok(text)) => IdempotencyKey::parse(text),
        };
        std::future::ready(
            parsed
                .map(IdempotencyKeyHeader)
                .map_err(|m| ApiError::new(ErrorCode::IdempotencyKeyInvalid, m)),
        )
    }
}

/// A request that changes something under an `Idempotency-Key`: who calls
/// (checked first), the key bound to this exact request (scoped by the
/// caller's key name; its fingerprint covers method, route, path parameters
/// and the canonical JSON body), marked as running on this instance for as
/// long as it or its work lives, the body, and when it arrived (its head
/// read, on this instance's monotonic clock).
pub struct KeyedRequest<T, const OPTIONAL: bool = false> {
    pub caller: Caller,
    pub idempotency: Idempotency,
    pub body: T,
    pub arrived: std::time::Instant,
}

impl<T: DeserializeOwned + 'static, const OPTIONAL: bool> FromRequest
    for KeyedRequest<T, OPTIONAL>
{
    type Error = ApiError;
    type Future = Pin<Box<dyn Future<Output = Result<Self, ApiError>>>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let arrived = std::time::Instant::now();
        let caller = Caller::extract(req).into_inner();
        let key = IdempotencyKeyHeader::extract(req).into_inner();
        let route = route_fingerprint(req);
        let body = JsonBody::<T, OPTIONAL>::from_request(req, payload);
        let state = req.app_data::<web::Data<AppState>>().cloned();
        Box::pin(async move {
            let (caller, key) = (caller?, key?);
            let body = body.await?;
            let mut fingerprint = route;
            fingerprint.update([0]);
            fingerprint.update(&body.canonical);
            let running = state.map(|s| Arc::new(s.running.enter(&caller.name, key.0.as_str())));
            let idempotency = Idempotency {
                client: caller.name.clone(),
                key: key.0,
                fingerprint: hex(&fingerprint.finalize()),
                running,
            };
            Ok(Self {
                caller,
                idempotency,
                body: body.value,
                arrived,
            })
        })
    }
}

/// The part of a request's fingerprint its route makes: method, route
/// pattern, path parameters.
fn route_fingerprint(req: &HttpRequest) -> Sha256 {
    let mut hash = Sha256::new();
    hash.update(req.method().as_str());
    hash.update([0]);
    hash.update(
        super::observe::route_pattern(req)
            .as_deref()
            .unwrap_or_default(),
    );
    for (name, value) in req.match_info().iter() {
        hash.update([0]);
        hash.update(name);
        hash.update([b'=']);
        hash.update(value);
    }
    hash
}

/// A JSON object body parsed into `T`, plus its canonical text (sorted keys,
/// no whitespace) for fingerprints. With `OPTIONAL`, an empty body or JSON
/// null reads as `{}`.
pub struct JsonBody<T, const OPTIONAL: bool = false> {
    pub value: T,
    pub canonical: String,
}

impl<T: DeserializeOwned + 'static, const OPTIONAL: bool> FromRequest for JsonBody<T, OPTIONAL> {
    type Error = ApiError;
    type Future = Pin<Box<dyn Future<Output = Result<Self, ApiError>>>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let batch = req
            .match_name()
            .and_then(super::operations::find)
            .is_some_and(|op| op.input == super::operations::Input::KeyedBatch);
        let limit = req
            .app_data::<web::Data<AppState>>()
            .map(|s| match batch {
                true => s.api.max_batch_body_bytes,
                false => s.api.max_body_bytes,
            })
            .unwrap_or(16 * 1024);
        let declared_too_large = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok())
            .is_some_and(|n| n > limit);
        let content_type = req
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap_or("?").to_owned());
        let bytes = web::Bytes::from_request(req, payload);
        Box::pin(async move {
            if declared_too_large {
                return Err(too_large(limit));
            }
            let bytes = bytes.await.map_err(|e| {
                if e.as_response_error().status_code().as_u16() == 413 {
                    too_large(limit)
                } else {
                    ApiError::new(
                        ErrorCode::MalformedJson,
                        "the request body could not be read",
                    )
                }
            })?;
            if bytes.len() > limit {
                return Err(too_large(limit));
            }
            let value: Value = if bytes.is_empty() {
                if !OPTIONAL {
                    return Err(ApiError::new(
                        ErrorCode::MalformedJson,
                        "a JSON object body is required",
                    ));
                }
                Value::Object(Default::default())
            } else {
                if !content_type.as_deref().is_some_and(is_json) {
                    return Err(ApiError::new(
                        ErrorCode::UnsupportedMediaType,
                        "the body must be sent as Content-Type: application/json",
                    ));
                }
                serde_json::from_slice(&bytes).map_err(|e| {
                    ApiError::new(
                        ErrorCode::MalformedJson,
                        format!("the body is not valid JSON: {e}"),
                    )
                })?
            };
            // An optional body may also be sent as JSON null, as the
            // document allows: the same request as no body.
            let value = match value {
                Value::Null if OPTIONAL => Value::Object(Default::default()),
                value => value,
            };
            if !value.is_object() {
                return Err(ApiError::new(
                    ErrorCode::MalformedJson,
                    "the body must be a JSON object",
                ));
            }
            let canonical = canonical_json(&value);
            let parsed = serde_path_to_error::deserialize::<_, T>(value).map_err(|e| {
                let field = match e.path().to_string() {
                    p if p == "." => field_from_message(&e.inner().to_string()),
                    p => p,
                };
                ApiError::from(reply::validation_failed(vec![FieldError::new(
                    field,
                    clean_message(&e.inner().to_string()),
                )]))
            })?;
            Ok(JsonBody {
                value: parsed,
                canonical,
            })
        })
    }
}

fn too_large(limit: usize) -> ApiError {
    ApiError::new(
        ErrorCode::PayloadTooLarge,
        format!("the body is larger than {limit} bytes"),
    )
}

fn is_json(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or_default().trim();
    essence.eq_ignore_ascii_case("application/json")
}

/// serde names a missing or unknown member in its message, not its path.
fn field_from_message(message: &str) -> String {
    message
        .split('`')
        .nth(1)
        .map(str::to_owned)
        .unwrap_or_else(|| String::from("body"))
}

fn clean_message(message: &str) -> String {
    message.replace('`', "'")
}

/// JSON with object keys sorted at every level and no insignificant whitespace.
pub fn canonical_json(value: &Value) -> String {
    fn write(value: &Value, out: &mut String) {
        match value {
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                out.push('{');
                for (i, k) in keys.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::String(k.clone()).to_string());
                    out.push(':');
                    write(&map[k], out);
                }
                out.push('}');
            }
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(item, out);
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let mut out = String::new();
    write(value, &mut out);
    out
}

/// The largest page any list returns.
pub const PAGE_MAX: i64 = 500;

/// A `limit` query parameter: 1 to [`PAGE_MAX`], `default` when absent.
pub fn page_limit(raw: Option<&str>, default: i64) -> Result<i64, String> {
    match raw {
        None => Ok(default),
        Some(text) => text
            .parse::<i64>()
            .ok()
            .filter(|n| (1..=PAGE_MAX).contains(n))
            .ok_or_else(|| format!("must be an integer from 1 to {PAGE_MAX}")),
    }
}

/// The `limit` and `cursor` of a keyset-paged list, whose pages hold
/// `DEFAULT` items when no limit is given.
#[derive(Debug, Deserialize)]
pub struct PageQuery<const DEFAULT: i64> {
    pub limit: Option<String>,
    pub cursor: Option<String>,
}

impl<const DEFAULT: i64> IntoParams for PageQuery<DEFAULT> {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        let size = format!("Page size, 1 to {PAGE_MAX} (default {DEFAULT}).");
        let limit = ObjectBuilder::new()
            .schema_type(SchemaType::Type(Type::Integer))
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
            .maximum(Some(PAGE_MAX as f64))
            .minimum(Some(1));
        let cursor = ObjectBuilder::new().schema_type(SchemaType::Type(Type::String));
        vec![
            parameter("limit", ParameterIn::Query, size, limit),
            parameter(
                "cursor",
                ParameterIn::Query,
                "`next_cursor` of the previous page.",
                cursor,
            ),
        ]
    }
}

/// Where a keyset-paged list starts and how much it holds.
#[derive(Debug, Clone)]
pub struct PageRequest<K> {
    pub limit: i64,
    /// The key of the last item of the previous page.
    pub after: Option<K>,
}

/// An opaque cursor: the base64 of a key.
pub fn cursor_of(key: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(key)
}

/// The key in a cursor this service issued, as `key` reads it.
fn key_in<K>(cursor: &str, key: fn(&str) -> Option<K>) -> Result<K, String> {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(cursor)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|text| key(&text))
        .ok_or_else(|| "is not a cursor this service issued".to_owned())
}

/// One page out of the up to `limit + 1` items a list asked for: the page,
/// and the cursor of the next one when more follow.
pub fn page_of<T>(
    mut items: Vec<T>,
    limit: i64,
    cursor: impl Fn(&T) -> String,
) -> (Vec<T>, Option<String>) {
    let limit = usize::try_from(limit).unwrap_or(0);
    if items.len() <= limit {
        return (items, None);
    }
    items.truncate(limit);
    let next = items.last().map(cursor);
    (items, next)
}

/// The answer of a keyset-paged list: one page of items and the cursor of
/// the next. Each list keeps its own name and documentation (the struct's,
/// and the items' when given) in the OpenAPI document.
macro_rules! list_page {
    (
        $(#[$meta:meta])*
        $name:ident {
            $(#[$items_meta:meta])*
            items: Vec<$item:ident> $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, ::serde::Serialize, ::utoipa::ToSchema)]
        pub struct $name {
            $(#[$items_meta])*
            pub items: Vec<$item>,
            /// Pass as `cursor` for the next page; null on the last page.
            pub next_cursor: Option<String>,
        }

        impl $name {
            /// The page out of the up to `limit + 1` items a list read: the
            /// first `limit`, and the cursor `cursor` makes of the last one
            /// when more follow.
            pub fn page(
                items: Vec<$item>,
                limit: i64,
                cursor: impl Fn(&$item) -> String,
            ) -> Self {
                let (items, next_cursor) = $crate::http::extract::page_of(items, limit, cursor);
                Self { items, next_cursor }
            }

            /// Answers 200 with this page.
            pub fn answer(&self) -> $crate::http::error::ApiResult {
                Ok($crate::http::error::respond($crate::reply::Reply::json(200, self)))
            }
        }
    };
}
pub(crate) use list_page;

/// One field checked on its own: its value, or the 422 that names it.
pub fn checked<T>(field: &str, result: Result<T, String>) -> Result<T, ApiError> {
    result.map_err(|message| reply::validation_failed(vec![FieldError::new(field, message)]).into())
}

/// Collects field errors and fails with 422 when there are any.
#[derive(Default)]
pub struct Validator {
    errors: Vec<FieldError>,
}

impl Validator {
    pub fn check<T>(&mut self, field: &str, result: Result<T, String>) -> Option<T> {
        match result {
            Ok(v) => Some(v),
            Err(message) => {
                self.errors.push(FieldError::new(field, message));
                None
            }
        }
    }

    /// The 422 of the fields that failed (called once a check did).
    /// Runs a check that names its own fields.
    pub fn fields(&mut self, check: impl FnOnce(&mut Vec<FieldError>)) {
        check(&mut self.errors);
    }

    pub fn failed(self) -> ApiError {
        reply::validation_failed(self.errors).into()
    }

    /// The fields that failed, for an interface other than HTTP.
    pub fn into_errors(self) -> Vec<FieldError> {
        self.errors
    }

    /// Checks a `limit` (1 to [`PAGE_MAX`], `default` when absent).
    pub fn limit(&mut self, raw: Option<&str>, default: i64) -> i64 {
        self.check("limit", page_limit(raw, default))
            .unwrap_or(default)
    }

    /// Checks a page's `limit` and its `cursor` (one this service issued,
    /// whose key `key` reads).
    pub fn page<K, const DEFAULT: i64>(
        &mut self,
        query: &PageQuery<DEFAULT>,
        key: fn(&str) -> Option<K>,
    ) -> PageRequest<K> {
        let limit = self.limit(query.limit.as_deref(), DEFAULT);
        let cursor = query.cursor.as_deref();
        let after = self
            .check("cursor", cursor.map(|c| key_in(c, key)).transpose())
            .flatten();
        PageRequest { limit, after }
    }

    /// Checks an optional query parameter with `parse`.
    pub fn optional<T>(
        &mut self,
        field: &str,
        raw: Option<&str>,
        parse: impl Fn(&str) -> Result<T, String>,
    ) -> Option<T> {
        self.check(field, raw.map(parse).transpose()).flatten()
    }

    pub fn finish(self) -> Result<(), ApiError> {
        if self.errors.is_empty() {
            Ok(())
        } else {
            Err(reply::validation_failed(self.errors).into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_json_sorts_keys_at_every_level() {
        let a: Value =
            serde_json::from_str(r#"{"b": 1, "a": {"y": [1, {"d": 2, "c": 3}], "x": "é"}}"#)
                .unwrap();
        assert_eq!(
            canonical_json(&a),
            r#"{"a":{"x":"é","y":[1,{"c":3,"d":2}]},"b":1}"#
        );
    }

    #[test]
    fn json_media_types() {
        assert!(is_json("application/json"));
        assert!(is_json("Application/JSON; charset=utf-8"));
        assert!(!is_json("text/plain"));
        assert!(!is_json("application/jsonx"));
    }

    #[test]
    fn field_names_come_out_of_serde_messages() {
        assert_eq!(field_from_message("missing field `buyer_id`"), "buyer_id");
        assert_eq!(
            field_from_message("unknown field `hold`, expected one of `a`"),
            "hold"
        );
        assert_eq!(field_from_message("something else"), "body");
    }
}
