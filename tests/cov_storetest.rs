//! The acceptance suite (`leaderelection::storetest`) against stores that
//! break: a store whose call fails where the suite needs it to work must
//! fail the case, and the failure must name the call and carry the
//! store's error, so a store's author sees what to fix. On MemStore, one
//! call failing at a time.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;
use std::time::Duration;

use leaderelection::storetest;
use leaderelection::{BatchItem, Heartbeat, Lease, MemStore, Members, Store, StoreError};

mod forward;
use forward::forward_calls;

/// A MemStore whose `nth` call of `op` fails (retryably, "broken <op>"),
/// or panics when `op` is "panic". "heartbeat_part" fails only the
/// heartbeat of a renewal batch that carries one.
struct Broken {
    inner: MemStore,
    op: &'static str,
    nth: usize,
    calls: Mutex<HashMap<&'static str, usize>>,
}

impl Broken {
    fn new(op: &'static str, nth: usize) -> Broken {
        Broken { inner: MemStore::new(), op, nth, calls: Mutex::default() }
    }

    /// Counts a call of `op`; whether it is the one to break.
    fn breaks(&self, op: &'static str) -> bool {
        let mut calls = self.calls.lock().unwrap();
        let n = calls.entry(op).or_insert(0);
        *n += 1;
        op == self.op && *n == self.nth
    }

    /// `forward_calls!`'s hook: the call, unless it is the one to break.
    fn checked<T>(
        &self, op: &'static str, _: Duration, call: impl FnOnce() -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.check(op)?;
        call()
    }

    fn check(&self, op: &'static str) -> Result<(), StoreError> {
        if self.op == "panic" {
            panic!("the store crashed (on purpose)");
        }
        if self.breaks(op) {
            return Err(StoreError::retryable(format!("broken {op}")));
        }
        Ok(())
    }

    fn each<T>(
        &self, op: &'static str, len: usize, call: impl FnOnce() -> Vec<Result<T, StoreError>>,
    ) -> Vec<Result<T, StoreError>> {
        match self.check(op) {
            Ok(()) => call(),
            Err(e) => (0..len).map(|_| Err(e.clone())).collect(),
        }
    }
}

impl Store for Broken {
    forward_calls!(inner via Self::checked => acquire, renew, release, inspect, claim_slot, heartbeat, leave_group);
    forward_calls!(inner => finish_slot);
    fn acquire_many(
        &self, id: &str, ttl: Duration, items: &[BatchItem<'_>], t: Duration,
    ) -> Vec<Result<Lease, StoreError>> {
        self.each("acquire_many", items.len(), || self.inner.acquire_many(id, ttl, items, t))
    }
    fn renew_many(
        &self, id: &str, ttl: Duration, items: &[BatchItem<'_>], t: Duration,
    ) -> Vec<Result<Lease, StoreError>> {
        self.each("renew_many", items.len(), || self.inner.renew_many(id, ttl, items, t))
    }
    fn renew_many_with_heartbeat(
        &self, id: &str, ttl: Duration, items: &[BatchItem<'_>], beat: Heartbeat<'_>, t: Duration,
    ) -> (Vec<Result<Lease, StoreError>>, Result<Members, StoreError>) {
        if let Err(e) = self.check("renew_many_with_heartbeat") {
            return (items.iter().map(|_| Err(e.clone())).collect(), Err(e));
        }
        let (out, members) = self.inner.renew_many_with_heartbeat(id, ttl, items, beat, t);
        (out, self.check("heartbeat_part").and(members))
    }
    fn release_many(&self, id: &str, items: &[BatchItem<'_>], t: Duration) -> Vec<Result<(), StoreError>> {
        self.each("release_many", items.len(), || self.inner.release_many(id, items, t))
    }
    fn inspect_many(&self, names: &[&str], t: Duration) -> Vec<Result<Lease, StoreError>> {
        self.each("inspect_many", names.len(), || self.inner.inspect_many(names, t))
    }
}

/// Runs `case` on a store whose `nth` call of `op` breaks; the message the
/// case failed with (it must fail).
fn failure(case: &dyn Fn(&Broken), op: &'static str, nth: usize) -> String {
    let store = Broken::new(op, nth);
    let panic = catch_unwind(AssertUnwindSafe(|| case(&store))).expect_err("the case passed a broken store");
    match panic.downcast::<String>() {
        Ok(text) => *text,
        Err(other) => other.downcast_ref::<&str>().map_or_else(String::new, |s| (*s).to_owned()),
    }
}

fn assert_names(text: &str, start: &str, end: &str) {
    assert!(text.starts_with(start) && text.ends_with(end), "{text:?}: not {start:?} … {end:?}");
}

#[test]
fn a_failing_single_lease_call_fails_the_case_naming_it() {
    let text = failure(&|s| storetest::first_claim_wins_with_a_fence(s), "acquire", 1);
    assert_names(&text, "acquire(", ", a) failed: broken acquire");
    let text = failure(&|s| storetest::takeover_after_release(s), "inspect", 1);
    assert_names(&text, "inspect(", ") failed: broken inspect");
    let text = failure(&|s| storetest::a_slot_is_claimed_once(s), "claim_slot", 1);
    assert_names(&text, "claim_slot(", "\"2026-12-01 it's \\\\; -- ünï\") failed: broken claim_slot");
    // The operator cases' terms: each step of a term must work.
    let deleted = |s: &Broken| storetest::fences_grow_across_a_deleted_row(s, &s.inner);
    assert_eq!(failure(&deleted, "renew", 1), "renew by a: broken renew");
    assert_eq!(failure(&deleted, "release", 1), "release by a: broken release");
}

#[test]
fn a_failing_batch_fails_the_case_naming_the_item() {
    let text = failure(&|s| storetest::batched_claims_decide_each_row_on_its_own(s), "acquire_many", 1);
    assert_names(&text, "acquire_many: ", "/absent failed: broken acquire_many");
    let text = failure(&|s| storetest::batched_renewals_are_guarded_per_row(s), "renew_many", 1);
    assert_eq!(text, "renew_many: the held term must renew, got broken renew_many");
    let large = |s: &Broken| storetest::a_large_batch_answers_in_order(s);
    assert_eq!(failure(&large, "acquire_many", 1), "acquire_many item 0: broken acquire_many");
    assert_eq!(failure(&large, "renew_many", 1), "renew_many item 0: broken renew_many");
    // Three reads: the renewed rows, all rows shuffled, the released rows.
    for nth in 1..=3 {
        assert_names(&failure(&large, "inspect_many", nth), "inspect_many ", ": broken inspect_many");
    }
    let text = failure(&|s| storetest::concurrent_batched_claims_one_wins_each(s), "acquire_many", 1);
    assert!(text.starts_with("claiming thread panicked"), "{text}");
}

#[test]
fn a_failing_heartbeat_with_renewals_fails_the_case_naming_the_part() {
    let renewals = |s: &Broken| storetest::renewals_go_with_a_heartbeat(s);
    assert_names(&failure(&renewals, "acquire", 1), "acquire ", ": broken acquire");
    assert_eq!(
        failure(&renewals, "renew_many_with_heartbeat", 1),
        "the renewal under the right fence failed: broken renew_many_with_heartbeat"
    );
    assert_eq!(failure(&renewals, "inspect", 1), "inspect: broken inspect");
    assert_eq!(
        failure(&renewals, "heartbeat_part", 1),
        "the heartbeat with the renewals failed: broken heartbeat_part"
    );
    let leaves = |s: &Broken| storetest::a_member_that_leaves_is_counted_out_at_once(s);
    assert_eq!(failure(&leaves, "heartbeat_part", 1), "a heartbeat with renewals failed: broken heartbeat_part");
}

/// A store that panics (with a plain text, not a formatted one) fails
/// `run_all` naming the case and carrying the store's text.
#[test]
fn a_store_that_panics_fails_run_all_naming_the_case() {
    let text = failure(&|s| storetest::run_all(s), "panic", 0);
    assert_eq!(text, "storetest case first_claim_wins_with_a_fence failed: the store crashed (on purpose)");
}
