//! The keyed requests this instance is running. Requests with the same
//! caller and `Idempotency-Key` run side by side (replays and writes need
//! nothing more: a replay reads the stored answer, a write conflicts on the
//! key), but one about to answer with something that wrote nothing first
//! waits for the attempts of the same request that came before it and still
//! run, then reads again: it replays what they stored instead of refusing on
//! a read their writes had not reached. Only earlier attempts are waited
//! for, so two refusals never wait for each other.
//!
//! A key is known by a hash of caller and key, with keys of the process's
//! own: two requests whose hashes meet only make a refusal wait longer.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;

/// The keys of the requests running, each with the order its attempts came
/// in and what waiting attempts are woken by.
#[derive(Debug, Default, Clone)]
pub struct Running {
    keys: Arc<Mutex<HashMap<u64, Attempts>>>,
    hasher: RandomState,
    next: Arc<AtomicU64>,
}

#[derive(Debug)]
struct Attempts {
    /// The arrival number of each attempt running (one, nearly always).
    running: Vec<u64>,
    /// Notified whenever one of them ends, once an attempt waits.
    ended: Option<Arc<Notify>>,
}

impl Running {
    /// Marks an attempt of `client`'s `key` as running for as long as the
    /// mark lives.
    pub fn enter(&self, client: &str, key: &str) -> Mark {
        let id = self.hasher.hash_one((client, key));
        let arrival = self.next.fetch_add(1, Ordering::Relaxed);
        let mut keys = self.lock();
        let attempts = keys.entry(id).or_insert_with(|| Attempts {
            running: Vec::with_capacity(1),
            ended: None,
        });
        attempts.running.push(arrival);
        Mark {
            running: self.clone(),
            id,
            arrival,
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Attempts>> {
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// An attempt marked as running; dropping it wakes the later attempts that
/// wait for it.
#[derive(Debug)]
pub struct Mark {
    running: Running,
    id: u64,
    arrival: u64,
}

impl Mark {
    /// Whether an attempt of the same request that came before this one
    /// still runs here.
    pub fn behind(&self) -> bool {
        let keys = self.running.lock();
        keys.get(&self.id).is_some_and(|a| self.follows(a))
    }

    /// Waits until no earlier attempt runs: false when one still does after
    /// `patience`.
    pub async fn after_earlier(&self, patience: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            let Some(ended) = self.earlier() else {
                return true;
            };
            let notified = ended.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // One may have ended between the look and `enable`.
            if self.earlier().is_none() {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return false;
            }
        }
    }

    /// What an earlier attempt's end notifies, while one runs.
    fn earlier(&self) -> Option<Arc<Notify>> {
        let mut keys = self.running.lock();
        let attempts = keys.get_mut(&self.id).filter(|a| self.follows(a))?;
        Some(attempts.ended.get_or_insert_with(Default::default).clone())
    }

    /// Whether one of `attempts` came before this one.
    fn follows(&self, attempts: &Attempts) -> bool {
        attempts.running.iter().any(|&a| a < self.arrival)
    }
}

impl Drop for Mark {
    fn drop(&mut self) {
        let mut keys = self.running.lock();
        let Some(attempts) = keys.get_mut(&self.id) else {
            return;
        };
        attempts.running.retain(|&a| a != self.arrival);
        if let Some(ended) = &attempts.ended {
            ended.notify_waiters();
        }
        if attempts.running.is_empty() {
            keys.remove(&self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHORT: Duration = Duration::from_millis(50);

    #[tokio::test]
    async fn a_later_attempt_waits_for_the_earlier_one() {
        let running = Running::default();
        let first = running.enter("shop", "k1");
        let later = running.enter("shop", "k1");
        assert!(later.behind());
        assert!(!first.behind(), "the first waits for nobody");
        let waiting =
            tokio::spawn(async move { later.after_earlier(Duration::from_secs(5)).await });
        tokio::time::sleep(SHORT).await;
        assert!(!waiting.is_finished(), "went on while the first ran");
        drop(first);
        assert!(
            waiting.await.expect("joined"),
            "did not go on after the first ended"
        );
    }

    #[tokio::test]
    async fn an_earlier_attempt_that_outlasts_the_patience_is_told() {
        let running = Running::default();
        let _first = running.enter("shop", "k1");
        let later = running.enter("shop", "k1");
        assert!(!later.after_earlier(SHORT).await);
    }

    #[tokio::test]
    async fn other_keys_and_other_callers_are_not_waited_for() {
        let running = Running::default();
        let _first = running.enter("shop", "k1");
        assert!(!running.enter("shop", "k2").behind());
        assert!(!running.enter("other", "k1").behind());
    }

    #[tokio::test]
    async fn a_key_whose_attempts_ended_is_forgotten() {
        let running = Running::default();
        drop(running.enter("shop", "k1"));
        drop(running.enter("shop", "k1"));
        assert!(running.lock().is_empty());
    }
}
