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

use diesel::result::{DatabaseErrorKind, Error as DieselError};

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

    /// A write sent on its own failed while its rows were read: the driver
    /// reports such a statement answered once the server bound it, so the
    /// gate took it as committed. A refusal from the server means that it
    /// wrote nothing, and the call has written what it had `before` it.
    pub fn refused_while_read(&self, error: &DieselError, before: WriteOutcome) {
        if refused(error) && before == WriteOutcome::NotApplied {
            let _ = self
                .0
                .compare_exchange(COMMITTED, IDLE, Ordering::AcqRel, Ordering::Acquire);
        }
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

/// An answer of the server that says the statement did not take effect, as
/// opposed to a connection that went away without an answer.
fn refused(error: &DieselError) -> bool {
    match error {
        DieselError::DatabaseError(kind, info) => {
            !matches!(
                kind,
                DatabaseErrorKind::ClosedConnection | DatabaseErrorKind::UnableToSendCommand
            ) && ![
                "terminating connection",
                "connection closed",
                "connection reset",
            ]
            .iter()
            .any(|m| info.message().contains(m))
        }
        _ => false,
    }
}

/// Sends a write on its own whose rows are read (`load`) with `send`. The
/// driver reports such a statement answered once the server bound it,
/// before it ran, so the gate takes it as committed; an error that comes
/// with its rows is the statement's own, and the gate is told. `send` is
/// called here, after the gate was read: diesel marks a statement started
/// when its query is built, not when it is awaited.
pub(crate) async fn write_alone<T, F>(send: impl FnOnce() -> F) -> Result<T, DieselError>
where
    F: std::future::Future<Output = Result<T, DieselError>>,
{
    let before = current().map(|gate| {
        let before = gate.outcome();
        (gate, before)
    });
    let result = send().await;
    if let (Err(error), Some((gate, before))) = (&result, before) {
        gate.refused_while_read(error, before);
    }
    result
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

/// Instrumentation of a PostgreSQL connection: it marks the current call's
/// gate around every COMMIT and every write sent outside a transaction.
#[derive(Default)]
pub(crate) struct CommitWatch {
    in_transaction: bool,
    /// The statement in flight is a COMMIT or a write outside a transaction.
    committing: bool,
    before: Option<WriteOutcome>,
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
            E::CommitTransaction { depth, .. } if depth.get() == 1 => self.open(),
            E::StartQuery { query, .. } if !self.in_transaction && !self.committing => {
                let mut first = FirstWord::default();
                // Stops formatting after the first word (an Err ends `write!`).
                let _ = std::fmt::Write::write_fmt(&mut first, format_args!("{query}"));
                if writes(&first.0) {
                    self.open();
                }
            }
            E::FinishQuery { error, .. } if self.committing => {
                if let (Some(gate), Some(before)) = (current(), self.before) {
                    gate.close_commit(error.map_or(Ok(()), Err), before);
                }
                self.committing = false;
                self.in_transaction = false;
                return error.is_none();
            }
            _ => {}
        }
        false
    }

    fn open(&mut self) {
        if let Some(gate) = current() {
            self.before = Some(gate.outcome());
            gate.open_commit();
        }
        self.committing = true;
    }
}

/// The first word of a statement's text, read without formatting the rest.
#[derive(Default)]
struct FirstWord(String);

impl std::fmt::Write for FirstWord {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        for c in s.chars() {
            if c.is_whitespace() || c == '(' {
                if !self.0.is_empty() {
                    return Err(std::fmt::Error);
                }
            } else {
                self.0.push(c);
            }
        }
        Ok(())
    }
}

/// Whether a statement sent on its own may write (anything but a read).
fn writes(sql: &str) -> bool {
    let first = sql
        .trim_start()
        .split(|c: char| c.is_whitespace() || c == '(')
        .next()
        .unwrap_or_default()
        .to_ascii_uppercase();
    !matches!(
        first.as_str(),
        "SELECT" | "SET" | "SHOW" | "BEGIN" | "ROLLBACK" | "DISCARD" | ""
    )
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn a_write_refused_while_its_rows_are_read_wrote_nothing() {
        let failed =
            |kind, message: &str| DieselError::DatabaseError(kind, Box::new(message.to_owned()));
        let refusal = failed(
            DatabaseErrorKind::Unknown,
            "canceling statement due to lock timeout",
        );
        let gate = Gate::new();
        assert!(gate.open_commit());
        gate.close_commit(Ok(()), WriteOutcome::NotApplied);
        gate.refused_while_read(&refusal, WriteOutcome::NotApplied);
        assert_eq!(gate.outcome(), WriteOutcome::NotApplied);
        // A connection lost while the rows came leaves it unknown.
        assert!(gate.open_commit());
        gate.close_commit(Ok(()), WriteOutcome::NotApplied);
        let lost = failed(DatabaseErrorKind::ClosedConnection, "connection closed");
        gate.refused_while_read(&lost, WriteOutcome::NotApplied);
        assert_eq!(gate.outcome(), WriteOutcome::Unknown);
        // What committed before it stays written.
        let gate = Gate::new();
        assert!(gate.open_commit());
        gate.close_commit(Ok(()), WriteOutcome::NotApplied);
        assert!(gate.open_commit());
        gate.close_commit(Ok(()), WriteOutcome::Unknown);
        gate.refused_while_read(&refusal, WriteOutcome::Unknown);
        assert_eq!(gate.outcome(), WriteOutcome::Unknown);
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

    #[test]
    fn reads_do_not_open_the_gate() {
        assert!(!writes("SELECT now()"));
        assert!(!writes("  select 1"));
        assert!(!writes("SET LOCAL statement_timeout = 1"));
        assert!(!writes("DISCARD PLANS"));
        assert!(writes("INSERT INTO events VALUES (1)"));
        assert!(writes("WITH live AS (SELECT 1) UPDATE assets SET x = 1"));
        assert!(writes("UPDATE assets SET x = 1"));
        assert!(writes(crate::store::postgres::HOLD_SQL));
    }
}
