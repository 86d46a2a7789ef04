//! Coalesced reads: concurrent callers of the same read share one statement.
//!
//! A caller queues its input and waits. While fewer than `max_batches`
//! statements are running, a new batch is started at once, so a lone caller
//! waits for nothing but its own statement; under load, the callers that
//! arrive while a statement runs are answered together by the next one.
//!
//! Every answer is read by a statement that starts after its caller asked,
//! so it is exactly what a statement of that caller's own would have read at
//! that instant: no answer is ever older than the request it answers.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::oneshot;

use super::{StoreError, StoreResult};

type Waiter<O> = oneshot::Sender<StoreResult<O>>;
type BatchFuture<O> = Pin<Box<dyn Future<Output = StoreResult<Vec<O>>> + Send>>;
type Runner<I, O> = dyn Fn(Vec<I>) -> BatchFuture<O> + Send + Sync;

pub(crate) struct Coalescer<I, O> {
    /// What the batch statement is for, in errors ("read the asset to hold").
    context: &'static str,
    max_batches: usize,
    max_size: usize,
    run: Box<Runner<I, O>>,
    state: Mutex<State<I, O>>,
}

struct State<I, O> {
    queued: Vec<(I, Waiter<O>)>,
    running: usize,
}

impl<I: Send + 'static, O: Send + 'static> Coalescer<I, O> {
    /// `run` answers a batch with one output per input, in input order.
    pub(crate) fn new(
        context: &'static str,
        max_batches: usize,
        max_size: usize,
        run: impl Fn(Vec<I>) -> BatchFuture<O> + Send + Sync + 'static,
    ) -> Arc<Self> {
        Arc::new(Self {
            context,
            max_batches: max_batches.max(1),
            max_size: max_size.max(1),
            run: Box::new(run),
            state: Mutex::new(State {
                queued: Vec::new(),
                running: 0,
            }),
        })
    }

    pub(crate) async fn call(self: &Arc<Self>, input: I) -> StoreResult<O> {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut state = self.lock();
            state.queued.push((input, tx));
            let start = state.running < self.max_batches;
            if start {
                state.running += 1;
            }
            start
        };
        if start {
            tokio::spawn(Arc::clone(self).drain());
        }
        // A dropped waiter means the batch task was cancelled (shutdown).
        rx.await.unwrap_or_else(|_| {
            Err(StoreError::unavailable(
                self.context,
                "the read was cancelled",
            ))
        })
    }

    /// Runs batches until nothing is queued.
    async fn drain(self: Arc<Self>) {
        // Counts this task out however it ends, even when its runtime drops
        // it mid-batch: the next caller then starts a batch of its own.
        let mut running = Running {
            coalescer: &self,
            counted: true,
        };
        loop {
            let batch = {
                let mut state = self.lock();
                if state.queued.is_empty() {
                    // Under the same lock as the check, so that a caller
                    // queueing right now sees a free slot and starts a batch.
                    state.running -= 1;
                    running.counted = false;
                    return;
                }
                let take = state.queued.len().min(self.max_size);
                state.queued.drain(..take).collect::<Vec<_>>()
            };
            self.answer(batch).await;
        }
    }

    async fn answer(&self, batch: Vec<(I, Waiter<O>)>) {
        let (inputs, waiters): (Vec<I>, Vec<Waiter<O>>) = batch.into_iter().unzip();
        let expected = waiters.len();
        match (self.run)(inputs).await {
            Ok(outputs) if outputs.len() == expected => {
                for (waiter, output) in waiters.into_iter().zip(outputs) {
                    // The caller may have given up (timeout); nothing to do.
                    let _ = waiter.send(Ok(output));
                }
            }
            Ok(outputs) => {
                let reason = format!("{} answers for {expected} requests", outputs.len());
                for waiter in waiters {
                    let _ = waiter.send(Err(StoreError::Corrupt(reason.clone())));
                }
            }
            Err(e) => {
                for waiter in waiters {
                    let _ = waiter.send(Err(e.duplicate()));
                }
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<I, O>> {
        // The state is a queue and a counter, consistent after any panic.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

struct Running<'a, I, O> {
    coalescer: &'a Coalescer<I, O>,
    counted: bool,
}

impl<I, O> Drop for Running<'_, I, O> {
    fn drop(&mut self) {
        if self.counted {
            let mut state = (self.coalescer.state.lock()).unwrap_or_else(PoisonError::into_inner);
            state.running -= 1;
        }
    }
}
