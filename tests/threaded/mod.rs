//! Helpers the threaded elector tests on `MemStore` share (`elector.rs`,
//! `status.rs`, `guard.rs`, `metrics.rs`, `callbacks.rs`, `logging.rs`, `hold_back.rs`):
//! short timings, and waits for a condition with a deadline, never a fixed
//! nap. The database suites have their own in `support/`.
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

#[path = "../forward/mod.rs"]
mod forward;
#[path = "../support/poll.rs"]
mod poll;
pub(crate) use forward::forward_calls;
use leaderelection::{Config, Elector, ErrorKind, LeaderGuard, Lease, MemStore, Status, Store, StoreError, Timing};

/// The election of `elector.rs`, `status.rs` and `guard.rs`.
pub const NAME: &str = "jobs";

/// An elector for `id` in [`NAME`] on `store`, with [`timing`].
pub fn start(store: &MemStore, id: &str) -> Elector {
    Elector::start(Config::new(store.clone(), NAME).identity(id).timing(timing())).expect("valid config")
}

/// A fresh store with `a` leading alone in [`NAME`]: the store, the
/// elector and the guard of its first term.
pub fn alone() -> (MemStore, Elector, LeaderGuard) {
    let store = MemStore::new();
    let a = start(&store, "a");
    let guard = lead(&a);
    (store, a, guard)
}

/// [`alone`], then the store fails every call with `kind` until the term
/// ends (asserted, within 5 s); it keeps failing on return.
pub fn alone_until_failing_ends_the_term(kind: ErrorKind) -> (MemStore, Elector, LeaderGuard) {
    let (store, a, guard) = alone();
    store.set_failing(Some(kind));
    term_ends(&guard);
    (store, a, guard)
}

/// Asserts that the term of `guard` ends within 5 s.
pub fn term_ends(guard: &LeaderGuard) {
    assert!(!guard.wait_lost_timeout(Duration::from_secs(5)).timed_out(), "the term did not end");
}

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

/// Polls `cond` every 2 ms until it holds or `within` passes; returns
/// whether it held.
pub fn eventually(within: Duration, cond: impl FnMut() -> bool) -> bool {
    poll::poll_until(within, ms(2), cond)
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

/// A store of someone else's on a [`MemStore`]: it implements only the
/// four lease calls (as every store did before slots and batches), each
/// behind a path that takes `delay` (none unless [`LeasesOnly::delayed`]),
/// and counts the inspections it answered.
pub struct LeasesOnly(pub MemStore, pub Arc<AtomicUsize>, Duration);

impl LeasesOnly {
    pub fn new(store: MemStore) -> LeasesOnly {
        LeasesOnly(store, Arc::new(AtomicUsize::new(0)), Duration::ZERO)
    }

    /// The same, every call taking `delay` before it reaches the store.
    pub fn delayed(store: MemStore, delay: Duration) -> LeasesOnly {
        LeasesOnly(store, Arc::new(AtomicUsize::new(0)), delay)
    }

    /// Every call goes through here, taking the path's `delay`.
    fn path<T>(&self, _call: &str, _timeout: Duration, f: impl FnOnce() -> T) -> T {
        if !self.2.is_zero() {
            thread::sleep(self.2); // the path's latency, not a wait for an outcome
        }
        f()
    }
}

impl Store for LeasesOnly {
    forward_calls!(0 via Self::path => acquire, renew, release);
    fn inspect(&self, n: &str, t: Duration) -> Result<Lease, StoreError> {
        self.1.fetch_add(1, Ordering::SeqCst);
        self.path("inspect", t, || self.0.inspect(n, t))
    }
}
