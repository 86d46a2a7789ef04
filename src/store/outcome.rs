//! What a failed or abandoned store call may have written.
//!
//! Each call runs with a [`Gate`]. A write marks it just before the COMMIT
//! (or a single-statement write) is sent, and again when the database has
//! answered. When the call fails or runs out of time, the gate tells the two
//! cases apart: nothing can have been written ([`WriteOutcome::NotApplied`]),
//! or a COMMIT was sent whose fate is not known ([`WriteOutcome::Unknown`]).
//! A call abandoned at its deadline closes the gate first, so a write still
//! running on a blocking thread (SQLite) rolls back instead of committing.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use diesel::result::Error as DieselError;

use super::error::{refused, Abort};

pub use crate::domain::WriteOutcome;

const IDLE: u8 = 0;
/// A COMMIT (or single-statement write) was sent; no answer yet.
const COMMITTING: u8 = 1;
/// A COMMIT was answered: something was written.
const COMMITTED: u8 = 2;
/// The caller gave up: no COMMIT may be sent any more.
const ABANDONED: u8 = 3;

/// The commit state of one store call.
#[derive(Debug, Default)]
pub struct Gate(AtomicU8);

impl Gate {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Called just before a COMMIT is sent: false when the caller gave up,
    /// and the transaction must roll back instead.
    pub fn open_commit(&self) -> bool {
        let mut state = self.0.load(Ordering::Acquire);
        loop {
            if state == ABANDONED {
                return false;
            }
            match self
                .0
                .compare_exchange(state, COMMITTING, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(now) => state = now,
            }
        }
    }

    /// The database answered the COMMIT: `Ok` when it committed, `Err` with
    /// its error otherwise. A refusal from the server (a constraint, a lock
    /// timeout) leaves the commit known not to have happened; a lost
    /// connection leaves it unknown.
    pub fn close_commit(&self, result: Result<(), &DieselError>, before: WriteOutcome) {
        let state = match result {
            Ok(()) => COMMITTED,
            Err(e) if refused(e) => match before {
                WriteOutcome::NotApplied => IDLE,
                WriteOutcome::Unknown => COMMITTED,
            },
            Err(_) => return,
        };
        let _ = self
            .0
            .compare_exchange(COMMITTING, state, Ordering::AcqRel, Ordering::Acquire);
    }

    /// A write sent on its own ended: what the call has written since.
    fn settle(&self, state: u8) {
        let _ = self
            .0
            .compare_exchange(COMMITTING, state, Ordering::AcqRel, Ordering::Acquire);
    }

    /// A COMMIT, or a write sent on its own, is in flight.
    pub fn in_flight(&self) -> bool {
        self.0.load(Ordering::Acquire) == COMMITTING
    }

    /// What this call may have written so far.
    pub fn outcome(&self) -> WriteOutcome {
        match self.0.load(Ordering::Acquire) {
            IDLE | ABANDONED => WriteOutcome::NotApplied,
            _ => WriteOutcome::Unknown,
        }
    }

    /// The caller gives up (its deadline passed): no COMMIT may start from
    /// now on. What may have been written until then.
    pub fn abandon(&self) -> WriteOutcome {
        match self
            .0
            .compare_exchange(IDLE, ABANDONED, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => WriteOutcome::NotApplied,
            Err(ABANDONED) => WriteOutcome::NotApplied,
            Err(_) => WriteOutcome::Unknown,
        }
    }
}

/// Runs `work`, one write statement sent on its own, which commits as it
/// ends (PostgreSQL), marking the call's gate around it: once it succeeded
/// something may have been written; a statement that wrote nothing
/// ([`Abort::Retry`]) or that the server refused leaves the gate as it was;
/// a connection lost meanwhile leaves its fate unknown.
pub(crate) async fn sent_alone<T>(
    work: impl std::future::Future<Output = Result<T, Abort>>,
) -> Result<T, Abort> {
    let Some(gate) = current() else {
        return work.await;
    };
    let before = gate.outcome();
    if !gate.open_commit() {
        return Err(Abort::Abandoned);
    }
    let result = work.await;
    match &result {
        Ok(_) => gate.settle(COMMITTED),
        Err(Abort::Retry) => gate.settle(state_of(before)),
        Err(Abort::Failed(e)) if e.refused() => gate.settle(state_of(before)),
        Err(_) => {}
    }
    result
}

fn state_of(outcome: WriteOutcome) -> u8 {
    match outcome {
        WriteOutcome::NotApplied => IDLE,
        WriteOutcome::Unknown => COMMITTED,
    }
}

tokio::task_local! {
    /// The gate of the store call running on this task.
    static GATE: Arc<Gate>;
}

/// Runs `call` with `gate` as the current store call's gate.
pub(crate) async fn with_gate<F: std::future::Future>(gate: Arc<Gate>, call: F) -> F::Output {
    GATE.scope(gate, call).await
}

/// The gate of the store call running on this task, if any.
pub(crate) fn current() -> Option<Arc<Gate>> {
    GATE.try_with(Arc::clone).ok()
}

/// Whether the current call may have written something so far (true
/// outside any call, where nothing tells).
pub(crate) fn wrote() -> bool {
    current().is_none_or(|gate| gate.outcome() == WriteOutcome::Unknown)
}

/// Instrumentation of a PostgreSQL connection: it marks the current call's
/// gate around every COMMIT, and tells the pool which statements committed
/// (each COMMIT, and each write sent on its own, which [`sent_alone`] marks
/// on the gate before it is sent). It reads no statement's text.
#[derive(Default)]
pub(crate) struct CommitWatch {
    in_transaction: bool,
    /// What the statement in flight commits, if anything.
    committing: Option<Committing>,
    before: Option<WriteOutcome>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Committing {
    /// A transaction's COMMIT: this watch marks the gate.
    Transaction,
    /// A write sent on its own: [`sent_alone`] marks the gate.
    Alone,
}

impl CommitWatch {
    /// Follows one event; `true` when it is the success of a COMMIT or of a
    /// write sent on its own.
    pub(crate) fn on_event(
        &mut self,
        event: &diesel::connection::InstrumentationEvent<'_>,
    ) -> bool {
        use diesel::connection::InstrumentationEvent as E;
        match event {
            E::BeginTransaction { depth, .. } if depth.get() == 1 => self.in_transaction = true,
            E::RollbackTransaction { depth, .. } if depth.get() == 1 => self.in_transaction = false,
            E::CommitTransaction { depth, .. } if depth.get() == 1 => {
                if let Some(gate) = current() {
                    self.before = Some(gate.outcome());
                    gate.open_commit();
                }
                self.committing = Some(Committing::Transaction);
            }
            E::StartQuery { .. }
                if !self.in_transaction
                    && self.committing.is_none()
                    && current().is_some_and(|gate| gate.in_flight()) =>
            {
                self.committing = Some(Committing::Alone);
            }
            E::FinishQuery { error, .. } if self.committing.is_some() => {
                if self.committing == Some(Committing::Transaction) {
                    if let (Some(gate), Some(before)) = (current(), self.before) {
                        gate.close_commit(error.map_or(Ok(()), Err), before);
                    }
                }
                self.committing = None;
                self.in_transaction = false;
                return error.is_none();
            }
            _ => {}
        }
        false
    }
}

/// Counts every statement a connection sends (each one a round trip), as
/// `holdfast_db_statements_total`.
pub(crate) fn statement_counter(
) -> impl FnMut(diesel::connection::InstrumentationEvent<'_>) + Send + 'static {
    let statements = metrics::counter!("holdfast_db_statements_total");
    move |event| {
        if let diesel::connection::InstrumentationEvent::StartQuery { .. } = event {
            statements.increment(1);
        }
    }
}

/// [`statement_counter`], and the marks of every COMMIT on the gate of the
/// call that sends it (PostgreSQL, where calls run on the request's task);
/// `committed` is called after each one that succeeded.
pub(crate) fn watched_counter(
    mut committed: impl FnMut() + Send + 'static,
) -> impl FnMut(diesel::connection::InstrumentationEvent<'_>) + Send + 'static {
    let mut count = statement_counter();
    let mut watch = CommitWatch::default();
    move |event| {
        if watch.on_event(&event) {
            committed();
        }
        count(event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::error::StoreError;
    use diesel::result::DatabaseErrorKind;

    #[test]
    fn abandoned_before_the_commit_nothing_can_be_written() {
        let gate = Gate::new();
        assert_eq!(gate.abandon(), WriteOutcome::NotApplied);
        assert!(!gate.open_commit(), "no COMMIT after the deadline");
        assert_eq!(gate.outcome(), WriteOutcome::NotApplied);
    }

    #[test]
    fn a_commit_in_flight_is_unknown() {
        let gate = Gate::new();
        assert!(gate.open_commit());
        assert_eq!(gate.abandon(), WriteOutcome::Unknown);
        assert_eq!(gate.outcome(), WriteOutcome::Unknown);
    }

    fn failed(kind: DatabaseErrorKind, message: &str) -> StoreError {
        let error = DieselError::DatabaseError(kind, Box::new(message.to_owned()));
        StoreError::from_diesel("write", error)
    }

    /// What a call has written after `results`, each a write sent on its own.
    async fn after(results: Vec<Result<(), Abort>>) -> WriteOutcome {
        let gate = Gate::new();
        with_gate(gate.clone(), async {
            for result in results {
                let _ = sent_alone(async { result }).await;
            }
        })
        .await;
        gate.outcome()
    }

    #[tokio::test]
    async fn a_write_sent_alone_is_applied_unless_refused_or_moved() {
        let refusal = || {
            failed(
                DatabaseErrorKind::Unknown,
                "canceling statement due to lock timeout",
            )
        };
        let lost = || failed(DatabaseErrorKind::ClosedConnection, "connection closed");
        assert_eq!(after(vec![Ok(())]).await, WriteOutcome::Unknown);
        assert_eq!(
            after(vec![Err(Abort::Retry)]).await,
            WriteOutcome::NotApplied
        );
        assert_eq!(
            after(vec![Err(refusal().into())]).await,
            WriteOutcome::NotApplied
        );
        assert_eq!(after(vec![Err(lost().into())]).await, WriteOutcome::Unknown);
        // What was written before stays written.
        let refused_after_a_write = vec![Ok(()), Err(refusal().into())];
        assert_eq!(after(refused_after_a_write).await, WriteOutcome::Unknown);
        assert_eq!(
            after(vec![Err(Abort::Retry), Ok(())]).await,
            WriteOutcome::Unknown
        );
    }

    #[test]
    fn a_refused_commit_leaves_nothing_written() {
        let gate = Gate::new();
        assert!(gate.open_commit());
        let failed =
            |kind, message: &str| DieselError::DatabaseError(kind, Box::new(message.to_owned()));
        let refusal = failed(
            DatabaseErrorKind::Unknown,
            "canceling statement due to lock timeout",
        );
        gate.close_commit(Err(&refusal), WriteOutcome::NotApplied);
        assert_eq!(gate.outcome(), WriteOutcome::NotApplied);
        // A lost connection during the COMMIT leaves it unknown.
        assert!(gate.open_commit());
        let lost = failed(DatabaseErrorKind::ClosedConnection, "connection closed");
        gate.close_commit(Err(&lost), WriteOutcome::NotApplied);
        assert_eq!(gate.outcome(), WriteOutcome::Unknown);
        // Once something committed, the call has written.
        let gate = Gate::new();
        assert!(gate.open_commit());
        gate.close_commit(Ok(()), WriteOutcome::NotApplied);
        assert_eq!(gate.abandon(), WriteOutcome::Unknown);
    }
}
