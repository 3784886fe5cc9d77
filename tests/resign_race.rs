//! Regression test: a resignation lost to a renewal answer.
//!
//! When the program dropped its last guard while the renewal thread was
//! handling a renewal answer (the answer taken, the deadline not yet
//! extended), the term was recorded as expired locally instead of resigned:
//! no back-off, and the same process led again about 70 µs later, ahead of
//! any follower. DESIGN.md section 5: no new term for two retry periods after
//! a resignation.
//!
//! A store wrapper signals the test as a renewal's answer leaves the store,
//! and the test drops its guard at that signal, so the guard's notice lands
//! while the elector is taking the answer. Before the fix the first trial led
//! again 60-120 µs after the drop, in 8 runs of 8 (by the fourth trial).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use leaderelection::{Config, Elector, Lease, MemStore, Store, StoreError, Timing};
use parking_lot::Mutex;

mod forward;
use forward::forward_calls;

const NAME: &str = "resign-race";
const TRIALS: usize = 16;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// 50 + 2*200 + 50 = 500 ms <= 3000 - 1000 ms.
fn timing() -> Timing {
    Timing {
        lease_duration: ms(3000),
        renew_interval: ms(50),
        retry_period: ms(50),
        operation_timeout: ms(200),
        safety_margin: ms(1000),
    }
}

/// A MemStore whose next renewal, once armed, signals as its answer leaves.
#[derive(Clone)]
struct SignalledRenewal {
    inner: MemStore,
    armed: Arc<Mutex<Option<Sender<()>>>>,
}

impl SignalledRenewal {
    /// Arms the next renewal; the receiver fires as it answers.
    fn arm(&self) -> Receiver<()> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        *self.armed.lock() = Some(tx);
        rx
    }
}

impl Store for SignalledRenewal {
    forward_calls!(inner => acquire, release, inspect);

    fn renew(&self, n: &str, id: &str, f: u64, ttl: Duration, p: &[u8], t: Duration) -> Result<Lease, StoreError> {
        let answer = self.inner.renew(n, id, f, ttl, p, t);
        if let Some(answering) = self.armed.lock().take() {
            let _ = answering.send(());
        }
        answer
    }
}

#[test]
fn a_guard_dropped_while_a_renewal_answer_is_handled_still_resigns() {
    let store = SignalledRenewal { inner: MemStore::new(), armed: Arc::default() };
    let elector = Elector::start(Config::new(store.clone(), NAME).identity("a").timing(timing())).unwrap();
    let backoff = timing().retry_period * 2;
    let mut fences = Vec::new();
    for trial in 0..TRIALS {
        let guard = elector.wait_leader_timeout(Duration::from_secs(5)).expect("leads");
        fences.push(guard.fence());
        let answering = store.arm();
        answering.recv_timeout(Duration::from_secs(5)).expect("a renewal within the renew interval");
        // The renewal's answer is on its way to the elector: let go now.
        let dropped_at = Instant::now();
        drop(guard);

        let next = elector.wait_leader_timeout(Duration::from_secs(5)).expect("leads again");
        let gap = dropped_at.elapsed();
        assert!(
            gap >= backoff,
            "trial {trial}: led again {gap:?} after resigning; a resignation waits two retry periods ({backoff:?})"
        );
        // The resignation released the lease: the new term has a new fence.
        assert!(next.fence() > *fences.last().unwrap(), "trial {trial}: fences {fences:?} then {}", next.fence());
        drop(next);
        // That drop resigned too, and releases at once.
        let released = Instant::now() + Duration::from_secs(2);
        while !store.inner.inspect(NAME, ms(100)).unwrap().expired() {
            assert!(Instant::now() < released, "trial {trial}: a resigned term's lease is released at once");
            std::thread::sleep(ms(1));
        }
    }
    elector.shutdown().unwrap();
}

/// The same window for `resign()`: it used to answer `Ok(())` without
/// releasing, reporting or backing off when the renewal answer won the race.
#[test]
fn resign_while_a_renewal_answer_is_handled_still_releases_and_backs_off() {
    let store = SignalledRenewal { inner: MemStore::new(), armed: Arc::default() };
    let elector = Elector::start(Config::new(store.clone(), NAME).identity("a").timing(timing())).unwrap();
    let backoff = timing().retry_period * 2;
    for trial in 0..TRIALS {
        let guard = elector.wait_leader_timeout(Duration::from_secs(5)).expect("leads");
        let fence = guard.fence();
        let answering = store.arm();
        answering.recv_timeout(Duration::from_secs(5)).expect("a renewal within the renew interval");
        let resigned_at = Instant::now();
        guard.resign().unwrap_or_else(|e| panic!("trial {trial}: the release worked: {e}"));
        let lease = store.inner.inspect(NAME, ms(100)).unwrap();
        assert!(lease.expired() && lease.fence == fence, "trial {trial}: released before resign() returned: {lease:?}");
        let next = elector.wait_leader_timeout(Duration::from_secs(5)).expect("leads again");
        let gap = resigned_at.elapsed();
        assert!(gap >= backoff, "trial {trial}: led again {gap:?} after resign(); it waits {backoff:?}");
        assert!(next.fence() > fence);
        next.resign().unwrap();
    }
    elector.shutdown().unwrap();
}
