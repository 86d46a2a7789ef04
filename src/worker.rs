//! A background task that runs one pass every interval, and on stop lets the
//! pass in progress finish: a pass that may run long (a janitor's purge)
//! reads [`Running`] between its steps and ends early.

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Whether the worker is still wanted: `false` once it is asked to stop.
#[derive(Clone)]
pub struct Running(watch::Receiver<bool>);

impl Running {
    pub fn going(&self) -> bool {
        !*self.0.borrow()
    }
}

pub struct Worker {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Worker {
    /// Runs `pass` every `every` until stopped. `name` labels its log lines.
    pub fn start<F, Fut>(name: &'static str, every: Duration, mut pass: F) -> Self
    where
        F: FnMut(Running) -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), String>> + Send,
    {
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut ticker = tokio::time::interval(every);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = ticker.tick() => {}
                    _ = stopped.changed() => break,
                }
                if let Err(e) = pass(Running(stopped.clone())).await {
                    tracing::warn!(worker = name, error = %e, "pass failed; retrying next \
                        interval");
                }
            }
        });
        Self { stop, task }
    }

    /// Lets the current pass finish, then ends the task.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}
