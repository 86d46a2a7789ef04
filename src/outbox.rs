//! Delivery of events to the operator's webhook, at least once, signed.
//!
//! Due events are claimed with `FOR UPDATE SKIP LOCKED` and leased in one
//! short statement that commits before any network call; then each is POSTed.
//! A 2xx marks it delivered; anything else (another status, a redirect,
//! which is never followed, a timeout, a refused connection) schedules a retry with exponential
//! backoff and jitter, until
//! the attempts run out and the event is parked as dead. A dispatcher that
//! dies mid-batch leaves its lease to expire, and the events are sent again.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::future::join_all;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::secret::Secret;
use crate::store::{Delivery, DeliveryResult, Store, StoreResult};
use crate::worker::Worker;

/// Events claimed per batch.
const BATCH: i64 = 64;

/// How delivery is configured.
#[derive(Debug, Clone)]
pub struct Settings {
    pub url: String,
    pub secret: Secret,
    pub timeout: Duration,
    pub max_attempts: i32,
    pub retry_base: Duration,
    pub retry_max: Duration,
}

impl Settings {
    /// A claim outlives every request of its batch, which run concurrently.
    fn lease(&self) -> Duration {
        self.timeout + Duration::from_secs(30)
    }

    /// The wait before attempt `attempt + 1`: base × 2^(attempt − 1), capped,
    /// times a random factor in [0.5, 1) so that retries do not march in step.
    pub fn backoff(&self, attempt: i32) -> Duration {
        let exponent = u32::try_from(attempt.saturating_sub(1))
            .unwrap_or(0)
            .min(30);
        let full = self
            .retry_base
            .saturating_mul(1u32 << exponent)
            .min(self.retry_max);
        full.mul_f64(0.5 + fastrand::f64() / 2.0)
    }
}

/// What one dispatch pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DispatchReport {
    pub delivered: u64,
    pub retrying: u64,
    pub dead: u64,
}

#[derive(Clone)]
pub struct Dispatcher {
    store: Store,
    client: reqwest::Client,
    settings: Settings,
}

impl Dispatcher {
    pub fn new(store: Store, settings: Settings) -> Result<Self, String> {
        // A redirect is not a delivery: a 302 would turn the POST into a GET
        // without the event, and its 2xx would mark the event delivered.
        let client = reqwest::Client::builder()
            .timeout(settings.timeout)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("holdfast/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| format!("cannot build the webhook client: {e}"))?;
        Ok(Self {
            store,
            client,
            settings,
        })
    }

    pub fn start(self, every: Duration) -> Worker {
        Worker::start("dispatcher", every, move |_| {
            let dispatcher = self.clone();
            async move {
                dispatcher
                    .run_once()
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string())
            }
        })
    }

    /// Delivers every due event once (batch after batch), then returns.
    pub async fn run_once(&self) -> StoreResult<DispatchReport> {
        let mut report = DispatchReport::default();
        loop {
            let batch = self
                .store
                .claim_deliveries(BATCH, self.settings.lease())
                .await?;
            let claimed = batch.len() as i64;
            let results = join_all(batch.iter().map(|d| self.deliver(d))).await;
            for (delivery, result) in batch.iter().zip(results) {
                let outcome = match &result {
                    DeliveryResult::Delivered => {
                        report.delivered += 1;
                        "delivered"
                    }
                    DeliveryResult::Failed {
                        retry_in: Some(_), ..
                    } => {
                        report.retrying += 1;
                        "retrying"
                    }
                    DeliveryResult::Failed {
                        retry_in: None,
                        error,
                    } => {
                        report.dead += 1;
                        let (event_id, attempts) = (&delivery.event.id, delivery.attempt);
                        tracing::warn!(%event_id, attempts, %error, "event parked as dead");
                        "dead"
                    }
                };
                crate::telemetry::count("holdfast_webhook_deliveries_total", outcome);
                self.store
                    .finish_delivery(&delivery.event.id, &result)
                    .await?;
            }
            if claimed < BATCH {
                return Ok(report);
            }
        }
    }

    async fn deliver(&self, delivery: &Delivery) -> DeliveryResult {
        let event = &delivery.event;
        let body = serde_json::to_string(event).unwrap_or_default();
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let outcome = self
            .client
            .post(&self.settings.url)
            .header("Content-Type", "application/json")
            .header("Holdfast-Event-Id", &event.id)
            .header(
                "Holdfast-Signature",
                signature(&self.settings.secret, t, &body),
            )
            .body(body)
            .send()
            .await;
        let error = match outcome {
            Ok(response) if response.status().is_success() => return DeliveryResult::Delivered,
            Ok(response) if response.status().is_redirection() => {
                let location = response
                    .headers()
                    .get(reqwest::header::LOCATION)
                    .map(|l| l.to_str().unwrap_or("(not text)").to_owned())
                    .unwrap_or_else(|| "(none)".to_owned());
                tracing::warn!(
                    event_id = %event.id,
                    status = response.status().as_u16(),
                    %location,
                    "the webhook receiver redirected; redirects are not followed"
                );
                format!(
                    "the receiver answered {} with Location {location}; redirects are not followed",
                    response.status()
                )
            }
            Ok(response) => format!("the receiver answered {}", response.status()),
            Err(e) if e.is_timeout() => "the receiver did not answer in time".to_owned(),
            Err(e) if e.is_connect() => "the receiver could not be reached".to_owned(),
            Err(e) => format!("the request failed: {e}"),
        };
        let retry_in = (delivery.attempt < self.settings.max_attempts)
            .then(|| self.settings.backoff(delivery.attempt));
        DeliveryResult::Failed { error, retry_in }
    }
}

/// `t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">`.
pub fn signature(secret: &Secret, t: u64, body: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.expose().as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
    mac.update(t.to_string().as_bytes());
    mac.update(b".");
    mac.update(body.as_bytes());
    let digest = mac.finalize().into_bytes();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("t={t},v1={hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        Settings {
            url: "http://127.0.0.1:9/".into(),
            secret: Secret::new("0123456789abcdef"),
            timeout: Duration::from_secs(5),
            max_attempts: 5,
            retry_base: Duration::from_secs(2),
            retry_max: Duration::from_secs(60),
        }
    }

    #[test]
    fn backoff_doubles_with_jitter_and_caps() {
        let s = settings();
        for _ in 0..100 {
            let first = s.backoff(1);
            assert!(
                first >= Duration::from_secs(1) && first < Duration::from_secs(2),
                "{first:?}"
            );
            let third = s.backoff(3);
            assert!(
                third >= Duration::from_secs(4) && third < Duration::from_secs(8),
                "{third:?}"
            );
            assert!(s.backoff(30) < Duration::from_secs(60));
        }
    }

    #[test]
    fn signature_matches_a_known_vector() {
        // HMAC-SHA256("0123456789abcdef", "1700000000.{}"), computed independently.
        let sig = signature(&Secret::new("0123456789abcdef"), 1_700_000_000, "{}");
        assert_eq!(
            sig,
            "t=1700000000,v1=e4f8e2ecae2295b2ddb2f0b5584c8275e226c0ebe9b3b819e70156bb67122e3e"
        );
    }
}
