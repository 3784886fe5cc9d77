//! An elector whose term has ended while the store keeps failing: waiting
//! for leadership with a deadline times out (the ended term is never
//! handed out again) and succeeds once the store answers. Real time on
//! MemStore; every wait is for a condition with a deadline.

use std::time::Duration;

use leaderelection::{ErrorKind, WaitLeaderError};

mod threaded;
use threaded::{alone_until_failing_ends_the_term, lead, ms};

#[test]
fn a_wait_for_leadership_after_the_term_ended_times_out_until_the_store_answers() {
    let (store, a, guard) = alone_until_failing_ends_the_term(ErrorKind::Retryable);
    let fence = guard.fence();
    assert!(!guard.is_valid());
    drop(guard); // an ended term's guard would hold the next term back
    assert_eq!(a.wait_leader_timeout(ms(100)).unwrap_err(), WaitLeaderError::Timeout);
    assert!(!a.is_leader());
    store.set_failing(None);
    let next = lead(&a);
    assert!(next.is_valid() && next.fence() > fence, "{} after {fence}", next.fence());
    drop(next);
    a.shutdown().unwrap();
    assert_eq!(a.wait_leader_timeout(Duration::from_secs(1)).unwrap_err(), WaitLeaderError::Stopped);
}
