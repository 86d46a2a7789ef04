//! The HTTP ceiling of the benchmark: a minimal actix-web handler reading the
//! request's body and answering a JSON body of the size of a hold's 409,
//! with the same server settings.
//! `cargo run --release --example http_ceiling -- 127.0.0.1:18300`

use actix_web::{web, App, HttpResponse, HttpServer};

const BODY: &str = r#"{"asset_status":"HELD","error_code":"ASSET_UNAVAILABLE","hold_expires_at":"2026-11-29T20:08:17.299730Z","message":"Asset is currently reserved by another buyer or already sold.","status":409,"title":"Conflict","type":"about:blank"}"#;

/// Takes the request body in, as any handler of a POST must.
async fn answer(_body: web::Bytes) -> HttpResponse {
    HttpResponse::Conflict()
        .content_type("application/problem+json")
        .body(BODY)
}

#[actix_web::main]
async fn main() -> std::io::Result<()> {
    let bind = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:18300".into());
    let workers = std::thread::available_parallelism().map_or(2, usize::from);
    HttpServer::new(|| App::new().default_service(web::to(answer)))
        .workers(workers)
        .bind(bind)?
        .run()
        .await
}
