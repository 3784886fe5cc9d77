//! Helpers for testing code that takes a [`LeaderGuard`], with no store and
//! no thread.
//!
//! ```
//! use leaderelection::testing::{follower_guard, TestTerm};
//! use leaderelection::LeaderGuard;
//!
//! // The code under test: writes only while leading, stamped with the fence.
//! fn tick(guard: &LeaderGuard, log: &mut Vec<u64>) {
//!     if guard.is_valid() {
//!         log.push(guard.fence());
//!     }
//! }
//!
//! let mut log = Vec::new();
//! let term = TestTerm::new(3);
//! let guard = term.guard();
//! tick(&guard, &mut log);          // as leader
//! term.end();                      // leadership lost
//! tick(&guard, &mut log);
//! tick(&follower_guard(), &mut log); // as a follower
//! assert_eq!(log, [3]);
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::guard::{LeaderGuard, TermShared};
use crate::machine::{EndReason, TermId};

/// A term that the test controls: its guards are valid until
/// [`TestTerm::end`], and behave as real ones do (a dropped last guard
/// resigns the term, [`LeaderGuard::resign`] ends it).
pub struct TestTerm {
    term: Arc<TermShared>,
}

impl TestTerm {
    /// A live term with this fence and no deadline.
    pub fn new(fence: u64) -> TestTerm {
        TestTerm::with_deadline(fence, Duration::from_secs(86_400 * 365 * 100))
    }

    /// A live term whose guards turn invalid `valid_for` from now, as if no
    /// renewal arrived (nothing wakes [`LeaderGuard::lost`] at that instant;
    /// [`LeaderGuard::is_valid`] and the waits see it).
    pub fn with_deadline(fence: u64, valid_for: Duration) -> TestTerm {
        let term = TermShared::new(TermId(0), fence, Instant::now(), valid_for, None);
        TestTerm { term: Arc::new(term) }
    }

    /// A guard on this term (invalid if the term has ended).
    pub fn guard(&self) -> LeaderGuard {
        self.term.guard()
    }

    /// Ends the term as a lost lease would: every guard turns invalid and
    /// [`LeaderGuard::lost`] fires.
    pub fn end(&self) {
        let _ = self.term.end(EndReason::LeaseLost);
    }

    /// Whether the code under test resigned: called
    /// [`LeaderGuard::resign`], or dropped the last guard of the live term.
    pub fn resigned(&self) -> bool {
        self.term.was_resigned()
    }

    /// Whether the term has ended, for any reason.
    pub fn ended(&self) -> bool {
        self.term.is_ended()
    }
}

/// A guard that is already invalid: the code under test runs as a follower
/// that somehow holds a stale guard.
pub fn follower_guard() -> LeaderGuard {
    let term = TestTerm::new(0);
    term.end();
    term.guard()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dropping_the_last_guard_resigns_a_live_term() {
        let term = TestTerm::new(5);
        let a = term.guard();
        let b = a.clone();
        drop(a);
        assert!(!term.resigned() && b.is_valid());
        drop(b);
        assert!(term.resigned() && term.ended());
    }

    #[test]
    fn lost_fires_when_the_term_ends() {
        let term = TestTerm::new(1);
        let g = term.guard();
        assert!(g.lost().try_recv().is_err_and(|e| e.is_empty()));
        assert!(g.wait_lost_timeout(Duration::ZERO).timed_out());
        term.end();
        assert!(g.lost().try_recv().is_err_and(|e| e.is_disconnected()));
        assert!(!g.wait_lost_timeout(Duration::from_secs(10)).timed_out());
        assert!(!g.is_valid());
        assert!(!term.resigned(), "a lost term was not resigned");
    }

    #[test]
    fn deadline_invalidates_without_any_thread() {
        let term = TestTerm::with_deadline(2, Duration::ZERO);
        let g = term.guard();
        assert!(!g.is_valid());
        assert!(!g.wait_lost_timeout(Duration::from_secs(10)).timed_out());
    }

    #[test]
    fn resign_ends_the_term() {
        let term = TestTerm::new(9);
        let g = term.guard();
        let other = g.clone();
        g.resign().unwrap();
        assert!(term.resigned() && !other.is_valid());
        assert!(!follower_guard().is_valid());
    }
}
