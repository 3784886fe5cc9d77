//! The `Store` trait's defaults where the store misbehaves: a heartbeat
//! that panics beside the renewals it was sent with.

use std::time::Duration;

use leaderelection::{BatchItem, Heartbeat, Lease, MemStore, Members, Store, StoreError};

/// A store of someone else's: the four lease calls on a MemStore, and a
/// heartbeat that panics.
struct PanickyBeat(MemStore);

impl Store for PanickyBeat {
    fn acquire(&self, n: &str, id: &str, ttl: Duration, p: &[u8], t: Duration) -> Result<Lease, StoreError> {
        self.0.acquire(n, id, ttl, p, t)
    }
    fn renew(&self, n: &str, id: &str, f: u64, ttl: Duration, p: &[u8], t: Duration) -> Result<Lease, StoreError> {
        self.0.renew(n, id, f, ttl, p, t)
    }
    fn release(&self, n: &str, id: &str, f: u64, t: Duration) -> Result<(), StoreError> {
        self.0.release(n, id, f, t)
    }
    fn inspect(&self, n: &str, t: Duration) -> Result<Lease, StoreError> {
        self.0.inspect(n, t)
    }
    fn heartbeat(&self, _: &str, _: &str, _: u32, _: Duration, _: Duration) -> Result<Members, StoreError> {
        panic!("the heartbeat crashed (on purpose)")
    }
}

/// The renewals are answered as usual; the heartbeat that went with them
/// is a fatal error saying it panicked, not a panic of the caller.
#[test]
fn a_heartbeat_that_panics_beside_renewals_is_a_fatal_answer_and_the_renewals_stand() {
    let s = PanickyBeat(MemStore::new());
    let ttl = Duration::from_secs(15);
    let t = Duration::from_secs(5);
    let held = s.acquire("cov-beat-a", "m", ttl, b"", t).unwrap();
    let items = [
        BatchItem { name: "cov-beat-a", fence: held.fence, payload: b"q" },
        BatchItem { name: "cov-beat-b", fence: 7, payload: b"q" },
    ];
    let beat = Heartbeat { group: "cov-group", leading: 1, ttl };
    let (renewed, members) = s.renew_many_with_heartbeat("m", ttl, &items, beat, t);
    assert_eq!(renewed.len(), 2);
    let first = renewed[0].as_ref().expect("the held lease renews");
    assert!(first.held_by("m") && first.fence == held.fence && first.payload == b"q", "{first:?}");
    assert!(renewed[1].as_ref().is_err_and(|e| e.is_no_lease() || e.is_lease_lost()), "{:?}", renewed[1]);
    let e = members.expect_err("the heartbeat panicked");
    assert!(e.is_fatal(), "{e}");
    assert_eq!(e.message(), "the store's heartbeat panicked");
}
