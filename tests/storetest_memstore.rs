//! The store acceptance suite against the in-memory reference store.

use std::time::Duration;

use leaderelection::{storetest, MemStore, Store};

leaderelection::storetest_suite!(MemStore::new());

#[test]
fn run_all_passes_with_the_database_clock_days_away() {
    let store = MemStore::new();
    store.set_offset(-4 * 86_400_000_000);
    storetest::run_all(&store);
}

#[test]
fn the_suite_does_not_write_when_it_only_inspects() {
    let store = MemStore::new();
    storetest::inspect_never_writes(&store);
    // One acquire wrote; twenty-odd inspects did not.
    let stats = store.stats();
    assert_eq!(stats.writes, 1, "{stats:?}");
    assert!(stats.inspects >= 20, "{stats:?}");
}

/// The suite must be able to fail: a store that hands every caller the
/// lease (no mutual exclusion) is caught.
#[test]
fn the_suite_catches_a_store_without_mutual_exclusion() {
    struct Everyone(MemStore);
    impl Store for Everyone {
        fn acquire(
            &self,
            n: &str,
            id: &str,
            ttl: Duration,
            p: &[u8],
            t: Duration,
        ) -> Result<leaderelection::Lease, leaderelection::StoreError> {
            let mut l = self.0.acquire(n, id, ttl, p, t)?;
            l.holder = id.to_owned();
            Ok(l)
        }
        fn renew(
            &self,
            n: &str,
            id: &str,
            f: u64,
            ttl: Duration,
            p: &[u8],
            t: Duration,
        ) -> Result<leaderelection::Lease, leaderelection::StoreError> {
            self.0.renew(n, id, f, ttl, p, t)
        }
        fn release(&self, n: &str, id: &str, f: u64, t: Duration) -> Result<(), leaderelection::StoreError> {
            self.0.release(n, id, f, t)
        }
        fn inspect(&self, n: &str, t: Duration) -> Result<leaderelection::Lease, leaderelection::StoreError> {
            self.0.inspect(n, t)
        }
    }
    let bad = Everyone(MemStore::new());
    let r =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| storetest::concurrent_acquire_exactly_one_wins(&bad)));
    assert!(r.is_err(), "the suite passed a store where everyone wins");
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| storetest::loser_leaves_the_row_untouched(&bad)));
    assert!(r.is_err(), "the suite passed a store where the loser is told it won");
}

/// A renew that succeeds without the guard is caught.
#[test]
fn the_suite_catches_an_unguarded_renew() {
    struct Sloppy(MemStore);
    impl Store for Sloppy {
        fn acquire(
            &self,
            n: &str,
            id: &str,
            ttl: Duration,
            p: &[u8],
            t: Duration,
        ) -> Result<leaderelection::Lease, leaderelection::StoreError> {
            self.0.acquire(n, id, ttl, p, t)
        }
        fn renew(
            &self,
            n: &str,
            id: &str,
            f: u64,
            ttl: Duration,
            p: &[u8],
            t: Duration,
        ) -> Result<leaderelection::Lease, leaderelection::StoreError> {
            match self.0.renew(n, id, f, ttl, p, t) {
                Err(e) if e.is_lease_lost() => self.0.inspect(n, t),
                other => other,
            }
        }
        fn release(&self, n: &str, id: &str, f: u64, t: Duration) -> Result<(), leaderelection::StoreError> {
            self.0.release(n, id, f, t)
        }
        fn inspect(&self, n: &str, t: Duration) -> Result<leaderelection::Lease, leaderelection::StoreError> {
            self.0.inspect(n, t)
        }
    }
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        storetest::renew_is_guarded(&Sloppy(MemStore::new()))
    }));
    assert!(r.is_err(), "the suite passed a renew that succeeds for the wrong caller");
}
