//! Coalesced reads: concurrent callers of the same read share one statement.
//!
//! A caller queues its input and waits. While fewer than `max_batches`
//! statements are running, a new batch is started at once, so a lone caller
//! waits for nothing but its own statement; under load, the callers that
//! arrive while a statement runs are answered together by the next one.
//!
//! A batch that follows another waits a little for company when few callers
//! are queued as the statement before it ends: under load, every statement
//! costs the database about the same whatever it reads for, and every batch
//! wakes the threads its callers wait on, so fuller batches are what keeps a
//! flash sale cheap. The wait ends as soon as enough callers are queued, and
//! a caller that finds nothing running never waits for it.
//!
//! Every answer is read by a statement that starts after its caller asked,
//! so it is exactly what a statement of that caller's own would have read at
//! that instant: no answer is ever older than the request it answers.
//!
//! Batches run on the runtime the coalescer was made on (the store's, the
//! one the service starts on), not on the HTTP worker whose caller happened
//! to start one: the callers of every worker are answered from one place,
//! which also drives every connection (`postgres::Sessions`), instead of
//! each batch crossing from one worker's thread to another's and back.
//!
//! A batch wakes each caller's thread once, not once per caller: waking a
//! task of another thread is a system call (the thread's event loop is
//! signalled through an eventfd), which cost a flash-sale rejection about as
//! much as its statement. The callers of one batch that wait on the same
//! thread get their answers through the first of them, which hands them out
//! on that thread, where a wake-up is a push on the thread's own run queue.
//! A leader that is gone before it reads its answer (its request timed out)
//! hands them out as it is dropped.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, ThreadId};
use std::time::Duration;

use tokio::sync::{oneshot, Notify};

use super::error::{StoreError, StoreResult};
use super::home::Home;

type Waiter<O> = oneshot::Sender<Answer<O>>;
pub(crate) type BatchFuture<O> = Pin<Box<dyn Future<Output = StoreResult<Vec<O>>> + Send>>;
type Runner<I, O> = dyn Fn(Vec<I>) -> BatchFuture<O> + Send + Sync;

pub(crate) struct Coalescer<I, O> {
    /// What the batch statement is for, in errors ("read the asset to hold").
    context: &'static str,
    max_batches: usize,
    max_size: usize,
    run: Box<Runner<I, O>>,
    gather: Gather,
    state: Mutex<State<I, O>>,
    /// Told when `gather.callers` are queued.
    enough: Notify,
    /// Where batches run.
    home: Home,
}

/// How a batch that follows another waits for company: when fewer than
/// `callers` (but some) are queued as the statement before it ends, it
/// starts once that many are, or after `at_most` (which the runtime's
/// millisecond timer rounds up to its next tick).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Gather {
    pub callers: usize,
    pub at_most: Duration,
}

struct State<I, O> {
    queued: Vec<Queued<I, O>>,
    running: usize,
}

/// A caller's input, where to answer it, and the thread it waits on.
struct Queued<I, O> {
    input: I,
    waiter: Waiter<O>,
    thread: ThreadId,
}

/// What a caller receives: its own answer and, when it leads the callers of
/// a batch that wait on its thread, theirs.
struct Answer<O> {
    own: StoreResult<O>,
    others: Handout<O>,
}

/// An answer and the caller it is for.
type Addressed<O> = (Waiter<O>, StoreResult<O>);

/// The answers a leader carries for the others, handed out when dropped:
/// once the leader has read its own, or with the leader when it is gone.
struct Handout<O>(Vec<Addressed<O>>);

impl<O> Drop for Handout<O> {
    fn drop(&mut self) {
        for (waiter, own) in self.0.drain(..) {
            // The caller may have given up (timeout); nothing to do.
            let _ = waiter.send(Answer {
                own,
                others: Handout(Vec::new()),
            });
        }
    }
}

impl<I: Send + 'static, O: Send + 'static> Coalescer<I, O> {
    /// `run` answers a batch with one output per input, in input order.
    pub(crate) fn new(
        context: &'static str,
        max_batches: usize,
        max_size: usize,
        gather: Gather,
        run: impl Fn(Vec<I>) -> BatchFuture<O> + Send + Sync + 'static,
    ) -> Arc<Self> {
        Arc::new(Self {
            context,
            max_batches: max_batches.max(1),
            max_size: max_size.max(1),
            run: Box::new(run),
            gather,
            state: Mutex::new(State {
                queued: Vec::new(),
                running: 0,
            }),
            enough: Notify::new(),
            home: Home::here(),
        })
    }

    pub(crate) async fn call(self: &Arc<Self>, input: I) -> StoreResult<O> {
        let (tx, rx) = oneshot::channel();
        let (start, enough) = {
            let mut state = self.lock();
            state.queued.push(Queued {
                input,
                waiter: tx,
                thread: thread::current().id(),
            });
            let start = state.running < self.max_batches;
            if start {
                state.running += 1;
            }
            (start, state.queued.len() == self.gather.callers)
        };
        if enough {
            self.enough.notify_one();
        }
        if start {
            // Counted out however the batch task ends, even when it is
            // dropped before it first runs (its runtime shutting down).
            let batches = Self::drain(Running {
                coalescer: Arc::clone(self),
                counted: true,
            });
            drop(self.home.spawn(batches));
        }
        // A dropped waiter means the batch task was cancelled (shutdown).
        // The answers this caller carries for others go out as it returns.
        match rx.await {
            Ok(answer) => answer.own,
            Err(_) => Err(StoreError::unavailable(
                self.context,
                "the read was cancelled",
            )),
        }
    }

    /// Runs batches until nothing is queued, then counts itself out (under
    /// the same lock as the check, so that a caller queueing right now sees
    /// a free slot and starts a batch).
    async fn drain(mut running: Running<I, O>) {
        let this = Arc::clone(&running.coalescer);
        loop {
            let batch = {
                let mut state = this.lock();
                if state.queued.is_empty() {
                    state.running -= 1;
                    running.counted = false;
                    return;
                }
                let take = state.queued.len().min(this.max_size);
                state.queued.drain(..take).collect::<Vec<_>>()
            };
            this.answer(batch).await;
            this.gather().await;
        }
    }

    /// Waits for company for the next batch, when some callers but fewer
    /// than `gather.callers` are queued.
    async fn gather(&self) {
        let queued = self.lock().queued.len();
        if queued == 0 || queued >= self.gather.callers {
            return;
        }
        // A notice given since the check (or left from an earlier batch) ends
        // the wait at once: at worst a batch starts less full.
        let _ = tokio::time::timeout(self.gather.at_most, self.enough.notified()).await;
    }

    async fn answer(&self, batch: Vec<Queued<I, O>>) {
        let mut inputs = Vec::with_capacity(batch.len());
        let mut waiters = Vec::with_capacity(batch.len());
        for queued in batch {
            inputs.push(queued.input);
            waiters.push((queued.waiter, queued.thread));
        }
        let expected = waiters.len();
        let answers: Vec<StoreResult<O>> = match (self.run)(inputs).await {
            Ok(outputs) if outputs.len() == expected => outputs.into_iter().map(Ok).collect(),
            Ok(outputs) => {
                let reason = format!("{} answers for {expected} requests", outputs.len());
                (0..expected)
                    .map(|_| Err(StoreError::Corrupt(reason.clone())))
                    .collect()
            }
            Err(e) => (0..expected).map(|_| Err(e.duplicate())).collect(),
        };
        deliver(waiters.into_iter().zip(answers));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<I, O>> {
        // The state is a queue and a counter, consistent after any panic.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Sends each caller its answer, the callers that wait on one thread
/// through the first of them that still waits.
fn deliver<O>(answers: impl Iterator<Item = ((Waiter<O>, ThreadId), StoreResult<O>)>) {
    let mut threads: Vec<(ThreadId, Vec<Addressed<O>>)> = Vec::new();
    for ((waiter, thread), answer) in answers {
        match threads.iter_mut().find(|(t, _)| *t == thread) {
            Some((_, group)) => group.push((waiter, answer)),
            None => threads.push((thread, vec![(waiter, answer)])),
        }
    }
    for (_, group) in threads {
        let mut group = group.into_iter();
        while let Some((leader, own)) = group.next() {
            let answer = Answer {
                own,
                others: Handout(group.by_ref().collect()),
            };
            // A leader that is gone gives the others back: the next leads.
            if let Err(Answer { mut others, .. }) = leader.send(answer) {
                group = std::mem::take(&mut others.0).into_iter();
            } else {
                break;
            }
        }
    }
}

/// A batch task, counted among the running ones until it ends. One that
/// ends before emptying the queue (dropped by its runtime, maybe before it
/// first ran) leaves nobody waiting for a batch that will not come: when it
/// was the last, the queued callers are told the read was cancelled.
struct Running<I, O> {
    coalescer: Arc<Coalescer<I, O>>,
    counted: bool,
}

impl<I, O> Drop for Running<I, O> {
    fn drop(&mut self) {
        if !self.counted {
            return;
        }
        let mut state = (self.coalescer.state.lock()).unwrap_or_else(PoisonError::into_inner);
        state.running -= 1;
        if state.running == 0 {
            // Dropping a waiter's sender answers it: the read was cancelled.
            state.queued.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn echo(home: &tokio::runtime::Runtime) -> Arc<Coalescer<u32, u32>> {
        home.block_on(async {
            Coalescer::new(
                "echo",
                1,
                4,
                gather(4, Duration::from_millis(1)),
                |inputs: Vec<u32>| -> BatchFuture<u32> {
                    Box::pin(async move { Ok(inputs.into_iter().map(|i| i * 10).collect()) })
                },
            )
        })
    }

    /// How a batch waits for company: for `callers` in all, `at_most` long.
    fn gather(callers: usize, at_most: Duration) -> Gather {
        Gather { callers, at_most }
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_time()
            .build()
            .expect("a runtime")
    }

    /// A coalescer whose batches each wait for a permit of the semaphore,
    /// and the sizes of the batches it ran.
    type Gated = (
        Arc<Coalescer<u32, u32>>,
        Arc<tokio::sync::Semaphore>,
        Arc<Mutex<Vec<usize>>>,
    );

    fn gated(home: &tokio::runtime::Runtime, gather: Gather) -> Gated {
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let (g, s) = (Arc::clone(&gate), Arc::clone(&sizes));
        let coalescer = home.block_on(async {
            Coalescer::new(
                "gated",
                1,
                64,
                gather,
                move |inputs: Vec<u32>| -> BatchFuture<u32> {
                    let (gate, sizes) = (Arc::clone(&g), Arc::clone(&s));
                    Box::pin(async move {
                        gate.acquire().await.expect("the gate").forget();
                        sizes.lock().expect("sizes").push(inputs.len());
                        Ok(inputs.into_iter().map(|i| i * 10).collect())
                    })
                },
            )
        });
        (coalescer, gate, sizes)
    }

    /// Until a batch has taken every queued caller and runs.
    async fn until_taken(coalescer: &Coalescer<u32, u32>) {
        loop {
            {
                let state = coalescer.lock();
                if state.running == 1 && state.queued.is_empty() {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    fn spawn_call(
        coalescer: &Arc<Coalescer<u32, u32>>,
        i: u32,
    ) -> tokio::task::JoinHandle<Option<u32>> {
        let coalescer = Arc::clone(coalescer);
        tokio::spawn(async move { coalescer.call(i).await.ok() })
    }

    /// Two callers: the first one's batch runs (held at the gate) while the
    /// second one queues.
    async fn one_running_one_queued(
        coalescer: &Arc<Coalescer<u32, u32>>,
    ) -> (
        tokio::task::JoinHandle<Option<u32>>,
        tokio::task::JoinHandle<Option<u32>>,
    ) {
        let first = spawn_call(coalescer, 1);
        until_taken(coalescer).await;
        let second = spawn_call(coalescer, 2);
        until_queued(coalescer, 1).await;
        (first, second)
    }

    #[test]
    fn callers_waiting_for_company_are_answered_unavailable_when_the_runtime_goes() {
        let home = runtime();
        let (coalescer, gate, _) = gated(&home, gather(100, Duration::from_secs(60)));
        let callers = runtime();
        let answer = callers.block_on(async {
            let (first, second) = one_running_one_queued(&coalescer).await;
            gate.add_permits(1);
            assert_eq!(first.await.expect("a caller"), Some(10));
            // The batch task now waits for company with the second caller
            // queued; without its runtime, that caller is answered with an
            // error, not left waiting.
            home.shutdown_background();
            tokio::time::timeout(Duration::from_secs(10), second).await
        });
        assert_eq!(answer.expect("answered in time").expect("a caller"), None);
    }

    async fn until_queued(coalescer: &Coalescer<u32, u32>, n: usize) {
        while coalescer.lock().queued.len() < n {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    #[test]
    fn a_batch_after_another_waits_until_enough_callers_are_queued() {
        let home = runtime();
        let (coalescer, gate, sizes) = gated(&home, gather(3, Duration::from_secs(60)));
        let callers = runtime();
        let started = std::time::Instant::now();
        let answers = callers.block_on(async {
            let (first, second) = one_running_one_queued(&coalescer).await;
            gate.add_permits(10);
            // The next batch waits for company: two more callers, later.
            tokio::time::sleep(Duration::from_millis(50)).await;
            let third = spawn_call(&coalescer, 3);
            tokio::time::sleep(Duration::from_millis(10)).await;
            let fourth = spawn_call(&coalescer, 4);
            let mut answers = Vec::new();
            for call in [first, second, third, fourth] {
                let answer = tokio::time::timeout(Duration::from_secs(30), call).await;
                answers.push(answer.expect("answered in time").expect("a caller"));
            }
            answers
        });
        assert_eq!(answers, [Some(10), Some(20), Some(30), Some(40)]);
        assert_eq!(*sizes.lock().expect("sizes"), [1, 3]);
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the third caller should have ended the wait, not the timer"
        );
    }

    #[test]
    fn a_batch_waits_for_company_no_longer_than_at_most_and_a_lone_caller_not_at_all() {
        let home = runtime();
        let gather = gather(100, Duration::from_millis(20));
        let (coalescer, gate, sizes) = gated(&home, gather);
        gate.add_permits(100);
        let callers = runtime();
        callers.block_on(async {
            // Alone, one after another: nothing is queued when a batch ends.
            let lone = std::time::Instant::now();
            for i in 0..20 {
                assert_eq!(coalescer.call(i).await.ok(), Some(i * 10));
            }
            assert!(
                lone.elapsed() < Duration::from_millis(20 * 20),
                "a lone caller waited for company: {:?}",
                lone.elapsed()
            );
        });
        assert_eq!(*sizes.lock().expect("sizes"), [1; 20]);
        // A batch short of company still runs when the wait is over.
        let (coalescer, gate, sizes) = gated(&home, gather);
        let answers = callers.block_on(async {
            let (first, second) = one_running_one_queued(&coalescer).await;
            gate.add_permits(2);
            (
                first.await.expect("a caller"),
                second.await.expect("a caller"),
            )
        });
        assert_eq!(answers, (Some(10), Some(20)));
        assert_eq!(*sizes.lock().expect("sizes"), [1, 1]);
    }

    #[test]
    fn callers_on_another_runtime_get_their_own_answers() {
        let home = runtime();
        let coalescer = echo(&home);
        let callers = runtime();
        let answers = callers.block_on(async {
            let calls = (0..100u32).map(|i| {
                let coalescer = Arc::clone(&coalescer);
                tokio::spawn(async move { (i, coalescer.call(i).await) })
            });
            let mut answers = Vec::new();
            for call in calls {
                answers.push(call.await.expect("a caller"));
            }
            answers
        });
        for (i, answer) in answers {
            assert_eq!(answer.ok(), Some(i * 10));
        }
    }

    #[test]
    fn callers_of_one_thread_are_answered_when_the_first_of_them_is_gone() {
        let home = runtime();
        let (coalescer, gate, sizes) = gated(&home, gather(1, Duration::from_millis(1)));
        let callers = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a runtime");
        let answers = callers.block_on(async {
            // The first batch runs (held at the gate) while three callers of
            // this one thread queue for the next; the first of them leaves.
            let first = spawn_call(&coalescer, 1);
            until_taken(&coalescer).await;
            let gone = spawn_call(&coalescer, 2);
            let rest = [spawn_call(&coalescer, 3), spawn_call(&coalescer, 4)];
            until_queued(&coalescer, 3).await;
            gone.abort();
            assert!(gone.await.is_err(), "the caller was aborted");
            gate.add_permits(2);
            let mut answers = vec![first.await.expect("a caller")];
            for call in rest {
                let answer = tokio::time::timeout(Duration::from_secs(10), call).await;
                answers.push(answer.expect("answered in time").expect("a caller"));
            }
            answers
        });
        assert_eq!(answers, [Some(10), Some(30), Some(40)]);
        assert_eq!(*sizes.lock().expect("sizes"), [1, 3]);
    }

    #[test]
    fn a_failed_batch_answers_every_caller_of_one_thread_with_its_error() {
        let home = runtime();
        let (failing, gate) = home.block_on(async {
            let gate = Arc::new(tokio::sync::Semaphore::new(0));
            let g = Arc::clone(&gate);
            let failing = Coalescer::new(
                "fail",
                1,
                64,
                gather(1, Duration::from_millis(1)),
                move |_: Vec<u32>| -> BatchFuture<u32> {
                    let gate = Arc::clone(&g);
                    Box::pin(async move {
                        gate.acquire().await.expect("the gate").forget();
                        Err(StoreError::unavailable("fail", "the connection was lost"))
                    })
                },
            );
            (failing, gate)
        });
        let callers = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a runtime");
        let answers = callers.block_on(async {
            // One batch running, three callers of this thread queued for
            // the next: both statements fail.
            let first = spawn_failing(&failing, 1);
            while failing.lock().running == 0 || !failing.lock().queued.is_empty() {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let rest: Vec<_> = (2..5).map(|i| spawn_failing(&failing, i)).collect();
            while failing.lock().queued.len() < 3 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            gate.add_permits(2);
            let mut answers = Vec::new();
            for call in std::iter::once(first).chain(rest) {
                let answer = tokio::time::timeout(Duration::from_secs(10), call).await;
                answers.push(answer.expect("answered in time").expect("a caller"));
            }
            answers
        });
        assert_eq!(answers.len(), 4);
        for answer in answers {
            assert!(answer.contains("the connection was lost"), "{answer}");
        }
    }

    /// A caller whose answer is an error, as text.
    fn spawn_failing(
        coalescer: &Arc<Coalescer<u32, u32>>,
        i: u32,
    ) -> tokio::task::JoinHandle<String> {
        let coalescer = Arc::clone(coalescer);
        tokio::spawn(async move {
            match coalescer.call(i).await {
                Ok(value) => format!("answered {value}"),
                Err(e) if e.is_unavailable() => e.to_string(),
                Err(e) => format!("not unavailable: {e}"),
            }
        })
    }

    #[test]
    fn an_answer_dropped_unread_hands_out_those_it_carries() {
        let (tx, rx) = oneshot::channel();
        let answer: Answer<u32> = Answer {
            own: Ok(1),
            others: Handout(vec![(tx, Ok(2))]),
        };
        drop(answer);
        let handed = rx.blocking_recv().expect("an answer");
        assert_eq!(handed.own.ok(), Some(2));
    }

    #[test]
    fn a_batch_whose_runtime_is_gone_answers_unavailable_not_never() {
        let home = runtime();
        let coalescer = echo(&home);
        drop(home);
        let callers = runtime();
        for _ in 0..2 {
            let answer = callers.block_on(async {
                tokio::time::timeout(Duration::from_secs(10), coalescer.call(1)).await
            });
            match answer {
                Ok(Err(e)) => assert!(e.is_unavailable(), "{e}"),
                other => panic!("expected 503-style unavailability, got {other:?}"),
            }
        }
    }
}
