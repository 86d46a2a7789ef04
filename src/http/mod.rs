//! The HTTP layer: parses and validates, calls one store use case, and maps
//! its typed outcome to a status and body.

pub mod access;
mod assets;
mod batch;
mod console;
mod docs;
mod edges;
pub mod error;
mod events;
mod extract;
mod health;
mod observe;
pub mod operations;
mod paths;
mod payments;
mod refunds;
mod reservations;
mod waitlist;

use actix_web::http::{header, Method};
use actix_web::{get, web, HttpRequest, HttpResponse};
use serde::Serialize;
use utoipa::openapi::path::PathItem;
use utoipa::openapi::OpenApi as OpenApiDoc;
use utoipa::{OpenApi, ToSchema};
use utoipa_actix_web::service_config::ServiceConfig;
use utoipa_actix_web::AppExt;

use crate::domain::{
    Asset, AssetStatus, ClearedEntry, EventSummary, FieldError, HoldBounds, Payment, Refund,
    Reservation, WaitlistCleared, WaitlistSkipped,
};
use crate::reply::{ErrorCode, Problem};
use crate::store::Store;
pub use assets::{new_asset, CreateAssetRequest};
pub use error::{respond, ApiError, PROBLEM_JSON};
pub use extract::canonical_json;
pub use extract::Validator;

/// What every handler can reach.
pub struct AppState {
    pub store: Store,
    pub api: ApiSettings,
    /// The OpenAPI document, rendered once.
    pub openapi_json: String,
    /// The keyed requests running on this instance.
    pub running: crate::store::Running,
}

/// What handlers take to reach it.
pub type State = web::Data<AppState>;

/// What a commit after its hold lapsed does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LateCommit {
    /// Refund the payment (409 HOLD_EXPIRED).
    Refund,
    /// Sell the asset when nobody held or bought it since; else refund.
    AcceptIfFree,
}

/// The settings the HTTP layer applies to requests.
#[derive(Debug, Clone)]
pub struct ApiSettings {
    pub hold_bounds: HoldBounds,
    pub max_body_bytes: usize,
    /// The body limit of a batch of assets.
    pub max_batch_body_bytes: usize,
    /// Origins allowed from browsers; `None` turns CORS off.
    pub cors_origins: Option<Vec<String>>,
}

/// An RFC 9457 problem as holdfast sends it (`application/problem+json`).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Problem, title = "Problem")]
pub struct ProblemBody {
    /// Always `about:blank`.
    #[serde(rename = "type")]
    #[schema(example = "about:blank")]
    pub problem_type: String,
    /// The HTTP reason phrase.
    #[schema(example = "Conflict")]
    pub title: String,
    #[schema(example = 409)]
    pub status: u16,
    /// Stable machine-readable code; new codes may be added.
    pub error_code: ErrorCode,
    /// For humans; may change.
    #[schema(example = "Asset is currently reserved by another buyer or already sold.")]
    pub message: String,
    /// VALIDATION_FAILED: the fields at fault.
    #[schema(nullable = false)]
    pub errors: Option<Vec<FieldError>>,
    /// ASSET_UNAVAILABLE: HELD, SOLD or WITHDRAWN.
    #[schema(nullable = false)]
    pub asset_status: Option<AssetStatus>,
    /// SALE_NOT_OPEN: when holds open.
    #[schema(value_type = Option<String>, format = DateTime, nullable = false)]
    pub available_from: Option<String>,
    /// ASSET_HELD, ASSET_SOLD: the asset as it is.
    #[schema(nullable = false)]
    pub asset: Option<Asset>,
    /// ASSET_UNAVAILABLE while HELD: when the hold lapses.
    #[schema(value_type = Option<String>, format = DateTime, nullable = false)]
    pub hold_expires_at: Option<String>,
    /// Every 409 about a reservation: its current state.
    #[schema(nullable = false)]
    pub reservation: Option<Reservation>,
    /// A commit that could not be honoured: the refund of its payment.
    /// Absent from PAYMENT_REFERENCE_USED, which refunds nothing.
    #[schema(nullable = false)]
    pub refund: Option<Refund>,
    /// PAYMENT_REFERENCE_USED: what the payment did, through another reservation.
    #[schema(nullable = false)]
    pub payment: Option<Payment>,
    /// SERVICE_UNAVAILABLE: whether the request may have changed something.
    #[schema(nullable = false)]
    pub write_outcome: Option<crate::store::WriteOutcome>,
    /// ASSET_UNAVAILABLE of a hold: how many buyers wait for the asset.
    #[schema(nullable = false, minimum = 0)]
    pub waitlist_length: Option<i64>,
    /// HOLD_LIMIT_REACHED: the most live holds one buyer may have.
    #[schema(nullable = false, minimum = 1)]
    pub limit: Option<i64>,
    /// WAITLIST_FULL: the most buyers that may wait for one asset.
    #[schema(nullable = false, minimum = 1)]
    pub waitlist_max: Option<i64>,
    /// ASSET_EXISTS of a batch: the items naming assets that exist with
    /// other data.
    #[schema(nullable = false)]
    pub conflicts: Option<Vec<batch::AssetConflict>>,
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "holdfast",
        description = "Hold-and-commit reservations for one-of-a-kind assets: a buyer holds, the \
            payment system commits, an abandoned hold comes back by itself.\n\n\
            Every answer carries `X-Content-Type-Options: nosniff`, and every answer under `/v1` \
            also `Cache-Control: no-store`: reservations, refunds and events carry buyer and \
            payment data. `HEAD` is served wherever `GET` is, with the same status and headers \
            and no body; it is not listed as an operation of its own.\n\n\
            Browsers on other origins (CORS): the origins listed in `HOLDFAST_CORS_ORIGINS` may \
            call every method the API serves (`GET`, `HEAD`, `POST`, `PATCH`) with the headers \
            `Authorization`, `Content-Type`, `Idempotency-Key` and `X-Request-Id`; `Date`, \
            `Location`, `Idempotent-Replayed`, `Retry-After` and `X-Request-Id` are exposed. Preflights are \
            answered without credentials; one from another origin, or for another method or \
            header, is `403 FORBIDDEN`. Without the setting no origin is allowed.",
        license(name = "Apache-2.0", identifier = "Apache-2.0")
    ),
    tags(
        (name = "assets", description = "One-of-a-kind assets and their timelines"),
        (name = "reservations", description = "Holds, commits and releases"),
        (name = "waitlists", description = "Queues for held assets, and offers to named buyers"),
        (name = "payments", description = "What became of each payment reference"),
        (name = "refunds", description = "Payments to give back, and their completion"),
        (name = "events", description = "The event feed and webhook delivery"),
        (name = "operations", description = "Health of the service"),
        (name = "console", description = "The operator console, a web page served by holdfast"),
    ),
    components(schemas(
        ProblemBody,
        ErrorCode,
        EventSummary,
        WaitlistSkipped,
        WaitlistCleared,
        ClearedEntry
    ))
)]
struct ApiDoc;

/// Every route of the API, from the table of operations: the router and the
/// OpenAPI document both come from here. The router tries resources in the
/// table's order, most with a regular expression: the hot paths come first.
pub fn configure(cfg: &mut ServiceConfig) {
    for operation in operations::OPERATIONS {
        (operation.register)(cfg);
    }
}

/// The OpenAPI document of this build.
pub fn openapi() -> OpenApiDoc {
    let (_, mut api) = actix_web::App::new()
        .into_utoipa_app()
        .openapi(ApiDoc::openapi())
        .configure(configure)
        .split_for_parts();
    api.info.version = env!("CARGO_PKG_VERSION").to_owned();
    docs::document_problems(&mut api);
    docs::document_security(&mut api);
    docs::document_events(&mut api);
    docs::document_always_sent(&mut api);
    api
}

/// Builds the application for one worker.
pub fn app(
    state: web::Data<AppState>,
    routes: web::Data<RouteTable>,
    guard: web::Data<access::Guard>,
) -> actix_web::App<
    impl actix_web::dev::ServiceFactory<
        actix_web::dev::ServiceRequest,
        Config = (),
        Response = actix_web::dev::ServiceResponse<impl actix_web::body::MessageBody>,
        Error = actix_web::Error,
        InitError = (),
    >,
> {
    // Each route's own limit is applied as its body is read (JsonBody);
    // no body is read past the largest.
    let limit = state.api.max_batch_body_bytes;
    let cors = cors(state.api.cors_origins.as_deref(), &routes.methods());
    let (app, _) = actix_web::App::new()
        .into_utoipa_app()
        .configure(configure)
        .split_for_parts();
    app.app_data(state)
        .app_data(routes)
        .app_data(guard)
        .app_data(web::PayloadConfig::new(limit))
        .app_data(web::QueryConfig::default().error_handler(|e, _| {
            ApiError::from(crate::reply::validation_failed(vec![FieldError::new(
                "query",
                e.to_string(),
            )]))
            .into()
        }))
        .app_data(
            web::PathConfig::default().error_handler(|_, _| {
                ApiError::new(ErrorCode::NotFound, "No such resource.").into()
            }),
        )
        .service(
            utoipa_swagger_ui::SwaggerUi::new("/docs/{_:.*}")
                .config(utoipa_swagger_ui::Config::new(["/openapi.json"]).validator_url("none")),
        )
        .default_service(web::to(fallback))
        .wrap(actix_web::middleware::from_fn(access::guard))
        .wrap(actix_web::middleware::Condition::new(
            cors.is_some(),
            cors.unwrap_or_default(),
        ))
        .wrap(actix_web::middleware::from_fn(edges::edges))
        .wrap(actix_web::middleware::from_fn(observe::observe))
}

/// CORS for browser front ends, when origins are configured.
fn cors(origins: Option<&[String]>, methods: &[Method]) -> Option<actix_cors::Cors> {
    let origins = origins?;
    let mut cors = actix_cors::Cors::default()
        .allowed_methods(methods.iter().cloned())
        .allowed_headers([
            header::AUTHORIZATION,
            header::CONTENT_TYPE,
            header::HeaderName::from_static("idempotency-key"),
            header::HeaderName::from_static("x-request-id"),
        ])
        .expose_headers([
            // The service's clock, for a countdown to a hold's expiry.
            header::DATE,
            header::LOCATION,
            header::RETRY_AFTER,
            header::HeaderName::from_static("idempotent-replayed"),
            header::HeaderName::from_static("x-request-id"),
        ])
        .max_age(600);
    for origin in origins {
        cors = cors.allowed_origin(origin);
    }
    Some(cors)
}

/// This document (OpenAPI 3.1).
#[utoipa::path(
    tag = "operations",
    responses((status = 200, description = "The OpenAPI \
        document", content_type = "application/json", body = Object))
)]
#[get("/openapi.json")]
async fn get_openapi(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(state.openapi_json.clone())
}

/// Prometheus metrics, in the text exposition format.
#[utoipa::path(
    tag = "operations",
    responses((status = 200, description = "Every metric (see the README's Operations \
        section)", content_type = "text/plain", body = String))
)]
#[get("/metrics")]
async fn get_metrics(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(crate::telemetry::render(&state.store))
}

/// The interactive documentation (Swagger UI, served offline) lives at `/docs/`.
#[utoipa::path(
    tag = "operations",
    responses((status = 308, description = "Redirect to \
        /docs/", headers(("Location" = String, description = "/docs/"))))
)]
#[get("/docs")]
async fn get_docs() -> HttpResponse {
    HttpResponse::PermanentRedirect()
        .insert_header((header::LOCATION, "/docs/"))
        .finish()
}

/// Known paths and their methods, for the `Allow` header of a 405. Access
/// and metrics never consult it: they follow the route actix matched.
pub struct RouteTable {
    routes: Vec<(PathPattern, Vec<(Method, String)>)>,
}

impl RouteTable {
    pub fn from_openapi(api: &OpenApiDoc) -> Self {
        let mut routes: Vec<(PathPattern, Vec<(Method, String)>)> = api
            .paths
            .paths
            .iter()
            .map(|(path, item)| (PathPattern::new(path), operations(item)))
            .collect();
        // Swagger UI's files: what GET /docs documents.
        routes.push((
            PathPattern::prefix("/docs/"),
            vec![(Method::GET, "get_docs".to_owned())],
        ));
        Self { routes }
    }

    /// Every method some route serves, HEAD wherever GET is.
    pub fn methods(&self) -> Vec<Method> {
        let mut methods = vec![Method::HEAD];
        for (_, ops) in &self.routes {
            for (method, _) in ops {
                if !methods.contains(method) {
                    methods.push(method.clone());
                }
            }
        }
        methods
    }

    fn route(&self, path: &str) -> Option<&[(Method, String)]> {
        self.routes
            .iter()
            .find(|(pattern, _)| pattern.matches(path))
            .map(|(_, m)| m.as_slice())
    }
}

/// An OpenAPI path template: literal segments and `{parameter}` segments,
/// each parameter matching one non-empty segment; or a literal prefix.
enum PathPattern {
    Segments(Vec<Option<String>>),
    Prefix(&'static str),
}

impl PathPattern {
    fn new(template: &str) -> Self {
        PathPattern::Segments(
            template
                .split('/')
                .map(|s| (!(s.starts_with('{') && s.ends_with('}'))).then(|| s.to_owned()))
                .collect(),
        )
    }

    fn prefix(prefix: &'static str) -> Self {
        PathPattern::Prefix(prefix)
    }

    fn matches(&self, path: &str) -> bool {
        match self {
            PathPattern::Prefix(prefix) => path.starts_with(prefix),
            PathPattern::Segments(segments) => {
                let mut parts = path.split('/');
                segments
                    .iter()
                    .all(|segment| match (segment, parts.next()) {
                        (Some(literal), Some(part)) => literal == part,
                        (None, Some(part)) => !part.is_empty(),
                        (_, None) => false,
                    })
                    && parts.next().is_none()
            }
        }
    }
}

fn operations(item: &PathItem) -> Vec<(Method, String)> {
    [
        (Method::GET, &item.get),
        (Method::POST, &item.post),
        (Method::PUT, &item.put),
        (Method::PATCH, &item.patch),
        (Method::DELETE, &item.delete),
    ]
    .into_iter()
    .filter_map(|(m, op)| Some((m, op.as_ref()?.operation_id.clone().unwrap_or_default())))
    .collect()
}

async fn fallback(req: HttpRequest, routes: web::Data<RouteTable>) -> HttpResponse {
    // The path as actix routes it (percent-decoded), not as it was sent.
    match routes.route(req.match_info().as_str()) {
        Some(methods) => {
            let mut allowed: Vec<&str> = methods.iter().map(|(m, _)| m.as_str()).collect();
            if allowed.contains(&"GET") {
                allowed.push("HEAD");
            }
            let allow = allowed.join(", ");
            let mut response = respond(
                Problem::new(
                    ErrorCode::MethodNotAllowed,
                    format!("{} is not allowed here; use {allow}.", req.method()),
                )
                .into_reply(),
            );
            if let Ok(value) = header::HeaderValue::from_str(&allow) {
                response.headers_mut().insert(header::ALLOW, value);
            }
            response
        }
        None => respond(Problem::new(ErrorCode::NotFound, "No such route.").into_reply()),
    }
}

#[cfg(test)]
mod tests {
    use super::PathPattern;

    #[test]
    fn path_patterns_match_whole_segments() {
        let hold = PathPattern::new("/v1/assets/{asset_id}/reservations");
        assert!(hold.matches("/v1/assets/EQ-1/reservations"));
        assert!(!hold.matches("/v1/assets//reservations"));
        assert!(!hold.matches("/v1/assets/EQ-1/reservations/"));
        assert!(!hold.matches("/v1/assets/EQ-1"));
        assert!(!hold.matches("/v1/assets/EQ-1/events"));
        assert!(PathPattern::new("/v1/assets").matches("/v1/assets"));
        assert!(!PathPattern::new("/v1/assets").matches("/v1/assets/"));
        assert!(PathPattern::prefix("/docs/").matches("/docs/index.css"));
    }
}
