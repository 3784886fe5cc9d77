//! Errors the elector reports about the election itself.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Which store operation an error came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OpKind {
    /// `Store::inspect`.
    Inspect,
    /// `Store::acquire`.
    Acquire,
    /// `Store::renew`.
    Renew,
    /// `Store::release`.
    Release,
    /// `Store::claim_slot`, from [`LeaderGuard::claim_slot`](crate::LeaderGuard::claim_slot).
    ClaimSlot,
    /// `Store::finish_slot`, from [`LeaderGuard::finish_slot`](crate::LeaderGuard::finish_slot).
    FinishSlot,
    /// A lease check in a transaction of the program's, from
    /// [`LeaderGuard::lease_check`](crate::LeaderGuard::lease_check).
    CheckLease,
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OpKind::Inspect => "inspect",
            OpKind::Acquire => "acquire",
            OpKind::Renew => "renew",
            OpKind::Release => "release",
            OpKind::ClaimSlot => "claim_slot",
            OpKind::FinishSlot => "finish_slot",
            OpKind::CheckLease => "check_lease",
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
    /// The guard's term has ended, so it cannot act for it (claim a slot).
    NotLeading,
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
            ElectionError::Timeout { op, after } => write!(f, "{op} gave no answer within {}", Human(*after)),
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
            ElectionError::NotLeading => f.write_str("the term has ended"),
        }
    }
}

/// An error's text followed by the texts of its causes that say something
/// new: the drivers' top-level phrases are terse ("error performing TLS
/// handshake"), their causes say what the handshake or socket hit.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn chain_text(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    text
}

/// A duration as a person writes it in a message: `30s`, `500ms`, `1.5s`,
/// `2m`, `1h30m`, `250us`.
///
/// Rounded to the millisecond from one second up, to the microsecond from
/// one millisecond up, so a timer's `29.99999993s` reads `30s`; never more
/// than three decimals. From a minute up the parts are days, hours, minutes
/// and seconds, each shown only when not zero (`1m30s`, `7d`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Human(pub(crate) Duration);

impl Human {
    /// A wait measured or derived from a deadline (`deadline - now`), to the
    /// millisecond from one millisecond up, so `499.98ms` left of a 500 ms
    /// timeout reads `500ms`. Configured values keep [`Human`]'s precision.
    pub(crate) fn about(d: Duration) -> Human {
        if d < Duration::from_millis(1) {
            return Human(d);
        }
        let ms = (d.as_nanos() + 500_000) / 1_000_000;
        Human(Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX)))
    }
}

impl fmt::Display for Human {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const US: u128 = 1_000;
        const MS: u128 = 1_000_000;
        const S: u128 = 1_000_000_000;
        let exact = self.0.as_nanos();
        let round = |n: u128, unit: u128| (n + unit / 2) / unit * unit;
        // Round to the precision of the magnitude; rounding can carry into
        // the next magnitude (999.9996ms is 1s), so round again from there.
        let mut n = exact;
        if n >= MS {
            n = round(exact, US);
        }
        if n >= S {
            n = round(exact, MS);
        }
        // Whole units and up to three decimals of the next smaller one.
        let decimal = |f: &mut fmt::Formatter<'_>, n: u128, unit: u128, name: &str| {
            let whole = n / unit;
            let frac = n % unit * 1000 / unit;
            if frac == 0 {
                write!(f, "{whole}{name}")
            } else {
                let digits = format!("{frac:03}");
                write!(f, "{whole}.{}{name}", digits.trim_end_matches('0'))
            }
        };
        if n == 0 {
            return f.write_str("0s");
        }
        if n < US {
            return write!(f, "{n}ns");
        }
        if n < MS {
            return decimal(f, n, US, "us");
        }
        if n < S {
            return decimal(f, n, MS, "ms");
        }
        let secs = n / S;
        let (d, h, m) = (secs / 86_400, secs / 3_600 % 24, secs / 60 % 60);
        for (v, unit) in [(d, "d"), (h, "h"), (m, "m")] {
            if v > 0 {
                write!(f, "{v}{unit}")?;
            }
        }
        let rest = n % (60 * S);
        if rest > 0 || secs < 60 {
            decimal(f, rest, S, "s")?;
        }
        Ok(())
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

/// What went wrong in a store call, for callers that must branch on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// `renew` matched no row: somebody else holds the lease, or it expired.
    LeaseLost,
    /// `inspect` found no row for the election.
    NoLease,
    /// A failure that can fix itself: connection loss, timeout, server
    /// shutdown, read-only transaction, serialization failure, too many
    /// connections, lock not available.
    Retryable,
    /// A failure that needs a person: missing table, insufficient privilege,
    /// bad credentials, a row the store cannot read.
    Fatal,
}

/// An error from a [`Store`](crate::Store) call.
///
/// `Display` is a short lowercase phrase followed by the cause, and the cause
/// is kept as [`std::error::Error::source`]. Stores never put passwords or
/// payload bytes into it.
#[derive(Clone)]
pub struct StoreError {
    kind: ErrorKind,
    message: String,
    source: Option<Arc<dyn StdError + Send + Sync>>,
}

impl StoreError {
    /// The guarded renew matched no row.
    pub fn lease_lost() -> StoreError {
        StoreError { kind: ErrorKind::LeaseLost, message: "lease lost".into(), source: None }
    }

    /// The lease is not held, with why: for checks that find it gone.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    pub(crate) fn lease_lost_because(why: &str) -> StoreError {
        StoreError { kind: ErrorKind::LeaseLost, message: format!("lease lost: {why}"), source: None }
    }

    /// A lease check in the program's transaction found no row: the lease
    /// expired or was taken, on the database's clock.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    pub(crate) fn lease_check_failed() -> StoreError {
        StoreError::lease_lost_because("the lease check found the lease expired or taken on the database")
    }

    /// The election has no row.
    pub fn no_lease(name: &str) -> StoreError {
        StoreError { kind: ErrorKind::NoLease, message: format!("no lease for election {name:?}"), source: None }
    }

    /// A failure that may fix itself, described by `message`.
    pub fn retryable(message: impl Into<String>) -> StoreError {
        StoreError { kind: ErrorKind::Retryable, message: message.into(), source: None }
    }

    /// A failure that needs a person, described by `message`.
    pub fn fatal(message: impl Into<String>) -> StoreError {
        StoreError { kind: ErrorKind::Fatal, message: message.into(), source: None }
    }

    /// Attaches the underlying error, kept as `source()`.
    pub fn with_source(mut self, source: impl StdError + Send + Sync + 'static) -> StoreError {
        self.source = Some(Arc::new(source));
        self
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The store's own description, without the cause.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// `renew` found the lease gone.
    pub fn is_lease_lost(&self) -> bool {
        self.kind == ErrorKind::LeaseLost
    }

    /// `inspect` found no row.
    pub fn is_no_lease(&self) -> bool {
        self.kind == ErrorKind::NoLease
    }

    /// The failure may fix itself; the elector keeps trying.
    pub fn is_retryable(&self) -> bool {
        self.kind == ErrorKind::Retryable
    }

    /// The failure needs a person; nobody leads through this store until it
    /// is fixed.
    pub fn is_fatal(&self) -> bool {
        self.kind == ErrorKind::Fatal
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        if let Some(source) = &self.source {
            write!(f, ": {source}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("StoreError");
        d.field("kind", &self.kind).field("message", &self.message);
        if let Some(source) = &self.source {
            d.field("source", &format_args!("{source}"));
        }
        d.finish()
    }
}

impl StdError for StoreError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source.as_ref().map(|s| &**s as &(dyn StdError + 'static))
    }
}

/// Why a wait for leadership returned without a guard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitLeaderError {
    /// The time ran out.
    Timeout,
    /// The elector has shut down.
    Stopped,
}

impl fmt::Display for WaitLeaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WaitLeaderError::Timeout => "timed out waiting for leadership",
            WaitLeaderError::Stopped => "elector stopped while waiting for leadership",
        })
    }
}

impl std::error::Error for WaitLeaderError {}

/// A message built from a driver's parse error with everything from the
/// first mention of `word` on cut off, so a password the driver quoted
/// never reaches a log or an error (belt and braces: the drivers' own
/// messages are redacted before they get here).
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn cut_from(msg: &str, word: &str) -> String {
    match msg.find(word) {
        Some(i) => format!("{}{word} …", &msg[..i]),
        None => msg.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(d: Duration) -> String {
        Human(d).to_string()
    }

    #[test]
    fn durations_read_as_a_person_writes_them() {
        let cases = [
            (Duration::ZERO, "0s"),
            (Duration::from_nanos(1), "1ns"),
            (Duration::from_nanos(999), "999ns"),
            (Duration::from_micros(250), "250us"),
            (Duration::from_nanos(1_500), "1.5us"),
            (Duration::from_nanos(999_999), "999.999us"),
            (Duration::from_millis(500), "500ms"),
            (Duration::from_micros(1_250), "1.25ms"),
            (Duration::from_secs(1), "1s"),
            (Duration::from_millis(1_500), "1.5s"),
            (Duration::from_millis(1_234), "1.234s"),
            (Duration::from_secs(30), "30s"),
            (Duration::from_secs(60), "1m"),
            (Duration::from_secs(90), "1m30s"),
            (Duration::from_millis(100_500), "1m40.5s"),
            (Duration::from_secs(120), "2m"),
            (Duration::from_secs(3_600), "1h"),
            (Duration::from_secs(5_400), "1h30m"),
            (Duration::from_secs(3_605), "1h5s"),
            (Duration::from_secs(7 * 86_400), "7d"),
            (Duration::from_secs(86_400 + 7_200), "1d2h"),
        ];
        for (d, want) in cases {
            assert_eq!(h(d), want, "{d:?}");
        }
    }

    #[test]
    fn timer_noise_is_rounded_away() {
        assert_eq!(h(Duration::from_nanos(29_999_999_930)), "30s");
        assert_eq!(h(Duration::from_nanos(30_000_000_070)), "30s");
        assert_eq!(h(Duration::from_nanos(1_234_567_890)), "1.235s");
        // Rounding that carries into the next magnitude.
        assert_eq!(h(Duration::from_nanos(999_999_600)), "1s");
        assert_eq!(h(Duration::from_nanos(59_999_600_000)), "1m");
        assert_eq!(h(Duration::from_nanos(499_999_900)), "500ms");
        assert_eq!(h(Duration::from_nanos(3_599_999_999_999)), "1h");
    }

    #[test]
    fn waits_read_to_the_millisecond() {
        assert_eq!(Human::about(Duration::from_micros(499_980)).to_string(), "500ms");
        assert_eq!(Human::about(Duration::from_micros(312_456)).to_string(), "312ms");
        assert_eq!(Human::about(Duration::from_micros(250)).to_string(), "250us");
        assert_eq!(Human::about(Duration::from_nanos(5_249_999_000)).to_string(), "5.25s");
        assert!(Human::about(Duration::MAX).to_string().contains('d'));
    }

    #[test]
    fn extremes_do_not_overflow() {
        let s = h(Duration::MAX);
        assert!(s.ends_with('s') && s.contains('d'), "{s}");
        assert_eq!(h(Duration::from_secs(u64::MAX)), format!("{}d7h15s", u64::MAX / 86_400));
    }

    #[test]
    fn timeout_errors_print_human_durations() {
        let e = ElectionError::Timeout { op: OpKind::Renew, after: Duration::from_nanos(2_999_999_990) };
        assert_eq!(e.to_string(), "renew gave no answer within 3s");
    }
}
