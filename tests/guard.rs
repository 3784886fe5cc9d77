//! `LeaderGuard` edges a program can hit: waits with a timeout too large for
//! the clock, what its `Debug` shows, and resigning after the elector is gone.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use leaderelection::testing::TestTerm;

mod threaded;
use threaded::{alone, eventually, term_ends};

#[test]
fn a_timeout_past_the_clocks_range_waits_for_the_end_instead_of_panicking() {
    let term = TestTerm::new(9);
    let guard = term.guard();
    let ended = Arc::new(AtomicBool::new(false));
    let ender = {
        let (ended, term) = (ended.clone(), term);
        thread::spawn(move || {
            ended.store(true, Ordering::SeqCst);
            term.end();
            term
        })
    };
    // Instant::now() + Duration::MAX overflows: the wait has no limit then.
    let result = guard.wait_lost_timeout(Duration::MAX);
    assert!(!result.timed_out(), "returned because the term ended");
    assert!(ended.load(Ordering::SeqCst), "returned only after the term ended");
    assert!(!guard.is_valid());
    let term = ender.join().unwrap();
    assert!(term.ended() && !term.resigned());
}

#[test]
fn debug_shows_fence_and_validity_only() {
    let term = TestTerm::new(42);
    let guard = term.guard();
    assert_eq!(format!("{guard:?}"), "LeaderGuard { fence: 42, valid: true }");
    term.end();
    assert_eq!(format!("{guard:?}"), "LeaderGuard { fence: 42, valid: false }");
}

#[test]
fn resigning_after_shutdown_is_not_an_error_and_the_lease_is_already_released() {
    let (store, e, guard) = alone();
    e.shutdown().unwrap();
    assert!(!guard.is_valid(), "shutdown invalidates first");
    assert!(store.peek("jobs").expect("row").expired(), "shutdown released");
    let releases = store.stats().releases;
    guard.resign().expect("nothing left to release is not an error");
    assert_eq!(store.stats().releases, releases, "no second release");
}

#[test]
fn resigning_a_term_that_already_ran_out_is_ok_and_releases_nothing_again() {
    let (store, e, guard) = alone();
    store.pause(); // renewals hang: the term runs out at its deadline
    term_ends(&guard);
    store.resume();
    // The elector gives back the fence it stepped down from (its lease may
    // still be valid on the server); once that release landed, the elector
    // has certainly finished with the term.
    assert!(eventually(Duration::from_secs(5), || store.stats().releases > 0), "the expired term was never released");
    let releases = store.stats().releases;
    guard.resign().expect("an ended term has nothing to resign");
    assert_eq!(store.stats().releases, releases, "no second release for a term that already ended");
    drop(e);
}
