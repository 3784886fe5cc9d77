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

/// A store whose `inspect` invents a row for an absent election is caught,
/// and `run_all` names the case that failed.
#[test]
fn run_all_names_the_case_that_catches_a_store_inventing_rows() {
    struct Inventive(MemStore);
    impl Store for Inventive {
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
            self.0.renew(n, id, f, ttl, p, t)
        }
        fn release(&self, n: &str, id: &str, f: u64, t: Duration) -> Result<(), leaderelection::StoreError> {
            self.0.release(n, id, f, t)
        }
        fn inspect(&self, n: &str, t: Duration) -> Result<leaderelection::Lease, leaderelection::StoreError> {
            // Claims the row for a ghost instead of reporting it missing.
            match self.0.inspect(n, t) {
                Err(e) if e.is_no_lease() => self.0.acquire(n, "ghost", Duration::from_secs(60), b"", t),
                other => other,
            }
        }
    }
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        storetest::inspect_never_writes(&Inventive(MemStore::new()))
    }));
    let msg = panic_text(r.expect_err("the suite passed an inspect that invents rows"));
    assert!(msg.contains("expected NoLease"), "{msg}");

    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| storetest::run_all(&Inventive(MemStore::new()))));
    let msg = panic_text(r.expect_err("run_all passed an inspect that invents rows"));
    assert!(msg.starts_with("storetest case "), "{msg}");
    let (case, why) = msg["storetest case ".len()..].split_once(" failed: ").expect("names the case and the reason");
    assert!(!case.is_empty() && !why.is_empty(), "{msg}");
}

/// A store whose `inspect` answers NoLease but creates the row on the way is
/// caught: followers must generate no writes.
#[test]
fn the_suite_catches_an_inspect_that_writes() {
    struct Writing(MemStore);
    impl Store for Writing {
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
            self.0.renew(n, id, f, ttl, p, t)
        }
        fn release(&self, n: &str, id: &str, f: u64, t: Duration) -> Result<(), leaderelection::StoreError> {
            self.0.release(n, id, f, t)
        }
        fn inspect(&self, n: &str, t: Duration) -> Result<leaderelection::Lease, leaderelection::StoreError> {
            let seen = self.0.inspect(n, t);
            if matches!(&seen, Err(e) if e.is_no_lease()) {
                self.0.acquire(n, "ghost", Duration::from_secs(60), b"", t)?;
            }
            seen
        }
    }
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        storetest::inspect_never_writes(&Writing(MemStore::new()))
    }));
    let msg = panic_text(r.expect_err("the suite passed an inspect that writes"));
    assert!(msg.contains("inspect must not create the row"), "{msg}");
}

fn panic_text(e: Box<dyn std::any::Any + Send>) -> String {
    e.downcast_ref::<String>()
        .cloned()
        .or_else(|| e.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_default()
}
