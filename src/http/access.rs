//! Who may call what. Two steps, both failing closed:
//!
//! 1. In front of every route, [`guard`] authenticates the request (an API
//!    key as `Authorization: Bearer <token>`, or from a browser as the
//!    password of HTTP Basic), refuses cross-site form posts, and applies the
//!    per-client rate limit. With keys configured, a request without a valid
//!    key goes no further unless its path is exactly a public one.
//! 2. In the handler, the [`Caller`] extractor (the first argument of every
//!    guarded handler) takes the operation from the route actix matched,
//!    never from the raw path, and checks its roles in
//!    [`super::operations`]. A route without an entry there is refused.

use std::net::IpAddr;
use std::num::NonZeroU32;

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{Payload, ServiceRequest, ServiceResponse};
use actix_web::http::{header, Method};
use actix_web::middleware::Next;
use actix_web::{web, FromRequest, HttpMessage, HttpRequest};
use governor::clock::{Clock, DefaultClock};
use governor::state::keyed::DefaultKeyedStateStore;
use governor::{Quota, RateLimiter};
use utoipa::openapi::OpenApi as OpenApiDoc;

use super::error::ApiError;
use super::operations::{self, Rule};
use crate::keys::{KeyRing, Role, OPEN_MODE_NAME};
use crate::reply::ErrorCode;
use crate::store::Client;

/// The caller of a request, as the handlers see it.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The API key's name; one shared name in open mode.
    pub name: String,
    /// `None` in open mode.
    pub role: Option<Role>,
}

impl Caller {
    pub fn open() -> Self {
        Self {
            name: OPEN_MODE_NAME.to_owned(),
            role: None,
        }
    }

    /// The caller as the store sees it: storefronts see only their own
    /// reservations; everyone else sees all.
    pub fn client(&self) -> Client {
        Client {
            name: self.name.clone(),
            own_only: self.role == Some(Role::Storefront),
        }
    }
}

/// How the request presented its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scheme {
    Bearer,
    Basic,
}

type Limiter = RateLimiter<String, DefaultKeyedStateStore<String>, DefaultClock>;

/// Paths answered without credentials, exactly as the document writes them
/// (plus the docs page's files under `/docs/`), and the console's pages.
#[derive(Debug, Default)]
struct Paths {
    public: Vec<String>,
    pages: Vec<String>,
}

impl Paths {
    fn from_openapi(api: &OpenApiDoc) -> Self {
        let mut paths = Paths::default();
        for (path, item) in &api.paths.paths {
            let ids = [&item.get, &item.post, &item.put, &item.patch, &item.delete]
                .into_iter()
                .flatten()
                .filter_map(|op| op.operation_id.as_deref())
                .filter_map(operations::find);
            for op in ids {
                if op.rule == Rule::Public {
                    paths.public.push(path.clone());
                }
                if op.page {
                    paths.pages.push(path.clone());
                }
            }
        }
        paths
    }

    fn is_public(&self, path: &str) -> bool {
        path.starts_with("/docs/") || self.public.iter().any(|p| p == path)
    }

    fn is_page(&self, path: &str) -> bool {
        self.pages.iter().any(|p| p == path)
    }
}

/// Authentication, cross-site checks and the rate limit, in front of every route.
pub struct Guard {
    keys: KeyRing,
    limiter: Option<Limiter>,
    paths: Paths,
}

impl Guard {
    /// The configured keys.
    pub fn keys(&self) -> &KeyRing {
        &self.keys
    }

    pub fn new(keys: KeyRing, rate: Option<(u32, u32)>, api: &OpenApiDoc) -> Self {
        let limiter = rate.and_then(|(per_second, burst)| {
            let quota = Quota::per_second(NonZeroU32::new(per_second)?)
                .allow_burst(NonZeroU32::new(burst.max(1))?);
            Some(RateLimiter::keyed(quota))
        });
        Self {
            keys,
            limiter,
            paths: Paths::from_openapi(api),
        }
    }

    pub fn is_open(&self) -> bool {
        self.keys.is_open()
    }

    /// The caller presented by the request, if any; `Err` when an unsafe
    /// request signed in with Basic comes from another site.
    fn authenticate(&self, req: &ServiceRequest) -> Result<Option<Caller>, ApiError> {
        if self.keys.is_open() {
            return Ok(Some(Caller::open()));
        }
        let Some((scheme, token)) = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(presented_token)
        else {
            return Ok(None);
        };
        let Some(key) = self.keys.authenticate(&token) else {
            return Ok(None);
        };
        if scheme == Scheme::Basic && is_unsafe(req.method()) && is_cross_site(req) {
            return Err(ApiError::new(
                ErrorCode::Forbidden,
                "A change signed in with HTTP Basic must come from this site's own pages; \
                 other clients send Authorization: Bearer <token>.",
            ));
        }
        Ok(Some(Caller {
            name: key.name.clone(),
            role: Some(key.role),
        }))
    }

    fn limit(&self, req: &ServiceRequest, caller: Option<&Caller>) -> Result<(), ApiError> {
        let Some(limiter) = &self.limiter else {
            return Ok(());
        };
        // By key name; in open mode (and before authentication) by address.
        let bucket = match caller {
            Some(Caller {
                role: Some(_),
                name,
            }) => name.clone(),
            _ => req
                .peer_addr()
                .map(|a| a.ip())
                .unwrap_or(IpAddr::from([0, 0, 0, 0]))
                .to_string(),
        };
        match limiter.check_key(&bucket) {
            Ok(()) => Ok(()),
            Err(not_until) => {
                let wait = not_until.wait_time_from(DefaultClock::default().now());
                Err(ApiError::Limited {
                    retry_after: wait.as_secs().max(1),
                })
            }
        }
    }

    fn unauthenticated(&self, page: bool) -> ApiError {
        ApiError::Unauthenticated { page }
    }
}

fn is_unsafe(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// Whether a browser sent this request from a page of another site: by
/// `Sec-Fetch-Site` when present, else by an `Origin` naming another host.
fn is_cross_site(req: &ServiceRequest) -> bool {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .map(|v| v.to_str().unwrap_or("?").trim().to_ascii_lowercase())
    };
    if let Some(site) = header("sec-fetch-site") {
        return !matches!(site.as_str(), "same-origin" | "none");
    }
    match header("origin") {
        None => false,
        Some(origin) => {
            let host = header("host").unwrap_or_default();
            let authority = origin
                .strip_prefix("https://")
                .or_else(|| origin.strip_prefix("http://"));
            authority != Some(host.as_str())
        }
    }
}

/// A body a browser may send from any page without asking first: an HTML
/// form's encodings. Never JSON, so never an API request.
fn is_form(req: &ServiceRequest) -> bool {
    let Some(content_type) = req.headers().get(header::CONTENT_TYPE) else {
        return false;
    };
    let essence = content_type
        .to_str()
        .unwrap_or("?")
        .split(';')
        .next()
        .unwrap_or_default()
        .trim();
    [
        "application/x-www-form-urlencoded",
        "multipart/form-data",
        "text/plain",
    ]
    .iter()
    .any(|form| essence.eq_ignore_ascii_case(form))
}

/// The API key in an `Authorization` value: `Bearer <token>`, or `Basic`
/// with the token as the password (the user name is ignored), which is what a
/// browser sends once a person has signed in to the console.
fn presented_token(value: &str) -> Option<(Scheme, String)> {
    let (scheme, credentials) = value.trim().split_once(' ')?;
    let credentials = credentials.trim();
    let (scheme, token) = if scheme.eq_ignore_ascii_case("Bearer") {
        (Scheme::Bearer, credentials.to_owned())
    } else if scheme.eq_ignore_ascii_case("Basic") {
        use base64::Engine;
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(credentials)
            .ok()?;
        let (_user, password) = std::str::from_utf8(&decoded).ok()?.split_once(':')?;
        (Scheme::Basic, password.to_owned())
    } else {
        return None;
    };
    (!token.is_empty()).then_some((scheme, token))
}

/// Step one, in front of every route.
pub async fn guard(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let Some(guard) = req.app_data::<web::Data<Guard>>().cloned() else {
        // Without its guard the app cannot tell who calls: refuse.
        let error = ApiError::new(ErrorCode::Internal, "The access guard is missing.");
        return Ok(req.error_response(error));
    };
    let verdict = (|| {
        if is_unsafe(req.method()) && is_form(&req) {
            return Err(ApiError::new(
                ErrorCode::UnsupportedMediaType,
                "Form submissions are not accepted; send JSON as Content-Type: application/json.",
            ));
        }
        let caller = guard.authenticate(&req)?;
        guard.limit(&req, caller.as_ref())?;
        match caller {
            Some(caller) => Ok(Some(caller)),
            None if guard.paths.is_public(req.path()) => Ok(None),
            None => Err(guard.unauthenticated(guard.paths.is_page(req.path()))),
        }
    })();
    match verdict {
        Ok(caller) => {
            if let Some(caller) = caller {
                req.extensions_mut().insert(caller);
            }
            next.call(req)
                .await
                .map(ServiceResponse::map_into_boxed_body)
        }
        Err(error) => Ok(req.error_response(error)),
    }
}

/// Step two: the caller of a guarded handler, allowed by the roles of the
/// operation whose route actix matched. Open mode admits everyone; with keys,
/// no caller means 401, whatever ran before.
impl FromRequest for Caller {
    type Error = ApiError;
    type Future = std::future::Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        std::future::ready(authorize(req))
    }
}

fn authorize(req: &HttpRequest) -> Result<Caller, ApiError> {
    let operation = req.match_name().and_then(operations::find);
    let open = req
        .app_data::<web::Data<Guard>>()
        .is_some_and(|g| g.is_open());
    let caller = req.extensions().get::<Caller>().cloned();
    let caller = match caller {
        Some(caller) if caller.role.is_some() || open => caller,
        _ => {
            return Err(ApiError::Unauthenticated {
                page: operation.is_some_and(|op| op.page),
            })
        }
    };
    let roles = match operation.map(|op| op.rule) {
        Some(Rule::Roles(roles)) => roles,
        // Public operations need no caller; one that is not in the table is
        // open to nobody.
        Some(Rule::Public) | None => {
            return Err(ApiError::new(
                ErrorCode::Forbidden,
                "This operation is not open to any role.",
            ))
        }
    };
    match caller.role {
        None => Ok(caller),
        Some(role) if roles.contains(&role) => Ok(caller),
        Some(role) => Err(ApiError::new(
            ErrorCode::Forbidden,
            format!("The {} role may not do this.", role.as_str()),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_come_as_bearer_or_as_the_basic_password() {
        use base64::Engine;
        let basic = |s: &str| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(s)
            )
        };
        let token = |v: &str| presented_token(v).map(|(_, t)| t);
        assert_eq!(token("Bearer hf_a").as_deref(), Some("hf_a"));
        assert_eq!(token("bearer  hf_a ").as_deref(), Some("hf_a"));
        assert_eq!(
            presented_token(&basic("ops:hf_b")),
            Some((Scheme::Basic, "hf_b".to_owned()))
        );
        assert_eq!(token(&basic(":hf_c:d")).as_deref(), Some("hf_c:d"));
        assert_eq!(token(&basic("ops:")), None);
        assert_eq!(token(&basic("no-colon")), None);
        assert_eq!(token("Basic !!!"), None);
        assert_eq!(token("Bearer "), None);
        assert_eq!(token("Digest x"), None);
        assert_eq!(token("hf_a"), None);
    }

    #[test]
    fn storefronts_see_only_their_own() {
        let shop = Caller {
            name: "shop".into(),
            role: Some(Role::Storefront),
        };
        assert_eq!(shop.client().own_filter(), Some("shop"));
        assert_eq!(Caller::open().client().own_filter(), None);
    }
}
