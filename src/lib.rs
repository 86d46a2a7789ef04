//! holdfast: hold-and-commit reservations for one-of-a-kind assets.
//!
//! [`Application::build`] starts the whole service from a [`Config`], exactly
//! as the binary does; tests use it with port 0.

pub mod config;
pub mod domain;
pub mod http;
pub mod import;
pub mod janitor;
pub mod keys;
pub mod outbox;
pub mod reply;
pub mod secret;
pub mod store;
pub mod telemetry;
pub mod worker;

use std::net::TcpListener;

use actix_web::dev::Server;
use actix_web::{web, HttpServer};

pub use config::Config;
use http::{AppState, RouteTable};
pub use store::Store;

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    #[error(transparent)]
    Store(#[from] store::StoreError),
    #[error("{0}")]
    Webhook(String),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// A running service: its HTTP server and its janitor.
pub struct Application {
    server: Server,
    port: u16,
    store: Store,
    workers: Vec<worker::Worker>,
}

impl Application {
    /// Validates the settings, opens (and unless `migrate` is false, migrates)
    /// the database, binds the listener and starts the janitor.
    pub async fn build(config: Config, migrate: bool) -> Result<Self, StartError> {
        config.validate()?;
        let keys = config.check_access()?;
        if keys.is_open() {
            tracing::warn!(
                "OPEN MODE: no API keys are configured, so anyone who can reach {} may call \
                    every operation. \
                 Configure HOLDFAST_API_KEYS before exposing holdfast.",
                config.bind
            );
        } else {
            tracing::info!(keys = keys.len(), "API keys configured");
        }
        // The recorder first: connections take their metric handles when opened.
        crate::telemetry::metrics();
        let store = config.open_store().await?;
        if migrate {
            store.migrate().await?;
        }
        match store.check_feed().await {
            // A database down at start is no reason not to serve: requests
            // answer 503 until it is back. The check runs at the next start.
            Err(e) if e.is_unavailable() => {
                tracing::warn!(error = %e, "the event feed could not be checked at start")
            }
            other => other?,
        }
        let listener = TcpListener::bind(config.bind).map_err(|source| StartError::Bind {
            addr: config.bind,
            source,
        })?;
        let port = listener
            .local_addr()
            .map_err(|source| StartError::Bind {
                addr: config.bind,
                source,
            })?
            .port();
        let api = http::openapi();
        let guard = web::Data::new(http::access::Guard::new(keys, config.rate_limit(), &api));
        let routes = web::Data::new(RouteTable::from_openapi(&api));
        let mut workers = Vec::new();
        if let Some(every) = config.janitor_interval() {
            workers.push(janitor::start(store.clone(), every));
        }
        if let Some(settings) = config.webhook_settings() {
            let dispatcher =
                outbox::Dispatcher::new(store.clone(), settings).map_err(StartError::Webhook)?;
            workers.push(dispatcher.start(std::time::Duration::from_millis(
                config.dispatch_interval_ms,
            )));
        }
        let threads = match config.workers {
            0 => std::thread::available_parallelism().map_or(2, usize::from),
            n => n,
        };
        let grace = config.shutdown_grace_seconds;
        let state = web::Data::new(AppState {
            store: store.clone(),
            openapi_json: api.to_pretty_json().unwrap_or_default(),
            api: config.api_settings(),
            running: Default::default(),
        });
        let server =
            HttpServer::new(move || http::app(state.clone(), routes.clone(), guard.clone()))
                .workers(threads)
                .shutdown_timeout(grace)
                .listen(listener)
                .map_err(|source| StartError::Bind {
                    addr: std::net::SocketAddr::from(([0, 0, 0, 0], port)),
                    source,
                })?
                .run();
        Ok(Self {
            server,
            port,
            store,
            workers,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Serves until the server stops (SIGINT/SIGTERM), then lets the janitor
    /// and the dispatcher finish their current pass.
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        let result = self.server.await;
        for worker in self.workers {
            worker.stop().await;
        }
        result
    }
}
