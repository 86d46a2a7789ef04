//! The runtime a store was opened on, where its background work runs: the
//! coalesced reads' batches, the drivers of PostgreSQL's connections and
//! SQLite's blocking calls. One place for every HTTP worker, instead of each
//! worker's runtime doing it on its own threads.

use std::future::Future;

use tokio::runtime::Handle;
use tokio::task::JoinHandle;
use tokio_util::task::AbortOnDropHandle;

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

    /// Runs `task` there for as long as its caller waits: dropping the
    /// returned future (a timeout, a caller gone) drops the task too, as if
    /// it had run in place, instead of leaving it to run on unwatched.
    pub(crate) fn run<F>(&self, task: F) -> AbortOnDropHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        AbortOnDropHandle::new(self.spawn(task))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_run_there_ends_when_its_caller_stops_waiting() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime");
        let home = runtime.block_on(async { Home::here() });
        let (started, is_started) = tokio::sync::oneshot::channel::<()>();
        let (kept, is_dropped) = tokio::sync::oneshot::channel::<()>();
        let waiting = home.run(async move {
            let _kept = kept;
            let _ = started.send(());
            std::future::pending::<()>().await;
        });
        runtime.block_on(async move {
            is_started.await.expect("the task ran");
            drop(waiting);
            // Aborted, the task drops what it held: the sender closes.
            let closed = tokio::time::timeout(std::time::Duration::from_secs(5), is_dropped);
            assert!(
                matches!(closed.await, Ok(Err(_))),
                "the task outlived its caller"
            );
        });
    }

    #[test]
    fn a_task_run_there_answers_its_caller() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .expect("a runtime");
        let home = runtime.block_on(async { Home::here() });
        let answer = runtime.block_on(home.run(async { 42 }));
        assert_eq!(answer.expect("the task ended"), 42);
    }
}
