//! Logs (compact text by default, JSON lines on request, `RUST_LOG` filters)
//! and Prometheus metrics rendered on our own `/metrics` route.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::OnceLock;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::EnvFilter;

use crate::store::Store;

pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false);
    let result = match format {
        LogFormat::Text => builder.compact().try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .try_init(),
    };
    // A second init (tests) keeps the first subscriber.
    drop(result);
}

/// Request durations, in seconds: from a fast rejection to a slow commit.
const DURATION_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// Every metric the service exports, with its help text.
pub const METRICS: &[(&str, &str)] = &[
    (
        "holdfast_holds_total",
        "Hold requests by outcome: created, replayed, conflict, not_open, \
        limit_reached, not_found, rejected.",
    ),
    (
        "holdfast_commits_total",
        "Commit requests by outcome: committed, committed_late, replayed, unchanged, \
            hold_expired, not_active, already_committed, payment_reference_used, not_found, \
                rejected.",
    ),
    (
        "holdfast_releases_total",
        "Release requests by outcome: released, replayed, unchanged, \
        not_active, not_found, rejected.",
    ),
    (
        "holdfast_withdrawals_total",
        "Withdraw requests by outcome: withdrawn, unchanged, held, \
        sold, not_found.",
    ),
    (
        "holdfast_reinstatements_total",
        "Reinstate requests by outcome: reinstated, unchanged, \
        not_found.",
    ),
    (
        "holdfast_extensions_total",
        "Extend requests by outcome: extended, replayed, not_active, \
        limit_reached, not_found, rejected.",
    ),
    (
        "holdfast_voids_total",
        "Void requests by outcome: voided, replayed, unchanged, not_active, \
        not_found, rejected.",
    ),
    (
        "holdfast_refunds_requested_total",
        "Refunds created, by reason.",
    ),
    (
        "holdfast_refunds_completed_total",
        "Refunds reported done by the payment system.",
    ),
    (
        "holdfast_idempotency_replays_total",
        "Answers replayed from an idempotency key.",
    ),
    (
        "holdfast_janitor_runs_total",
        "Janitor passes, by result: ok, error.",
    ),
    (
        "holdfast_janitor_expired_total",
        "Lapsed holds the janitor expired.",
    ),
    (
        "holdfast_webhook_deliveries_total",
        "Webhook delivery attempts by outcome: delivered, \
        retrying, dead.",
    ),
    (
        "holdfast_http_requests_duration_seconds",
        "HTTP request duration by route pattern, method \
        and status class.",
    ),
    ("holdfast_db_pool_size", "Database connections open."),
    ("holdfast_db_pool_in_use", "Database connections in use."),
    (
        "holdfast_db_pool_waiting",
        "Requests waiting for a database connection.",
    ),
    (
        "holdfast_db_statements_total",
        "Statements sent to the database, each a round trip \
        (several requests' reads may share one).",
    ),
    (
        "holdfast_sqlite_commits_total",
        "SQLite commits of write transactions, each shared by the \
        writes queued together (group commit).",
    ),
    (
        "holdfast_sqlite_grouped_writes_total",
        "SQLite writes committed or rolled back in a shared \
        transaction; divided by the commits, the writes per commit.",
    ),
    (
        "holdfast_db_errors_total",
        "Database failures answered 503 or 500, by kind: timeout, \
        unavailable, other.",
    ),
];

/// How often the recorder's queued samples are folded in between scrapes.
const UPKEEP_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// The process-wide recorder, installed on first use.
pub fn metrics() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let builder = PrometheusBuilder::new()
            .set_buckets(DURATION_BUCKETS)
            .unwrap_or_else(|_| PrometheusBuilder::new());
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        // A histogram's samples wait in a queue until upkeep folds them into
        // its buckets: without this, a service nobody scrapes would keep
        // every request's duration, and grow by them.
        let upkeep = handle.clone();
        let spawned = std::thread::Builder::new()
            .name("metrics-upkeep".into())
            .spawn(move || loop {
                std::thread::sleep(UPKEEP_INTERVAL);
                upkeep.run_upkeep();
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "no metrics upkeep thread: durations are folded in at scrapes only");
        }
        // Only fails when another recorder is installed, which we never do.
        let _ = metrics::set_global_recorder(recorder);
        for (name, help) in METRICS {
            metrics::describe_counter!(*name, *help);
        }
        handle
    })
}

/// The scrape: pool gauges taken now, then every metric in text format.
pub fn render(store: &Store) -> String {
    let handle = metrics();
    let pool = store.pool_status();
    metrics::gauge!("holdfast_db_pool_size").set(pool.size as f64);
    metrics::gauge!("holdfast_db_pool_in_use").set(pool.in_use as f64);
    metrics::gauge!("holdfast_db_pool_waiting").set(pool.waiting as f64);
    handle.run_upkeep();
    handle.render()
}

/// Counts one outcome of a use case.
pub fn count(metric: &'static str, outcome: &'static str) {
    type Counters = HashMap<(&'static str, &'static str), metrics::Counter>;
    thread_local! {
        static COUNTERS: RefCell<Counters> = RefCell::default();
    }
    COUNTERS.with_borrow_mut(|counters| {
        counters
            .entry((metric, outcome))
            .or_insert_with(|| registered(|| metrics::counter!(metric, "outcome" => outcome)))
            .increment(1)
    });
}

/// A metric's handle, made once the recorder is installed. Handles are kept
/// per thread by their labels and recorded into directly, rather than built
/// and looked up in the registry again on every request; the registry never
/// drops a series, so a kept handle stays the one `/metrics` renders.
pub fn registered<H>(handle: impl FnOnce() -> H) -> H {
    metrics();
    handle()
}

/// Log format: compact text or one JSON object per line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}
