//! Helpers the threaded elector tests on `MemStore` share (`elector.rs`,
//! `status.rs`, `metrics.rs`, `callbacks.rs`, `logging.rs`, `hold_back.rs`):
//! short timings, and waits for a condition with a deadline, never a fixed
//! nap. The database suites have their own in `support/`.
#![allow(dead_code)]

use std::thread;
use std::time::{Duration, Instant};

use leaderelection::{Elector, LeaderGuard, Status, Timing};

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Short timings that satisfy the invariant:
/// 300 + 2*300 + 75 = 975 ms <= 1500 - 200 = 1300 ms.
pub fn timing() -> Timing {
    Timing {
        lease_duration: ms(1500),
        renew_interval: ms(300),
        retry_period: ms(200),
        operation_timeout: ms(300),
        safety_margin: ms(200),
    }
}

/// Polls `cond` until it holds or `within` passes; returns whether it held.
pub fn eventually(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(ms(2));
    }
}

/// The guard of `e`'s next term, within 5 s, or a panic naming `e`.
pub fn lead(e: &Elector) -> LeaderGuard {
    e.wait_leader_timeout(Duration::from_secs(5)).unwrap_or_else(|err| panic!("{} never led: {err}", e.identity()))
}

/// Polls `e.status()` until `cond` holds, for at most 5 s; returns the
/// status that satisfied it, or panics with the last one.
pub fn until(e: &Elector, what: &str, cond: impl Fn(&Status) -> bool) -> Status {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let st = e.status();
        if cond(&st) {
            return st;
        }
        assert!(Instant::now() < deadline, "{what}: not within 5 s; {st}; {st:?}");
        thread::sleep(ms(2));
    }
}
