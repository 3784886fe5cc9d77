//! PostgreSQL's lease check for a term whose fence PostgreSQL cannot hold:
//! a store of someone else's may hand out fences beyond `i64::MAX` (the
//! `bigint` the lease tables use); checking such a term against
//! PostgreSQL fails fatally instead of comparing a wrapped number. Run
//! with `bash scripts/test.sh` (it exports the DSNs).

mod pg_support;

use std::time::Duration;

use leaderelection::{Config, Elector, Lease, MemStore, Store, StoreError};
use pg_support::{client, DIRECT};

/// Added to every fence MemStore hands out: the fences start past
/// `i64::MAX`.
const OFFSET: u64 = 1 << 63;

/// A MemStore whose fences all lie past `i64::MAX`.
struct HugeFences(MemStore);

fn huge(l: Result<Lease, StoreError>) -> Result<Lease, StoreError> {
    l.map(|l| Lease { fence: l.fence + OFFSET, ..l })
}

impl Store for HugeFences {
    fn acquire(&self, n: &str, id: &str, ttl: Duration, p: &[u8], t: Duration) -> Result<Lease, StoreError> {
        huge(self.0.acquire(n, id, ttl, p, t))
    }
    fn renew(&self, n: &str, id: &str, f: u64, ttl: Duration, p: &[u8], t: Duration) -> Result<Lease, StoreError> {
        huge(self.0.renew(n, id, f - OFFSET, ttl, p, t))
    }
    fn release(&self, n: &str, id: &str, f: u64, t: Duration) -> Result<(), StoreError> {
        self.0.release(n, id, f - OFFSET, t)
    }
    fn inspect(&self, n: &str, t: Duration) -> Result<Lease, StoreError> {
        huge(self.0.inspect(n, t))
    }
}

#[test]
fn a_check_of_a_fence_beyond_bigint_fails_fatally() {
    let s = pg_support::store_on(DIRECT, "le_cov_check");
    let elector = Elector::start(Config::new(HugeFences(MemStore::new()), "cov-huge").identity("a")).unwrap();
    let guard = elector.wait_leader_timeout(Duration::from_secs(5)).expect("leads");
    assert!(guard.fence() > i64::MAX as u64, "{}", guard.fence());
    let mut c = client(DIRECT);
    let mut tx = c.transaction().unwrap();
    let e = s.check_lease(&mut tx, &guard).expect_err("a fence PostgreSQL cannot hold");
    assert!(e.is_fatal(), "{e}");
    assert_eq!(e.message(), "postgres check_lease: fence out of range");
    drop(tx);
    drop(guard);
    elector.shutdown().unwrap();
}
