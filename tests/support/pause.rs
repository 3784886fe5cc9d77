//! What both freeze suites (tests/postgres_pause.rs, tests/mysql_pause.rs)
//! share: their bounds, the thread count, and the steps of the scenario that
//! do not depend on the server.

use std::fs;
use std::thread;
use std::time::{Duration, Instant};

use leaderelection::{ElectionError, Elector, StoreError};

use super::{wait_for, TIMING};

pub const LEASE: Duration = TIMING.lease_duration;
pub const RENEW: Duration = TIMING.renew_interval;
pub const OP_TIMEOUT: Duration = TIMING.operation_timeout;
pub const MARGIN: Duration = TIMING.safety_margin;

/// How late the watchdog may wake a guard's holders after its deadline.
pub const SLACK: Duration = Duration::from_millis(150);
/// How long the server stays frozen: many operation timeouts.
pub const HOLD: Duration = Duration::from_secs(4);
/// Store-call threads an elector may add while its calls are abandoned
/// (`MAX_CALL_THREADS` = 4 in src/elector.rs, one of them there already).
pub const EXTRA_CALL_THREADS: usize = 3;

/// Threads of this process.
pub fn threads() -> usize {
    fs::read_dir("/proc/self/task").expect("/proc/self/task").count()
}

/// Calls `f` on the frozen server: it must fail (retryably) no sooner than
/// the operation timeout and within `within`.
pub fn fails_in_time<T: std::fmt::Debug>(
    what: &str, within: Duration, f: impl FnOnce() -> Result<T, StoreError>,
) -> Duration {
    let start = Instant::now();
    let r = f();
    let took = start.elapsed();
    eprintln!("pause: {what} on the frozen server returned after {took:?}: {r:?}");
    let err = r.expect_err("a call on a frozen server succeeded");
    assert!(err.is_retryable(), "{what}: a frozen server is a retryable fault: {err:?}");
    assert!(took >= OP_TIMEOUT - Duration::from_millis(50), "{what} gave up before its timeout: {took:?}");
    assert!(took < within, "{what} did not return within its timeout: {took:?}");
    took
}

/// Until [`HOLD`] has passed since `frozen_at`: nobody leads and no elector
/// reports calls piling up; `sample` runs on every round (every 20 ms).
pub fn hold_frozen(frozen_at: Instant, electors: [&Elector; 2], mut sample: impl FnMut()) {
    while frozen_at.elapsed() < HOLD {
        sample();
        for e in electors {
            let st = e.status();
            assert!(!st.is_leader, "{} leads with the server frozen", st.identity);
            assert!(
                !matches!(st.last_error, Some(ElectionError::TooManyHungCalls { .. })),
                "{}: store calls piled up: {:?}",
                st.identity,
                st.last_error
            );
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// Right after the thaw: one of `[leader, follower]` (never both) leads again
/// within a lease and 2 s, on a term whose fence is above `fence`.
pub fn leads_again_after_the_thaw(leader: &Elector, follower: &Elector, fence: u64) {
    let thawed_at = Instant::now();
    let mut new_leader = None;
    let back = wait_for(LEASE + Duration::from_secs(2), || {
        let l: Vec<&Elector> = [leader, follower].into_iter().filter(|e| e.is_leader()).collect();
        assert!(l.len() <= 1, "two leaders at once after the thaw");
        new_leader = l.first().map(|e| (e.identity().to_owned(), e.fence()));
        new_leader.is_some()
    });
    let recovery = thawed_at.elapsed();
    assert!(
        back,
        "nobody leads {recovery:?} after the thaw: leader {:?}, follower {:?}",
        leader.status(),
        follower.status()
    );
    let (who, new_fence) = new_leader.unwrap();
    let new_fence = new_fence.expect("a leader has a fence");
    eprintln!("pause: {who} leads again {recovery:?} after the thaw, fence {fence} -> {new_fence}");
    assert!(new_fence > fence, "a new term after the freeze must have a greater fence: {fence} -> {new_fence}");
}
