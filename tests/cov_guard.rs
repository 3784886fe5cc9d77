//! A guard's slot claim that the store grants while the term ends: the
//! claim is reported as the term having ended, so the program does not
//! do the slot's work outside its term. Real time, on MemStore; every
//! wait is for a condition with a deadline.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Mutex;
use std::thread;
use std::time::Duration;

use leaderelection::{Config, ElectionError, Elector, ErrorKind, MemStore, SlotClaim, Store, StoreError};

mod threaded;
use threaded::{forward_calls, lead, term_ends, timing};

const FIVE: Duration = Duration::from_secs(5);

/// A MemStore whose slot claims, once granted, wait for `go` before they
/// answer, after telling `claimed`.
struct SlowClaims {
    inner: MemStore,
    claimed: Mutex<Sender<()>>,
    go: Mutex<Receiver<()>>,
}

impl Store for SlowClaims {
    forward_calls!(inner => acquire, renew, release, inspect);
    fn claim_slot(
        &self, name: &str, identity: &str, fence: u64, slot: &str, retry_failed: bool, timeout: Duration,
    ) -> Result<SlotClaim, StoreError> {
        let claim = self.inner.claim_slot(name, identity, fence, slot, retry_failed, timeout);
        self.claimed.lock().unwrap().send(()).unwrap();
        self.go.lock().unwrap().recv_timeout(FIVE).expect("the test lets the claim answer");
        claim
    }
}

#[test]
fn a_slot_claim_granted_as_the_term_ends_is_reported_as_the_term_ended() {
    let (claimed_tx, claimed) = channel();
    let (go, go_rx) = channel();
    let inner = MemStore::new();
    let store = SlowClaims { inner: inner.clone(), claimed: Mutex::new(claimed_tx), go: Mutex::new(go_rx) };
    let elector = Elector::start(Config::new(store, "cov-slots").identity("a").timing(timing())).unwrap();
    let guard = lead(&elector);
    let claiming = guard.clone();
    let claim = thread::spawn(move || claiming.claim_slot("2026-12-06T18:00").map(|c| c.is_claimed()));
    claimed.recv_timeout(FIVE).expect("the claim reached the store");
    // The claim is written; before its answer is back the term ends.
    inner.set_failing(Some(ErrorKind::Retryable));
    term_ends(&guard);
    go.send(()).unwrap();
    let result = claim.join().unwrap();
    assert!(matches!(result, Err(ElectionError::NotLeading)), "{result:?}");
    inner.set_failing(None);
    drop(guard);
    elector.shutdown().unwrap();
}
