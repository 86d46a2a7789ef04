//! The keyed requests this instance is running. A request whose caller and
//! `Idempotency-Key` match one still running waits for it to finish, then
//! runs, and so replays what the first stored; one that outwaits its
//! patience answers 409 `IDEMPOTENCY_KEY_IN_USE`. Two attempts of one
//! request thus never decide side by side here, each on a read the other's
//! write has not reached yet.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;

/// A caller and one of its keys.
type KeyOf = (String, String);

/// The keys of the requests running, each with what its duplicates wait on.
#[derive(Debug, Default, Clone)]
pub struct Running {
    keys: Arc<Mutex<HashMap<KeyOf, Arc<Notify>>>>,
}

/// A duplicate waited as long as it may, and the first still runs.
#[derive(Debug, PartialEq, Eq)]
pub struct InUse;

impl Running {
    /// Marks `client`'s `key` as running, once no request with it runs, for
    /// as long as the returned mark lives; `InUse` when one still runs after
    /// `patience`.
    pub async fn enter(&self, client: &str, key: &str, patience: Duration) -> Result<Mark, InUse> {
        let id = (client.to_owned(), key.to_owned());
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            let first = {
                let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
                match keys.entry(id.clone()) {
                    Entry::Vacant(free) => {
                        free.insert(Arc::new(Notify::new()));
                        return Ok(Mark {
                            running: self.clone(),
                            id: Some(id),
                        });
                    }
                    Entry::Occupied(taken) => taken.get().clone(),
                }
            };
            // Created before the first can leave: its leaving wakes this.
            let finished = first.notified();
            tokio::pin!(finished);
            finished.as_mut().enable();
            if !self.runs(&id, &first) {
                continue;
            }
            metrics::counter!("holdfast_idempotency_waits_total").increment(1);
            if tokio::time::timeout_at(deadline, finished).await.is_err() {
                return Err(InUse);
            }
        }
    }

    /// Whether `first` still marks `id` as running.
    fn runs(&self, id: &KeyOf, first: &Arc<Notify>) -> bool {
        let keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        keys.get(id)
            .is_some_and(|current| Arc::ptr_eq(current, first))
    }
}

/// A key marked as running; dropping it lets the requests waiting on the
/// key go on.
#[derive(Debug)]
pub struct Mark {
    running: Running,
    id: Option<KeyOf>,
}

impl Drop for Mark {
    fn drop(&mut self) {
        let Some(id) = self.id.take() else { return };
        let mut keys = self
            .running
            .keys
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(done) = keys.remove(&id) {
            done.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHORT: Duration = Duration::from_millis(50);

    #[tokio::test]
    async fn a_duplicate_waits_for_the_first_and_then_runs() {
        let running = Running::default();
        let first = running.enter("shop", "k1", SHORT).await.expect("free key");
        let waiting = {
            let running = running.clone();
            tokio::spawn(async move { running.enter("shop", "k1", Duration::from_secs(5)).await })
        };
        tokio::time::sleep(SHORT).await;
        assert!(!waiting.is_finished(), "ran beside the first");
        drop(first);
        let second = waiting.await.expect("joined");
        assert!(second.is_ok(), "did not run after the first left");
    }

    #[tokio::test]
    async fn a_duplicate_that_outwaits_its_patience_is_in_use() {
        let running = Running::default();
        let _first = running.enter("shop", "k1", SHORT).await.expect("free key");
        assert_eq!(running.enter("shop", "k1", SHORT).await.err(), Some(InUse));
    }

    #[tokio::test]
    async fn other_keys_and_other_callers_do_not_wait() {
        let running = Running::default();
        let _first = running.enter("shop", "k1", SHORT).await.expect("free key");
        assert!(running.enter("shop", "k2", SHORT).await.is_ok());
        assert!(running.enter("other", "k1", SHORT).await.is_ok());
    }

    #[tokio::test]
    async fn a_key_left_is_forgotten() {
        let running = Running::default();
        drop(running.enter("shop", "k1", SHORT).await.expect("free key"));
        let keys = running.keys.lock().unwrap_or_else(PoisonError::into_inner);
        assert!(keys.is_empty());
    }
}
