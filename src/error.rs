//! Errors the elector reports about the election itself.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use crate::store::StoreError;

/// Which store operation an error came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// `Store::inspect`.
    Inspect,
    /// `Store::acquire`.
    Acquire,
    /// `Store::renew`.
    Renew,
    /// `Store::release`.
    Release,
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OpKind::Inspect => "inspect",
            OpKind::Acquire => "acquire",
            OpKind::Renew => "renew",
            OpKind::Release => "release",
        })
    }
}

/// A failure of the election, as [`Status::last_error`](crate::Status)
/// reports it and [`LeaderGuard::resign`](crate::LeaderGuard::resign) returns
/// it.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum ElectionError {
    /// A store call failed.
    Store {
        /// The operation.
        op: OpKind,
        /// What the store said.
        error: StoreError,
    },
    /// A store call gave no answer within the operation timeout; its outcome
    /// is unknown.
    Timeout {
        /// The operation.
        op: OpKind,
        /// The timeout that ran out.
        after: Duration,
    },
    /// The leader stepped down because no renewal confirmed its lease before
    /// the local deadline. Nobody may have taken the lease; this process just
    /// ran out of evidence that it still held it. `cause` is the last failure
    /// before the deadline, if any (kept as `source()` too).
    LeaseExpiredLocally {
        /// The failure that kept the renewals from landing.
        cause: Option<Box<ElectionError>>,
    },
    /// Too many earlier store calls are still hung, so no new one was started.
    TooManyHungCalls {
        /// How many are hung.
        hung: usize,
    },
    /// The elector has stopped.
    Stopped,
}

impl ElectionError {
    pub(crate) fn store(op: OpKind, error: StoreError) -> ElectionError {
        ElectionError::Store { op, error }
    }

    /// The failure needs a person (a fatal store error): nobody leads through
    /// this store until it is fixed.
    pub fn is_fatal(&self) -> bool {
        matches!(self, ElectionError::Store { error, .. } if error.is_fatal())
    }

    /// The store error behind this one, if any.
    pub fn store_error(&self) -> Option<&StoreError> {
        match self {
            ElectionError::Store { error, .. } => Some(error),
            _ => None,
        }
    }
}

impl fmt::Display for ElectionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ElectionError::Store { op, error } => write!(f, "{op} failed: {error}"),
            ElectionError::Timeout { op, after } => write!(f, "{op} gave no answer within {after:?}"),
            ElectionError::LeaseExpiredLocally { cause: None } => {
                f.write_str("lease expired locally before a renewal confirmed it")
            }
            ElectionError::LeaseExpiredLocally { cause: Some(cause) } => {
                write!(f, "lease expired locally before a renewal confirmed it: {cause}")
            }
            ElectionError::TooManyHungCalls { hung } => {
                write!(f, "{hung} store calls are still hung; not starting another")
            }
            ElectionError::Stopped => f.write_str("elector stopped"),
        }
    }
}

impl StdError for ElectionError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            ElectionError::Store { error, .. } => Some(error),
            ElectionError::LeaseExpiredLocally { cause: Some(cause) } => Some(&**cause),
            _ => None,
        }
    }
}
