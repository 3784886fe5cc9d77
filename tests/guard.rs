//! `LeaderGuard` edges a program can hit: waits with a timeout too large for
//! the clock, what its `Debug` shows, and resigning after the elector is gone.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use leaderelection::testing::TestTerm;
use leaderelection::{Config, Elector, MemStore, Timing};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

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
    let store = MemStore::new();
    let timing = Timing {
        lease_duration: ms(1500),
        renew_interval: ms(300),
        retry_period: ms(200),
        operation_timeout: ms(300),
        safety_margin: ms(200),
    };
    let e = Elector::start(Config::new(store.clone(), "jobs").identity("a").timing(timing)).unwrap();
    let guard = e.wait_leader_timeout(Duration::from_secs(5)).expect("leads alone");
    e.shutdown().unwrap();
    assert!(!guard.is_valid(), "shutdown invalidates first");
    assert!(store.peek("jobs").expect("row").expired(), "shutdown released");
    let releases = store.stats().releases;
    guard.resign().expect("nothing left to release is not an error");
    assert_eq!(store.stats().releases, releases, "no second release");
}

#[test]
fn resigning_a_term_that_already_ran_out_is_ok_and_releases_nothing_again() {
    let store = MemStore::new();
    let timing = Timing {
        lease_duration: ms(1500),
        renew_interval: ms(300),
        retry_period: ms(200),
        operation_timeout: ms(300),
        safety_margin: ms(200),
    };
    let e = Elector::start(Config::new(store.clone(), "jobs").identity("a").timing(timing)).unwrap();
    let guard = e.wait_leader_timeout(Duration::from_secs(5)).expect("leads alone");
    store.pause(); // renewals hang: the term runs out at its deadline
    assert!(!guard.wait_lost_timeout(Duration::from_secs(5)).timed_out(), "the term ran out");
    store.resume();
    // The elector gives back the fence it stepped down from (its lease may
    // still be valid on the server); once that release landed, the elector
    // has certainly finished with the term.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while store.stats().releases == 0 {
        assert!(std::time::Instant::now() < deadline, "the expired term was never released");
        thread::sleep(ms(2));
    }
    let releases = store.stats().releases;
    guard.resign().expect("an ended term has nothing to resign");
    assert_eq!(store.stats().releases, releases, "no second release for a term that already ended");
    drop(e);
}
