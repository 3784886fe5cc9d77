//! `MemStore` as a test double: its clock can be moved on a real-time store,
//! and its `Debug` describes the store without any payload bytes.

use std::time::Duration;

use leaderelection::{MemStore, Store};

const T: Duration = Duration::from_secs(1);

#[test]
fn advancing_a_real_clock_store_ages_its_leases() {
    let store = MemStore::new();
    let lease = store.acquire("jobs", "a", Duration::from_secs(10), b"", T).unwrap();
    assert!(lease.ttl() > Duration::from_secs(9));
    store.advance(Duration::from_secs(4));
    let aged = store.inspect("jobs", T).unwrap().ttl();
    assert!(aged <= Duration::from_secs(6) && aged > Duration::from_secs(5), "{aged:?}");
    store.advance(Duration::from_secs(7));
    let lease = store.inspect("jobs", T).unwrap();
    assert!(lease.expired() && !lease.held_by("a"));
    // Expired on the store's clock: another participant claims the next term.
    let next = store.acquire("jobs", "b", Duration::from_secs(10), b"", T).unwrap();
    assert!(next.held_by("b") && next.fence > lease.fence);
}

#[test]
fn debug_counts_elections_and_calls_and_shows_no_payload() {
    let store = MemStore::new();
    store.acquire("jobs", "a", Duration::from_secs(10), b"secret-address", T).unwrap();
    store.acquire("reports", "a", Duration::from_secs(10), b"", T).unwrap();
    let dbg = format!("{store:?}");
    assert!(dbg.starts_with("MemStore { elections: 2, stats: "), "{dbg}");
    assert!(!dbg.contains("secret"), "{dbg}");
}
