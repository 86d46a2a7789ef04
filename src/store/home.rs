//! The runtime a store was opened on, where its background work runs: the
//! coalesced reads' batches, the drivers of PostgreSQL's connections and
//! SQLite's blocking calls. One place for every HTTP worker, instead of each
//! worker's runtime doing it on its own threads.

use std::future::Future;

use tokio::runtime::Handle;
use tokio::task::JoinHandle;

#[derive(Debug, Clone)]
pub(crate) struct Home(Option<Handle>);

impl Home {
    /// The current runtime; without one, each call runs on its caller's.
    pub(crate) fn here() -> Self {
        Self(Handle::try_current().ok())
    }

    pub(crate) fn spawn<F>(&self, task: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match &self.0 {
            Some(home) => home.spawn(task),
            None => tokio::spawn(task),
        }
    }

    pub(crate) fn spawn_blocking<F, R>(&self, call: F) -> JoinHandle<R>
    where
        F: FnOnce() -> R + Send + 'static,
        R: Send + 'static,
    {
        match &self.0 {
            Some(home) => home.spawn_blocking(call),
            None => tokio::task::spawn_blocking(call),
        }
    }
}
