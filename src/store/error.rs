use diesel::result::{DatabaseErrorKind, Error as DieselError};

use crate::domain::WriteOutcome;

pub type StoreResult<T> = Result<T, StoreError>;

/// Why a store call failed. `Unavailable` means the database could not answer
/// in time or at all (503); `outcome` says whether a COMMIT may have been sent.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database unavailable while trying to {context}: {reason}")]
    Unavailable {
        context: &'static str,
        reason: String,
        outcome: WriteOutcome,
        /// The server answered that the statement did not take effect (a
        /// timeout, a deadlock), as opposed to a connection that went away.
        refused: bool,
    },
    #[error("database error while trying to {context}")]
    Query {
        context: &'static str,
        #[source]
        source: DieselError,
    },
    #[error("invalid database configuration: {0}")]
    Config(String),
    #[error("database migration failed: {0}")]
    Migration(String),
    #[error("stored data is inconsistent: {0}")]
    Corrupt(String),
    /// A batch named existing assets (index, id) with other data; it wrote
    /// nothing. An outcome, taken by the batch's use case.
    #[error("the batch names {} existing assets with other data", .0.len())]
    Conflicts(Vec<(usize, String)>),
}

impl StoreError {
    pub fn is_unavailable(&self) -> bool {
        matches!(self, StoreError::Unavailable { .. })
    }

    /// For a 503: whether the call may have written.
    pub fn write_outcome(&self) -> WriteOutcome {
        match self {
            StoreError::Unavailable { outcome, .. } => *outcome,
            _ => WriteOutcome::NotApplied,
        }
    }

    /// The same error, with what the call may have written.
    pub(crate) fn with_outcome(self, written: WriteOutcome) -> Self {
        match self {
            StoreError::Unavailable {
                context,
                reason,
                refused,
                ..
            } => StoreError::Unavailable {
                context,
                reason,
                outcome: written,
                refused,
            },
            other => other,
        }
    }

    /// `timeout` (a wait ran out), `unavailable` (the database could not be
    /// reached or went away) or `other` (a bug or a broken database).
    pub fn kind(&self) -> &'static str {
        match self {
            StoreError::Unavailable { reason, .. } => {
                let reason = reason.to_ascii_lowercase();
                let waited = ["timeout", "timed out", "canceling statement", "locked"];
                if waited.iter().any(|w| reason.contains(w)) {
                    "timeout"
                } else {
                    "unavailable"
                }
            }
            _ => "other",
        }
    }

    /// The same error for another caller of a shared statement.
    pub(crate) fn duplicate(&self) -> Self {
        match self {
            StoreError::Unavailable {
                context,
                reason,
                outcome,
                refused,
            } => StoreError::Unavailable {
                context,
                reason: reason.clone(),
                outcome: *outcome,
                refused: *refused,
            },
            StoreError::Query { context, source } => StoreError::Query {
                context,
                source: DieselError::QueryBuilderError(source.to_string().into()),
            },
            StoreError::Config(m) => StoreError::Config(m.clone()),
            StoreError::Migration(m) => StoreError::Migration(m.clone()),
            StoreError::Corrupt(m) => StoreError::Corrupt(m.clone()),
            StoreError::Conflicts(c) => StoreError::Conflicts(c.clone()),
        }
    }

    /// The database could not answer; what the call may have written is
    /// filled in by the call's gate.
    pub fn unavailable(context: &'static str, reason: impl ToString) -> Self {
        StoreError::Unavailable {
            context,
            reason: reason.to_string(),
            outcome: WriteOutcome::NotApplied,
            refused: false,
        }
    }

    /// Whether the server answered that what failed did not take effect.
    pub(crate) fn refused(&self) -> bool {
        match self {
            StoreError::Unavailable { refused, .. } => *refused,
            StoreError::Query { source, .. } => refused(source),
            _ => false,
        }
    }

    /// Sorts a driver error into "the database did not answer" (retryable,
    /// 503) and everything else (a bug or a broken database, 500).
    pub fn from_diesel(context: &'static str, error: DieselError) -> Self {
        if is_transient(&error) {
            return StoreError::Unavailable {
                context,
                refused: refused(&error),
                reason: error.to_string(),
                outcome: WriteOutcome::NotApplied,
            };
        }
        if is_pooler_symptom(&error) {
            return StoreError::unavailable(
                context,
                format!(
                    "{error}: a pooler in transaction mode (PgBouncer) seems to sit between \
                     holdfast and PostgreSQL; set HOLDFAST_DB_PREPARED_STATEMENTS=false"
                ),
            );
        }
        StoreError::Query {
            context,
            source: error,
        }
    }
}

/// An answer of the server that says the statement did not take effect, as
/// opposed to a connection that went away without an answer.
pub(crate) fn refused(error: &DieselError) -> bool {
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

/// Messages of server-side cancellations that mean "too slow or going away",
/// on PostgreSQL (statement/lock timeout, deadlock, shutdown) and SQLite (busy).
const TRANSIENT_MESSAGES: &[&str] = &[
    "canceling statement due to",
    "deadlock detected",
    "terminating connection",
    "the database system is",
    "could not serialize access",
    "database is locked",
    "database table is locked",
    "connection closed",
    "connection reset",
];

/// A prepared statement missing on, or already on, the server connection
/// that received it: statements kept prepared across transactions that a
/// pooler in transaction mode handed to different server connections.
fn is_pooler_symptom(error: &DieselError) -> bool {
    match error {
        DieselError::DatabaseError(_, info) => {
            let message = info.message();
            message.starts_with("prepared statement \"")
                && (message.ends_with("does not exist") || message.ends_with("already exists"))
        }
        _ => false,
    }
}

fn is_transient(error: &DieselError) -> bool {
    match error {
        DieselError::DatabaseError(kind, info) => match kind {
            DatabaseErrorKind::UnableToSendCommand
            | DatabaseErrorKind::ClosedConnection
            | DatabaseErrorKind::SerializationFailure => true,
            _ => {
                let message = info.message();
                TRANSIENT_MESSAGES.iter().any(|m| message.contains(m))
            }
        },
        DieselError::BrokenTransactionManager => true,
        _ => false,
    }
}

pub(crate) trait Context<T> {
    fn context(self, context: &'static str) -> Result<T, StoreError>;
}

impl<T> Context<T> for Result<T, DieselError> {
    fn context(self, context: &'static str) -> Result<T, StoreError> {
        self.map_err(|e| StoreError::from_diesel(context, e))
    }
}

/// True when `error` is a unique-constraint violation.
pub(crate) fn is_unique_violation(error: &StoreError) -> bool {
    matches!(
        error,
        StoreError::Query {
            source: DieselError::DatabaseError(DatabaseErrorKind::UniqueViolation, _),
            ..
        }
    )
}

impl From<DieselError> for StoreError {
    fn from(error: DieselError) -> Self {
        StoreError::from_diesel("run a transaction", error)
    }
}

/// How a transaction body ends without committing.
#[derive(Debug)]
pub(crate) enum Abort {
    /// Roll back: the state moved under us; read again and decide again.
    Retry,
    /// Roll back: the caller gave up before the COMMIT.
    Abandoned,
    /// Roll back: a batch named existing assets with other data.
    Conflict(Vec<(usize, String)>),
    Failed(StoreError),
}

impl Abort {
    /// A transaction body that never asks to read again: its error.
    pub(crate) fn into_error(self) -> StoreError {
        match self {
            Abort::Failed(e) => e,
            Abort::Conflict(conflicts) => StoreError::Conflicts(conflicts),
            Abort::Retry => StoreError::unavailable("finish a transaction", "it was rolled back"),
            Abort::Abandoned => StoreError::unavailable(
                "finish a transaction",
                "rolled back: no answer within the request's time (timeout)",
            ),
        }
    }
}

impl From<DieselError> for Abort {
    fn from(error: DieselError) -> Self {
        Abort::Failed(error.into())
    }
}

impl From<StoreError> for Abort {
    fn from(error: StoreError) -> Self {
        Abort::Failed(error)
    }
}
