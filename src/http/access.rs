//! Who may call what: API keys (`Authorization: Bearer <token>`, or from a
//! browser the key as the password of HTTP Basic), roles, open mode, and the
//! per-client request rate.
//!
//! Keys are configured as `name:role:sha256-hex-of-token`, so no plaintext
//! token is stored. Every operation of the API has a rule in [`rule`]; an
//! operation without one is refused (and a test fails).

use std::net::IpAddr;
use std::num::NonZeroU32;

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header;
use actix_web::middleware::Next;
use actix_web::{web, HttpMessage};
use governor::clock::{Clock, DefaultClock};
use governor::state::keyed::DefaultKeyedStateStore;
use governor::{Quota, RateLimiter};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::error::ApiError;
use super::RouteTable;
use crate::reply::ErrorCode;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Everything.
    Admin,
    /// Reads assets and events; holds; reads and releases its own reservations.
    Storefront,
    /// Reads; commits; releases; refunds.
    Payments,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Admin, Role::Storefront, Role::Payments];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Storefront => "storefront",
            Role::Payments => "payments",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Role::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

/// Who may call an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// No credentials: health, metrics, the document and the docs page.
    Public,
    Roles(&'static [Role]),
}

use Role::{Admin, Payments, Storefront};

/// The rule of every operation, by operationId.
pub fn rule(operation_id: &str) -> Option<Rule> {
    const ALL: &[Role] = &[Admin, Storefront, Payments];
    Some(match operation_id {
        "get_health" | "get_readiness" | "get_metrics" | "get_openapi" | "get_docs" => Rule::Public,
        "create_asset" | "update_asset" | "withdraw_asset" | "reinstate_asset"
        | "list_dead_events" | "redeliver_event" => Rule::Roles(&[Admin]),
        "get_console" | "get_console_css" | "get_console_js" | "count_assets" => {
            Rule::Roles(&[Admin])
        }
        "get_asset" | "list_assets" | "list_asset_events" | "list_events" => Rule::Roles(ALL),
        "hold_asset" => Rule::Roles(&[Admin, Storefront]),
        "get_reservation" | "release_reservation" | "list_reservations" => Rule::Roles(ALL),
        "extend_reservation" => Rule::Roles(&[Admin, Storefront]),
        "void_reservation" => Rule::Roles(&[Admin]),
        "commit_reservation" | "list_refunds" | "complete_refund" => {
            Rule::Roles(&[Admin, Payments])
        }
        _ => return None,
    })
}

/// One configured API key.
#[derive(Clone)]
pub struct ApiKey {
    pub name: String,
    pub role: Role,
    digest: [u8; 32],
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ApiKey({}:{})", self.name, self.role.as_str())
    }
}

/// The configured keys; empty means open mode.
#[derive(Debug, Clone, Default)]
pub struct KeyRing {
    keys: Vec<ApiKey>,
}

pub fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl KeyRing {
    /// Entries `name:role:sha256hex`, separated by commas or new lines;
    /// blank lines and `#` comments are ignored.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut keys: Vec<ApiKey> = Vec::new();
        for entry in text.split([',', '\n']).map(str::trim) {
            if entry.is_empty() || entry.starts_with('#') {
                continue;
            }
            let mut parts = entry.split(':');
            let (Some(name), Some(role), Some(hash), None) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                return Err("an entry is not name:role:sha256-hex".into());
            };
            if name.is_empty()
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
            {
                return Err(format!(
                    "key name {name:?} must be letters, digits, '.', '_' or '-'"
                ));
            }
            let role = Role::parse(role).ok_or_else(|| {
                format!("key {name}: role {role:?} is not admin, storefront or payments")
            })?;
            let digest = decode_hex(hash)
                .ok_or_else(|| format!("key {name}: the hash is not 64 hex digits"))?;
            keys.push(ApiKey {
                name: name.to_owned(),
                role,
                digest,
            });
        }
        Ok(Self { keys })
    }

    pub fn is_open(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The key whose hash matches `token`. Every key is compared in constant
    /// time, so the answer's timing says nothing about the keys.
    pub fn authenticate(&self, token: &str) -> Option<&ApiKey> {
        let presented = digest(token);
        let mut found = None;
        for key in &self.keys {
            if bool::from(key.digest.ct_eq(&presented)) {
                found = Some(key);
            }
        }
        found
    }
}

fn decode_hex(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// A new random token and the entry that configures it.
pub fn new_key(name: &str, role: Role) -> Result<(String, String), String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| format!("no randomness available: {e}"))?;
    use base64::Engine;
    let token = format!(
        "hf_{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    );
    let entry = format!("{name}:{}:{}", role.as_str(), hex(&digest(&token)));
    Ok((token, entry))
}

/// The caller of a request, as the handlers see it.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The API key's name; one shared name in open mode.
    pub name: String,
    /// `None` in open mode.
    pub role: Option<Role>,
}

impl Caller {
    pub const OPEN: &'static str = "-";

    pub fn open() -> Self {
        Self {
            name: Self::OPEN.to_owned(),
            role: None,
        }
    }

    /// Storefronts see only their own reservations; everyone else sees all.
    pub fn owner_filter(&self) -> Option<String> {
        (self.role == Some(Role::Storefront)).then(|| self.name.clone())
    }
}

type Limiter = RateLimiter<String, DefaultKeyedStateStore<String>, DefaultClock>;

/// Authentication, authorisation and the rate limit, in front of every route.
pub struct Guard {
    keys: KeyRing,
    limiter: Option<Limiter>,
}

impl Guard {
    pub fn new(keys: KeyRing, rate: Option<(u32, u32)>) -> Self {
        let limiter = rate.and_then(|(per_second, burst)| {
            let quota = Quota::per_second(NonZeroU32::new(per_second)?)
                .allow_burst(NonZeroU32::new(burst.max(1))?);
            Some(RateLimiter::keyed(quota))
        });
        Self { keys, limiter }
    }

    pub fn is_open(&self) -> bool {
        self.keys.is_open()
    }

    fn check(&self, req: &ServiceRequest, routes: &RouteTable) -> Result<Option<Caller>, ApiError> {
        let Some(operation) = routes.operation(req.method(), req.path()) else {
            // Unknown route or method: the fallback answers 404 or 405.
            return Ok(None);
        };
        let roles = match rule(operation) {
            Some(Rule::Public) => return Ok(None),
            Some(Rule::Roles(roles)) => roles,
            None => {
                return Err(ApiError::new(
                    ErrorCode::Forbidden,
                    "This operation is not open to any role.",
                ))
            }
        };
        let caller = if self.keys.is_open() {
            Caller::open()
        } else {
            let token = req
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(presented_token);
            let key = token
                .and_then(|t| self.keys.authenticate(&t))
                .ok_or_else(|| {
                    ApiError::new(
                        ErrorCode::Unauthenticated,
                        if is_browser_page(operation) {
                            "Sign in with an API key as the password (any user name), \
                             or send Authorization: Bearer <token>."
                        } else {
                            "Send a valid API key as Authorization: Bearer <token>."
                        },
                    )
                })?;
            if !roles.contains(&key.role) {
                return Err(ApiError::new(
                    ErrorCode::Forbidden,
                    format!("The {} role may not do this.", key.role.as_str()),
                ));
            }
            Caller {
                name: key.name.clone(),
                role: Some(key.role),
            }
        };
        if let Some(limiter) = &self.limiter {
            // By key name; in open mode by the peer's address.
            let bucket = match caller.role {
                Some(_) => caller.name.clone(),
                None => req
                    .peer_addr()
                    .map(|a| a.ip())
                    .unwrap_or(IpAddr::from([0, 0, 0, 0]))
                    .to_string(),
            };
            if let Err(not_until) = limiter.check_key(&bucket) {
                let wait = not_until.wait_time_from(DefaultClock::default().now());
                return Err(ApiError::Limited {
                    retry_after: wait.as_secs().max(1),
                });
            }
        }
        Ok(Some(caller))
    }
}

/// The API key in an `Authorization` value: `Bearer <token>`, or `Basic`
/// with the token as the password (the user name is ignored), which is what a
/// browser sends once a person has signed in to the console.
fn presented_token(value: &str) -> Option<String> {
    let (scheme, credentials) = value.trim().split_once(' ')?;
    let credentials = credentials.trim();
    let token = if scheme.eq_ignore_ascii_case("Bearer") {
        credentials.to_owned()
    } else if scheme.eq_ignore_ascii_case("Basic") {
        use base64::Engine;
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(credentials)
            .ok()?;
        let (_user, password) = std::str::from_utf8(&decoded).ok()?.split_once(':')?;
        password.to_owned()
    } else {
        return None;
    };
    (!token.is_empty()).then_some(token)
}

/// Pages a person opens in a browser: their 401 invites HTTP Basic, so that
/// the browser asks for the key (and then sends it with the page's requests).
fn is_browser_page(operation: &str) -> bool {
    super::console::OPERATIONS.contains(&operation)
}

/// The challenge of a 401 for `operation`.
fn challenge(operation: Option<&str>) -> &'static str {
    match operation {
        Some(op) if is_browser_page(op) => r#"Basic realm="holdfast console", charset="UTF-8""#,
        _ => "Bearer",
    }
}

pub async fn guard(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let routes = req.app_data::<web::Data<RouteTable>>().cloned();
    let verdict = match (req.app_data::<web::Data<Guard>>(), &routes) {
        (Some(guard), Some(routes)) => guard.check(&req, routes),
        _ => Ok(None),
    };
    match verdict {
        Ok(caller) => {
            if let Some(caller) = caller {
                req.extensions_mut().insert(caller);
            }
            next.call(req)
                .await
                .map(ServiceResponse::map_into_boxed_body)
        }
        Err(error) => {
            let mut response = actix_web::ResponseError::error_response(&error);
            if matches!(&error, ApiError::Problem(p) if p.code == ErrorCode::Unauthenticated) {
                let operation = routes
                    .as_ref()
                    .and_then(|r| r.operation(req.method(), req.path()));
                response.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    header::HeaderValue::from_static(challenge(operation)),
                );
            }
            Ok(req.into_response(response))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_parse_and_authenticate_by_hash() {
        let (token, entry) = new_key("shop-1", Role::Storefront).unwrap();
        assert!(token.starts_with("hf_"));
        let (other, other_entry) = new_key("pay", Role::Payments).unwrap();
        let ring = KeyRing::parse(&format!("# keys\n{entry}\n{other_entry}, ")).unwrap();
        assert_eq!(ring.len(), 2);
        let key = ring.authenticate(&token).unwrap();
        assert_eq!((key.name.as_str(), key.role), ("shop-1", Role::Storefront));
        assert_eq!(ring.authenticate(&other).unwrap().role, Role::Payments);
        assert!(ring.authenticate("hf_wrong").is_none());
        assert!(!entry.contains(&token), "the entry never holds the token");
    }

    #[test]
    fn bad_entries_are_named() {
        assert!(KeyRing::parse("a:admin").is_err());
        assert!(KeyRing::parse(&format!("a:root:{}", "0".repeat(64))).is_err());
        assert!(KeyRing::parse("a:admin:abc").is_err());
        assert!(KeyRing::parse(&format!("a b:admin:{}", "0".repeat(64))).is_err());
        assert!(KeyRing::parse("").unwrap().is_open());
    }

    #[test]
    fn tokens_come_as_bearer_or_as_the_basic_password() {
        use base64::Engine;
        let basic = |s: &str| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(s)
            )
        };
        assert_eq!(presented_token("Bearer hf_a").as_deref(), Some("hf_a"));
        assert_eq!(presented_token("bearer  hf_a ").as_deref(), Some("hf_a"));
        assert_eq!(presented_token(&basic("ops:hf_b")).as_deref(), Some("hf_b"));
        assert_eq!(
            presented_token(&basic(":hf_c:d")).as_deref(),
            Some("hf_c:d")
        );
        assert_eq!(presented_token(&basic("ops:")), None);
        assert_eq!(presented_token(&basic("no-colon")), None);
        assert_eq!(presented_token("Basic !!!"), None);
        assert_eq!(presented_token("Bearer "), None);
        assert_eq!(presented_token("Digest x"), None);
        assert_eq!(presented_token("hf_a"), None);
    }

    #[test]
    fn console_pages_challenge_for_basic() {
        assert!(challenge(Some("get_console")).starts_with("Basic realm="));
        assert_eq!(challenge(Some("list_assets")), "Bearer");
        assert_eq!(challenge(None), "Bearer");
    }

    #[test]
    fn storefronts_see_only_their_own() {
        let shop = Caller {
            name: "shop".into(),
            role: Some(Role::Storefront),
        };
        assert_eq!(shop.owner_filter().as_deref(), Some("shop"));
        assert_eq!(Caller::open().owner_filter(), None);
    }
}
