//! A group whose store fails, on MemStore: failing calls show in the
//! group's status (counted, the last error kept, cleared by the next call
//! that succeeds), terms end at their deadlines and come back when the
//! store does, a failed release is the shutdown's result, and a store that
//! panics is a failed call, not a dead group. Real time, so every wait is
//! for a condition with a deadline, never a fixed nap.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use leaderelection::{
    BatchItem, Config, ElectionError, ErrorKind, Group, GroupConfig, Lease, MemStore, Store, StoreError,
};

mod threaded;
use threaded::{eventually, forward_calls, timing};

const FIVE: Duration = Duration::from_secs(5);

fn config(store: impl Store + 'static, id: &str) -> GroupConfig {
    GroupConfig::new(Config::new(store, "shards").identity(id).timing(timing()))
}

/// Calls that fail are counted and the last error is kept; the terms end
/// (no renewal came back) and the status says so; once the store answers
/// again the error is cleared and every election is led again. A release
/// that fails at shutdown is the shutdown's error.
#[test]
fn a_failing_store_shows_in_the_status_and_a_failed_release_in_the_shutdown() {
    let store = MemStore::new();
    let group = Group::start(config(store.clone(), "a")).unwrap();
    let shards: Vec<_> = (0..3).map(|i| group.join(&format!("shard-{i}")).unwrap()).collect();
    assert!(eventually(FIVE, || shards.iter().all(|e| e.is_leader())), "{:?}", group.status());
    let before = group.status();
    assert!(before.last_error.is_none() && before.calls_failed == 0, "{before:?}");

    store.set_failing(Some(ErrorKind::Retryable));
    assert!(
        eventually(FIVE, || {
            let st = group.status();
            st.calls_failed > 0 && st.last_error.as_ref().is_some_and(|e| e.is_retryable())
        }),
        "{:?}",
        group.status()
    );
    assert!(eventually(FIVE, || shards.iter().all(|e| !e.is_leader())), "terms end at their deadlines");
    // The status counts terms by the state machines, which see the
    // deadline at the next grid instant.
    assert!(eventually(FIVE, || group.status().leading == 0), "{:?}", group.status());

    store.set_failing(None);
    assert!(eventually(FIVE, || shards.iter().all(|e| e.is_leader())), "{:?}", group.status());
    assert!(eventually(FIVE, || group.status().last_error.is_none()), "{:?}", group.status());

    store.set_failing(Some(ErrorKind::Fatal));
    let err = group.shutdown().expect_err("the release failed");
    match &err {
        ElectionError::Store { error, .. } => assert_eq!(error.kind(), ErrorKind::Fatal, "{err}"),
        other => panic!("the shutdown's error: {other:?}"),
    }
    assert_eq!(group.shutdown().map_err(|e| e.to_string()), Err(err.to_string()), "a second shutdown says the same");
    assert!(shards.iter().all(|e| !e.is_leader()));
}

/// A MemStore whose batch calls, heartbeats and leaves panic while `panic`
/// is set.
#[derive(Clone)]
struct Panicky {
    inner: MemStore,
    panic: Arc<AtomicBool>,
}

impl Panicky {
    /// Every call goes through here: a panic while `panic` is set.
    fn checked<T>(&self, _call: &str, _timeout: Duration, f: impl FnOnce() -> T) -> T {
        if self.panic.load(Ordering::SeqCst) {
            panic!("the store panicked (on purpose)");
        }
        f()
    }
}

impl Store for Panicky {
    forward_calls!(inner via Self::checked => acquire, renew, release, inspect, acquire_many, renew_many,
        renew_many_with_heartbeat, release_many, inspect_many, heartbeat, leave_group);
}

/// A store call that panics is a failed call ("store call panicked",
/// fatal) for the group, heartbeat and leave included: the group keeps
/// running, its terms end at their deadlines, and it shuts down with the
/// release's failure as its result, without hanging.
#[test]
fn a_store_that_panics_is_a_failed_call_not_a_dead_group() {
    let store = Panicky { inner: MemStore::new(), panic: Arc::default() };
    let group = Group::start(config(store.clone(), "a").fair_share(true)).unwrap();
    let shards: Vec<_> = (0..3).map(|i| group.join(&format!("shard-{i}")).unwrap()).collect();
    assert!(eventually(FIVE, || shards.iter().all(|e| e.is_leader())), "{:?}", group.status());

    store.panic.store(true, Ordering::SeqCst);
    assert!(
        eventually(FIVE, || {
            let st = group.status();
            st.last_error.as_ref().is_some_and(|e| e.is_fatal() && e.message().contains("store call panicked"))
        }),
        "{:?}",
        group.status()
    );
    assert!(eventually(FIVE, || shards.iter().all(|e| !e.is_leader())), "terms end at their deadlines");
    assert!(!group.status().stopped, "the group runs on");

    let err = group.shutdown().expect_err("the release panicked");
    assert!(err.to_string().contains("store call panicked"), "{err}");
    assert!(group.status().stopped);
}

/// A store whose batches answer fewer items than they were sent, in the
/// claims while `short_claims` is set and always in releases.
struct Short {
    inner: MemStore,
    short_claims: AtomicBool,
}

impl Store for Short {
    forward_calls!(inner => acquire, renew, release, inspect);
    fn acquire_many(
        &self, id: &str, ttl: Duration, items: &[BatchItem<'_>], t: Duration,
    ) -> Vec<Result<Lease, StoreError>> {
        let mut out = self.inner.acquire_many(id, ttl, items, t);
        if self.short_claims.load(Ordering::SeqCst) {
            out.pop();
        }
        out
    }
    fn release_many(&self, id: &str, items: &[BatchItem<'_>], t: Duration) -> Vec<Result<(), StoreError>> {
        let mut out = self.inner.release_many(id, items, t);
        out.pop();
        out
    }
}

/// A store that answers a batch with the wrong number of items is broken:
/// every item of that batch fails, fatally, saying so (no answer is
/// matched to the wrong election), and it shows in the group's status; a
/// short release batch is the shutdown's error.
#[test]
fn a_store_answering_the_wrong_number_of_items_fails_the_whole_batch() {
    let store = Arc::new(Short { inner: MemStore::new(), short_claims: AtomicBool::new(true) });
    let group = Group::start(config(Arc::clone(&store), "a")).unwrap();
    let shards: Vec<_> = (0..3).map(|i| group.join(&format!("shard-{i}")).unwrap()).collect();
    let broken = |e: &StoreError| e.is_fatal() && e.message().contains("a broken store");
    assert!(eventually(FIVE, || group.status().last_error.as_ref().is_some_and(&broken)), "{:?}", group.status());
    assert!(shards.iter().all(|e| !e.is_leader()), "no election leads on a broken answer");

    store.short_claims.store(false, Ordering::SeqCst);
    assert!(eventually(FIVE, || shards.iter().all(|e| e.is_leader())), "{:?}", group.status());
    let err = group.shutdown().expect_err("the release batch was short");
    assert!(err.to_string().contains("the store answered 2 items of a batch of 3"), "{err}");
}
