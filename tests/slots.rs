//! Slots through the guard (`LeaderGuard::claim_slot`), on MemStore with
//! real threads: work that runs once per slot whoever leads when it comes
//! round. The stores' own slot statements are the acceptance suite's
//! (`storetest`); the command-line tool's `--slot` has its own suites.

use leaderelection::testing::TestTerm;
use leaderelection::{Config, ElectionError, Elector, LeaderGuard, MemStore, SlotClaim};

mod threaded;
use threaded::{lead, timing, LeasesOnly};

fn start(store: &MemStore, id: &str) -> Elector {
    Elector::start(Config::new(store.clone(), "nightly").identity(id).timing(timing())).expect("valid config")
}

/// Two hosts on a fresh store: `a`, the guard of its first term, and `b`,
/// started after it and waiting.
fn a_leads_b_waits() -> (Elector, LeaderGuard, Elector) {
    let store = MemStore::new();
    let a = start(&store, "a");
    let first = lead(&a);
    (a, first, start(&store, "b"))
}

/// Cron fires on two hosts; the first leads, runs the day's slot and hands
/// over; the second, which waited, leads next and finds the slot taken,
/// with the first run's fence and outcome. A slot of the next day is its
/// own.
#[test]
fn a_slot_runs_once_whoever_leads_after() {
    let (_a, first, b) = a_leads_b_waits();
    assert_eq!(first.claim_slot("2026-12-01").unwrap(), SlotClaim::Claimed);
    assert!(first.finish_slot("2026-12-01", 0).unwrap());
    let fence = first.fence();
    drop(first); // resigns: b takes over at once
    let second = lead(&b);
    assert!(second.fence() > fence);
    let seen = second.claim_slot("2026-12-01").unwrap();
    assert_eq!(seen, SlotClaim::Taken { fence, outcome: Some(0) }, "the second host ran the day again");
    assert_eq!(second.claim_slot_retrying_failed("2026-12-01").unwrap(), seen, "a run that succeeded stays");
    assert!(second.claim_slot("2026-12-02").unwrap().is_claimed());
}

/// A run that was killed (it recorded nothing) leaves its slot taken, at
/// most once; the next term may take it over only when it asks to retry.
#[test]
fn a_killed_run_is_retried_only_on_request() {
    let (a, first, b) = a_leads_b_waits();
    assert!(first.claim_slot("hourly 13:00").unwrap().is_claimed());
    let fence = first.fence();
    drop(first);
    a.shutdown_without_release(); // the run never says how it ended
    let second = lead(&b);
    assert_eq!(second.claim_slot("hourly 13:00").unwrap(), SlotClaim::Taken { fence, outcome: None });
    assert_eq!(second.claim_slot_retrying_failed("hourly 13:00").unwrap(), SlotClaim::Claimed);
}

/// A guard whose term has ended claims nothing, and says so; a bad slot
/// name is a fatal error; a test term has no store.
#[test]
fn an_ended_term_claims_nothing() {
    let store = MemStore::new();
    let a = start(&store, "a");
    let guard = lead(&a);
    let bad = guard.claim_slot("two\nlines").unwrap_err();
    assert!(bad.is_fatal() && bad.to_string().contains("invalid slot name"), "{bad}");
    a.shutdown().unwrap();
    assert!(!guard.is_valid());
    assert!(matches!(guard.claim_slot("s"), Err(ElectionError::NotLeading)));
    let b = start(&store, "b");
    assert!(lead(&b).claim_slot("s").unwrap().is_claimed(), "the ended term recorded nothing");
    let test = TestTerm::new(7);
    let e = test.guard().claim_slot("s").unwrap_err();
    assert!(e.is_fatal() && e.to_string().contains("test term"), "{e}");
}

/// A store of someone else's that implements only the four lease calls
/// (as every store did before slots): slot calls fail with a fatal error
/// that says so, through the store and through a guard on it.
#[test]
fn a_store_that_keeps_no_slots_says_so() {
    let t = std::time::Duration::from_secs(1);
    let store = LeasesOnly::new(MemStore::new());
    let e = leaderelection::Store::claim_slot(&store, "e", "a", 1, "s", false, t).unwrap_err();
    assert!(e.is_fatal() && e.to_string().contains("keeps no slots"), "{e}");
    let e = leaderelection::Store::finish_slot(&store, "e", 1, "s", 0, t).unwrap_err();
    assert!(e.is_fatal() && e.to_string().contains("keeps no slots"), "{e}");
    let elector = Elector::start(Config::new(store, "nightly").identity("a").timing(timing())).unwrap();
    let guard = lead(&elector);
    let e = guard.claim_slot("s").unwrap_err();
    assert!(e.is_fatal() && e.to_string().contains("claim_slot failed: this store keeps no slots"), "{e}");
    let e = guard.finish_slot("s", 0).unwrap_err();
    assert!(e.is_fatal() && e.to_string().contains("finish_slot failed"), "{e}");
}
