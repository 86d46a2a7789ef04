//! Settings from flags and `HOLDFAST_*` environment variables, checked at start.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, FromArgMatches};

use crate::domain::HoldBounds;
pub use crate::http::LateCommit;
use crate::keys::KeyRing;
pub use crate::secret::Secret;
use crate::store::{DatabaseUrl, Policy, SqliteSynchronous, StoreSettings};
pub use crate::telemetry::LogFormat;

/// Every setting of the service. Each flag has a `HOLDFAST_*` variable.
#[derive(Debug, Clone, Args)]
pub struct Config {
    /// `sqlite://PATH` (embedded) or `postgres://USER@HOST:PORT/DB`.
    #[arg(
        long,
        env = "HOLDFAST_DATABASE_URL",
        default_value = "sqlite://holdfast.db",
        global = true
    )]
    pub database_url: String,

    /// Address to listen on.
    #[arg(long, env = "HOLDFAST_BIND", default_value = "127.0.0.1:8080", global = true)]
    pub bind: SocketAddr,

    /// Default hold length in seconds.
    #[arg(long, env = "HOLDFAST_HOLD_SECONDS", default_value_t = 600, global = true)]
    pub hold_seconds: i64,

    /// Smallest `hold_seconds` a request may ask for.
    #[arg(long, env = "HOLDFAST_HOLD_SECONDS_MIN", default_value_t = 30, global = true)]
    pub hold_seconds_min: i64,

    /// Largest `hold_seconds` a request may ask for.
    #[arg(long, env = "HOLDFAST_HOLD_SECONDS_MAX", default_value_t = 3600, global = true)]
    pub hold_seconds_max: i64,

    /// Longest a hold may live from its creation, extensions included.
    #[arg(long, env = "HOLDFAST_HOLD_MAX_TOTAL_SECONDS", default_value_t = 7200, global = true)]
    pub hold_max_total_seconds: i64,

    /// A commit after its hold lapsed: `refund` (always) or `accept-if-free`
    /// (sell when nobody held or bought the asset since; else refund).
    #[arg(
        long,
        env = "HOLDFAST_LATE_COMMIT",
        value_enum,
        default_value_t = LateCommit::Refund,
        global = true
    )]
    pub late_commit: LateCommit,

    /// How long the hold handed to the first waiter lasts, in seconds.
    #[arg(long, env = "HOLDFAST_WAITLIST_HOLD_SECONDS", default_value_t = 900, global = true)]
    pub waitlist_hold_seconds: i64,

    /// The most buyers that may wait for one asset.
    #[arg(long, env = "HOLDFAST_WAITLIST_MAX", default_value_t = 1000, global = true)]
    pub waitlist_max: i64,

    /// The longest an offer may last from its creation, in days.
    #[arg(long, env = "HOLDFAST_OFFER_MAX_DAYS", default_value_t = 14, global = true)]
    pub offer_max_days: i64,

    /// Seconds between janitor passes; 0 turns the janitor off.
    #[arg(long, env = "HOLDFAST_JANITOR_INTERVAL_SECONDS", default_value_t = 30, global = true)]
    pub janitor_interval_seconds: u64,

    /// Lapsed holds expired per janitor transaction.
    #[arg(long, env = "HOLDFAST_JANITOR_BATCH", default_value_t = 500, global = true)]
    pub janitor_batch: i64,

    /// How long stored answers to idempotent requests are kept.
    #[arg(long, env = "HOLDFAST_IDEMPOTENCY_RETENTION_HOURS", default_value_t = 24, global = true)]
    pub idempotency_retention_hours: u64,

    /// Delivered events older than this many days are purged by the janitor;
    /// unset keeps every event (they are the audit trail).
    #[arg(long, env = "HOLDFAST_EVENT_RETENTION_DAYS", global = true)]
    pub event_retention_days: Option<u64>,

    /// URL that receives every event as a signed POST; unset turns delivery off.
    #[arg(long, env = "HOLDFAST_WEBHOOK_URL", global = true)]
    pub webhook_url: Option<String>,

    /// Key of the webhook signature (HMAC-SHA256); required with HOLDFAST_WEBHOOK_URL.
    #[arg(long, env = "HOLDFAST_WEBHOOK_SECRET", hide_env_values = true, global = true)]
    pub webhook_secret: Option<Secret>,

    /// Longest wait for the receiver's answer, in milliseconds.
    #[arg(long, env = "HOLDFAST_WEBHOOK_TIMEOUT_MS", default_value_t = 5000, global = true)]
    pub webhook_timeout_ms: u64,

    /// Delivery attempts before an event is parked as dead.
    #[arg(long, env = "HOLDFAST_WEBHOOK_MAX_ATTEMPTS", default_value_t = 15, global = true)]
    pub webhook_max_attempts: i32,

    /// First retry delay in milliseconds; doubles per attempt, with jitter.
    #[arg(long, env = "HOLDFAST_WEBHOOK_RETRY_BASE_MS", default_value_t = 2000, global = true)]
    pub webhook_retry_base_ms: u64,

    /// Longest delay between two attempts, in seconds.
    #[arg(long, env = "HOLDFAST_WEBHOOK_RETRY_MAX_SECONDS", default_value_t = 3600, global = true)]
    pub webhook_retry_max_seconds: u64,

    /// How often the dispatcher looks for due events, in milliseconds.
    #[arg(long, env = "HOLDFAST_DISPATCH_INTERVAL_MS", default_value_t = 500, global = true)]
    pub dispatch_interval_ms: u64,

    /// API keys, `name:role:sha256-hex-of-token`, comma separated (see
    /// `holdfast keys new`). With none here or in the file: open mode.
    #[arg(long, env = "HOLDFAST_API_KEYS", hide_env_values = true, global = true)]
    pub api_keys: Option<Secret>,

    /// A file of API key entries, one per line (`#` starts a comment).
    #[arg(long, env = "HOLDFAST_API_KEYS_FILE", global = true)]
    pub api_keys_file: Option<PathBuf>,

    /// Origins allowed to call from a browser, comma separated; unset: no CORS.
    #[arg(long, env = "HOLDFAST_CORS_ORIGINS", global = true)]
    pub cors_origins: Option<String>,

    /// Most live holds one buyer of one client may have at once; 0: no limit.
    #[arg(long, env = "HOLDFAST_MAX_HOLDS_PER_BUYER", default_value_t = 5, global = true)]
    pub max_holds_per_buyer: u32,

    /// Requests per second allowed per client (API key, or address in open
    /// mode); unset: no limit.
    #[arg(long, env = "HOLDFAST_RATE_LIMIT_PER_SECOND", global = true)]
    pub rate_limit_per_second: Option<u32>,

    /// Requests a client may send in a burst above the rate; default: the rate.
    #[arg(long, env = "HOLDFAST_RATE_LIMIT_BURST", global = true)]
    pub rate_limit_burst: Option<u32>,

    /// Largest request body accepted, in bytes.
    #[arg(long, env = "HOLDFAST_MAX_BODY_BYTES", default_value_t = 16 * 1024, global = true)]
    pub max_body_bytes: usize,

    /// Largest body of `POST /v1/assets/batch`, in bytes.
    #[arg(long, env = "HOLDFAST_MAX_BATCH_BODY_BYTES", default_value_t = 1024 * 1024, global = true)]
    pub max_batch_body_bytes: usize,

    /// SQLite durability: `full` syncs the disk at every commit, so an
    /// answered write survives power loss; `normal` syncs at checkpoints
    /// only (faster; a power cut may lose the last commits).
    #[arg(
        long,
        env = "HOLDFAST_SQLITE_SYNCHRONOUS",
        value_enum,
        default_value_t = SqliteSynchronous::Full,
        global = true
    )]
    pub sqlite_synchronous: SqliteSynchronous,

    /// PostgreSQL: keep statements prepared on each connection. Set false
    /// when a pooler in transaction mode (PgBouncer) sits between holdfast and
    /// PostgreSQL: each unit of work then runs in a transaction of its own,
    /// with its timeouts set there, and prepares nothing beyond it.
    #[arg(
        long,
        env = "HOLDFAST_DB_PREPARED_STATEMENTS",
        default_value_t = true,
        action = clap::ArgAction::Set,
        global = true
    )]
    pub db_prepared_statements: bool,

    /// PostgreSQL: the URL migrations run through, when not the service's
    /// own (a direct connection to the primary beside a pooler).
    #[arg(long, env = "HOLDFAST_MIGRATION_DATABASE_URL", global = true)]
    pub migration_database_url: Option<String>,

    /// Database connections in the pool.
    #[arg(long, env = "HOLDFAST_DB_POOL_SIZE", default_value_t = 16, global = true)]
    pub db_pool_size: usize,

    /// Longest wait for a pooled connection before answering 503, in milliseconds.
    #[arg(long, env = "HOLDFAST_DB_ACQUIRE_TIMEOUT_MS", default_value_t = 2000, global = true)]
    pub db_acquire_timeout_ms: u64,

    /// Longest a statement may run before it is cancelled (503), in milliseconds.
    #[arg(long, env = "HOLDFAST_DB_STATEMENT_TIMEOUT_MS", default_value_t = 2500, global = true)]
    pub db_statement_timeout_ms: u64,

    /// Longest a statement may wait for a row lock (503), in milliseconds.
    #[arg(long, env = "HOLDFAST_DB_LOCK_TIMEOUT_MS", default_value_t = 1000, global = true)]
    pub db_lock_timeout_ms: u64,

    /// Longest a request's database work may take end to end, even when the
    /// network stalls (503 past it), in milliseconds.
    #[arg(long, env = "HOLDFAST_DB_TIMEOUT_MS", default_value_t = 3000, global = true)]
    pub db_timeout_ms: u64,

    /// On SIGTERM or SIGINT, how long in-flight requests may take to finish.
    #[arg(long, env = "HOLDFAST_SHUTDOWN_GRACE_SECONDS", default_value_t = 30, global = true)]
    pub shutdown_grace_seconds: u64,

    /// HTTP worker threads; 0 means one per CPU core.
    #[arg(long, env = "HOLDFAST_WORKERS", default_value_t = 0, global = true)]
    pub workers: usize,

    /// Log format: compact text or one JSON object per line.
    #[arg(
        long,
        env = "HOLDFAST_LOG_FORMAT",
        value_enum,
        default_value_t = LogFormat::Text,
        global = true
    )]
    pub log_format: LogFormat,
}

/// A setting that cannot work, named so the operator can fix it.
#[derive(Debug, thiserror::Error)]
#[error("invalid setting {setting}: {problem}")]
pub struct ConfigError {
    pub setting: &'static str,
    pub problem: String,
}

fn invalid(setting: &'static str, problem: impl Into<String>) -> ConfigError {
    ConfigError {
        setting,
        problem: problem.into(),
    }
}

impl Config {
    /// The settings a test or an embedding program starts from: every
    /// default as its flag declares it (the environment is not read), with
    /// this database.
    pub fn with_database(url: impl Into<String>) -> Self {
        let flags = Self::augment_args(clap::Command::new("holdfast"))
            .mut_args(|arg| arg.env(None::<&str>));
        let mut config = flags
            .try_get_matches_from(["holdfast"])
            .and_then(|defaults| Self::from_arg_matches(&defaults))
            .expect("every setting has a valid default");
        config.database_url = url.into();
        config
    }

    /// Checks every setting; the first bad one is named in the error.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let database = self.database()?;
        if let Some(url) = &self.migration_database_url {
            match (DatabaseUrl::parse(url), database) {
                (Ok(DatabaseUrl::Postgres(_)), DatabaseUrl::Postgres(_)) => {}
                _ => {
                    return Err(invalid(
                        "HOLDFAST_MIGRATION_DATABASE_URL",
                        "must be a postgres://… URL, beside a PostgreSQL HOLDFAST_DATABASE_URL",
                    ))
                }
            }
        }
        if self.hold_seconds_min < 1 {
            return Err(invalid("HOLDFAST_HOLD_SECONDS_MIN", "must be at least 1"));
        }
        if self.hold_seconds_max < self.hold_seconds_min {
            return Err(invalid(
                "HOLDFAST_HOLD_SECONDS_MAX",
                format!(
                    "must not be below HOLDFAST_HOLD_SECONDS_MIN ({})",
                    self.hold_seconds_min
                ),
            ));
        }
        if self.hold_seconds_max > 86_400 * 7 {
            return Err(invalid(
                "HOLDFAST_HOLD_SECONDS_MAX",
                "must be at most 604800 (a week)",
            ));
        }
        if self.hold_max_total_seconds < self.hold_seconds_max {
            return Err(invalid(
                "HOLDFAST_HOLD_MAX_TOTAL_SECONDS",
                format!(
                    "must not be below HOLDFAST_HOLD_SECONDS_MAX ({})",
                    self.hold_seconds_max
                ),
            ));
        }
        if !(self.hold_seconds_min..=self.hold_seconds_max).contains(&self.hold_seconds) {
            return Err(invalid(
                "HOLDFAST_HOLD_SECONDS",
                format!(
                    "must lie within {}..={}",
                    self.hold_seconds_min, self.hold_seconds_max
                ),
            ));
        }
        if self.janitor_batch < 1 {
            return Err(invalid("HOLDFAST_JANITOR_BATCH", "must be at least 1"));
        }
        if self.idempotency_retention_hours < 1 {
            return Err(invalid(
                "HOLDFAST_IDEMPOTENCY_RETENTION_HOURS",
                "must be at least 1",
            ));
        }
        if let Some(url) = &self.webhook_url {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(invalid(
                    "HOLDFAST_WEBHOOK_URL",
                    "must be an http:// or https:// URL",
                ));
            }
            if self
                .webhook_secret
                .as_ref()
                .is_none_or(|s| s.expose().len() < 16)
            {
                return Err(invalid(
                    "HOLDFAST_WEBHOOK_SECRET",
                    "must be set, at least 16 characters, when HOLDFAST_WEBHOOK_URL is",
                ));
            }
        }
        if self.webhook_max_attempts < 1 {
            return Err(invalid(
                "HOLDFAST_WEBHOOK_MAX_ATTEMPTS",
                "must be at least 1",
            ));
        }
        for (setting, value) in [
            ("HOLDFAST_WEBHOOK_TIMEOUT_MS", self.webhook_timeout_ms),
            ("HOLDFAST_WEBHOOK_RETRY_BASE_MS", self.webhook_retry_base_ms),
            (
                "HOLDFAST_WEBHOOK_RETRY_MAX_SECONDS",
                self.webhook_retry_max_seconds,
            ),
            ("HOLDFAST_DISPATCH_INTERVAL_MS", self.dispatch_interval_ms),
        ] {
            if value == 0 {
                return Err(invalid(setting, "must be at least 1"));
            }
        }
        if self.event_retention_days == Some(0) {
            return Err(invalid(
                "HOLDFAST_EVENT_RETENTION_DAYS",
                "must be at least 1 (or unset to keep events)",
            ));
        }
        if let Some(origins) = self.cors_origins() {
            if let Some(bad) = origins
                .iter()
                .find(|o| !(o.starts_with("http://") || o.starts_with("https://")))
            {
                return Err(invalid(
                    "HOLDFAST_CORS_ORIGINS",
                    format!("{bad:?} is not an http(s) origin"),
                ));
            }
        }
        if self.max_body_bytes < 64 {
            return Err(invalid("HOLDFAST_MAX_BODY_BYTES", "must be at least 64"));
        }
        if self.max_batch_body_bytes < self.max_body_bytes {
            return Err(invalid(
                "HOLDFAST_MAX_BATCH_BODY_BYTES",
                "must be at least HOLDFAST_MAX_BODY_BYTES",
            ));
        }
        if !(1..=86_400).contains(&self.waitlist_hold_seconds) {
            return Err(invalid(
                "HOLDFAST_WAITLIST_HOLD_SECONDS",
                "must be from 1 to 86400",
            ));
        }
        if !(1..=100_000).contains(&self.waitlist_max) {
            return Err(invalid("HOLDFAST_WAITLIST_MAX", "must be from 1 to 100000"));
        }
        if !(1..=366).contains(&self.offer_max_days) {
            return Err(invalid("HOLDFAST_OFFER_MAX_DAYS", "must be from 1 to 366"));
        }
        if self.db_pool_size < 1 {
            return Err(invalid("HOLDFAST_DB_POOL_SIZE", "must be at least 1"));
        }
        for (setting, value) in [
            ("HOLDFAST_DB_ACQUIRE_TIMEOUT_MS", self.db_acquire_timeout_ms),
            (
                "HOLDFAST_DB_STATEMENT_TIMEOUT_MS",
                self.db_statement_timeout_ms,
            ),
            ("HOLDFAST_DB_LOCK_TIMEOUT_MS", self.db_lock_timeout_ms),
            ("HOLDFAST_DB_TIMEOUT_MS", self.db_timeout_ms),
        ] {
            if value == 0 {
                return Err(invalid(setting, "must be at least 1"));
            }
        }
        Ok(())
    }

    pub fn database(&self) -> Result<DatabaseUrl, ConfigError> {
        DatabaseUrl::parse(&self.database_url).map_err(|e| invalid("HOLDFAST_DATABASE_URL", e))
    }

    /// The configured API keys (from the variable and the file together).
    pub fn key_ring(&self) -> Result<KeyRing, ConfigError> {
        let mut text = self
            .api_keys
            .as_ref()
            .map(|s| s.expose().to_owned())
            .unwrap_or_default();
        if let Some(path) = &self.api_keys_file {
            let file = std::fs::read_to_string(path).map_err(|e| {
                invalid(
                    "HOLDFAST_API_KEYS_FILE",
                    format!("cannot read {}: {e}", path.display()),
                )
            })?;
            text.push('\n');
            text.push_str(&file);
        }
        KeyRing::parse(&text).map_err(|e| invalid("HOLDFAST_API_KEYS", e))
    }

    /// Checks the keys against the bind address: without keys the service
    /// runs unauthenticated, which is only allowed on a loopback address.
    pub fn check_access(&self) -> Result<KeyRing, ConfigError> {
        let keys = self.key_ring()?;
        if keys.is_open() && !self.bind.ip().is_loopback() {
            return Err(invalid(
                "HOLDFAST_API_KEYS",
                format!(
                    "no API keys are configured, and {} is not a loopback address: \
                     configure keys (holdfast keys new) or bind to 127.0.0.1",
                    self.bind
                ),
            ));
        }
        Ok(keys)
    }

    pub fn cors_origins(&self) -> Option<Vec<String>> {
        let origins: Vec<String> = self
            .cors_origins
            .as_deref()?
            .split(',')
            .map(str::trim)
            .filter(|o| !o.is_empty())
            .map(str::to_owned)
            .collect();
        (!origins.is_empty()).then_some(origins)
    }

    /// Requests per second and burst, when rate limiting is on.
    pub fn rate_limit(&self) -> Option<(u32, u32)> {
        let rate = self.rate_limit_per_second.filter(|r| *r > 0)?;
        Some((rate, self.rate_limit_burst.unwrap_or(rate).max(1)))
    }

    pub fn max_live_holds(&self) -> Option<i64> {
        (self.max_holds_per_buyer > 0).then_some(i64::from(self.max_holds_per_buyer))
    }

    pub fn hold_bounds(&self) -> HoldBounds {
        HoldBounds {
            default: self.hold_seconds,
            min: self.hold_seconds_min,
            max: self.hold_seconds_max,
        }
    }

    pub fn janitor_interval(&self) -> Option<Duration> {
        (self.janitor_interval_seconds > 0)
            .then(|| Duration::from_secs(self.janitor_interval_seconds))
    }

    /// Opens the configured database (not yet migrated).
    pub async fn open_store(&self) -> crate::store::StoreResult<crate::store::Store> {
        let url = self
            .database()
            .map_err(|e| crate::store::StoreError::Config(e.to_string()))?;
        let rendering = std::sync::Arc::new(crate::reply::Rendering);
        crate::store::Store::open(&url, &self.store_settings(), rendering).await
    }

    pub fn api_settings(&self) -> crate::http::ApiSettings {
        crate::http::ApiSettings {
            hold_bounds: self.hold_bounds(),
            max_body_bytes: self.max_body_bytes,
            max_batch_body_bytes: self.max_batch_body_bytes,
            cors_origins: self.cors_origins(),
        }
    }

    /// Webhook delivery, when a URL is configured.
    pub fn webhook_settings(&self) -> Option<crate::outbox::Settings> {
        Some(crate::outbox::Settings {
            url: self.webhook_url.clone()?,
            secret: self.webhook_secret.clone()?,
            timeout: Duration::from_millis(self.webhook_timeout_ms),
            max_attempts: self.webhook_max_attempts,
            retry_base: Duration::from_millis(self.webhook_retry_base_ms),
            retry_max: Duration::from_secs(self.webhook_retry_max_seconds),
        })
    }

    pub fn store_settings(&self) -> StoreSettings {
        StoreSettings {
            pool_size: self.db_pool_size,
            acquire_timeout: Duration::from_millis(self.db_acquire_timeout_ms),
            statement_timeout: Duration::from_millis(self.db_statement_timeout_ms),
            lock_timeout: Duration::from_millis(self.db_lock_timeout_ms),
            call_timeout: Duration::from_millis(self.db_timeout_ms),
            idempotency_retention: Duration::from_secs(self.idempotency_retention_hours * 3600),
            event_retention: self
                .event_retention_days
                .map(|d| Duration::from_secs(d * 86_400)),
            sweep_batch: self.janitor_batch,
            sqlite_synchronous: self.sqlite_synchronous,
            pg_prepared_statements: self.db_prepared_statements,
            migration_url: self.migration_database_url.clone(),
            policy: Policy {
                max_live_holds: self.max_live_holds(),
                hold_max_total_seconds: self.hold_max_total_seconds,
                accept_late_commits: self.late_commit == LateCommit::AcceptIfFree,
                waitlist_hold_seconds: self.waitlist_hold_seconds,
                waitlist_max: self.waitlist_max,
                offer_max_seconds: self.offer_max_days.saturating_mul(86_400),
                offer_min_seconds: self.hold_seconds_min,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        Config::with_database("sqlite://holdfast.db")
            .validate()
            .unwrap();
    }

    #[test]
    fn bad_settings_are_named() {
        let mut c = Config::with_database("mysql://x");
        assert_eq!(c.validate().unwrap_err().setting, "HOLDFAST_DATABASE_URL");
        c = Config::with_database("sqlite://x.db");
        c.hold_seconds_min = 100;
        c.hold_seconds_max = 50;
        assert_eq!(
            c.validate().unwrap_err().setting,
            "HOLDFAST_HOLD_SECONDS_MAX"
        );
        c = Config::with_database("sqlite://x.db");
        c.hold_seconds = 10;
        assert_eq!(c.validate().unwrap_err().setting, "HOLDFAST_HOLD_SECONDS");
    }

    #[test]
    fn open_mode_only_on_loopback() {
        let mut c = Config::with_database("sqlite://x.db");
        assert!(c.check_access().unwrap().is_open());
        c.bind = "0.0.0.0:8080".parse().unwrap();
        assert_eq!(c.check_access().unwrap_err().setting, "HOLDFAST_API_KEYS");
        c.api_keys = Some(Secret::new(format!("ops:admin:{}", "ab".repeat(32))));
        assert_eq!(c.check_access().unwrap().len(), 1);
    }

    #[test]
    fn database_urls() {
        let c = Config::with_database("postgres://u@h/db");
        assert_eq!(
            c.database().unwrap(),
            DatabaseUrl::Postgres("postgres://u@h/db".into())
        );
        let c = Config::with_database("sqlite://data/h.db");
        assert_eq!(
            c.database().unwrap(),
            DatabaseUrl::Sqlite("data/h.db".into())
        );
    }
}
