//! What `Elector::status` tells an operator: terms started and ended by each
//! reason, renewals, calls abandoned at the timeout, the last call's round
//! trip, and the one-line `Display`. Threaded electors on MemStore in real
//! time, so every wait is for a condition with a deadline.

use std::time::Instant;

use leaderelection::{Config, Elector, ErrorKind, MemStore, TermsEnded};

mod threaded;
use threaded::{alone, alone_until_failing_ends_the_term, lead, ms, start, term_ends, timing, until, LeasesOnly, NAME};

fn ended(resigned: u64, lost: u64, expired: u64, fatal: u64, shutdown: u64) -> TermsEnded {
    let mut e = TermsEnded::default();
    (e.resigned, e.lost, e.expired, e.fatal, e.shutdown) = (resigned, lost, expired, fatal, shutdown);
    e
}

#[test]
fn a_resigned_term_and_a_shut_down_term_are_counted_with_their_renewals_and_round_trips() {
    let store = MemStore::new();
    let a = start(&store, "a");
    let before = Instant::now();
    let guard = lead(&a);
    let st = a.status();
    assert_eq!((st.name.as_str(), st.terms_started, st.terms_ended), (NAME, 1, TermsEnded::default()));
    let began = st.term_started.expect("a leader's status says when its term started");
    assert!(began >= before && began <= Instant::now(), "term started {began:?}, waited from {before:?}");
    let rtt = st.last_call_rtt.expect("the acquire's round trip");
    assert!(rtt < ms(300), "a MemStore call took {rtt:?}");

    let st = until(&a, "three renewals", |s| s.renewals_ok >= 3);
    assert_eq!((st.renewals_failed, st.calls_abandoned), (0, 0), "{st:?}");
    assert_eq!(st.term_started, Some(began), "renewals do not start a new term");

    drop(guard); // resigns
    let st = until(&a, "the resignation counted", |s| s.terms_ended.resigned == 1);
    assert_eq!(st.terms_ended, ended(1, 0, 0, 0, 0));
    assert!(!st.is_leader && st.term_started.is_none(), "{st:?}");

    let second = lead(&a); // after the back-off, alone: a again
    assert_eq!(a.status().terms_started, 2);
    a.shutdown().expect("released");
    let st = a.status();
    assert!(st.stopped && !second.is_valid());
    assert_eq!((st.terms_started, st.terms_ended), (2, ended(1, 0, 0, 0, 1)), "{st:?}");
    assert_eq!(st.terms_ended.total(), st.terms_started);
    assert_eq!((st.renewals_failed, st.calls_abandoned), (0, 0), "{st:?}");
}

#[test]
fn a_renewal_that_finds_the_lease_gone_ends_the_term_as_lost() {
    let (store, a, guard) = alone();
    let fence = guard.fence();
    assert!(store.delete_row(NAME));
    term_ends(&guard);
    drop(guard);
    let st = until(&a, "the loss counted", |s| s.terms_ended.lost == 1);
    assert_eq!(st.terms_ended, ended(0, 1, 0, 0, 0), "{st:?}");
    assert!(st.renewals_failed >= 1, "the renewal that found the lease gone failed: {st:?}");
    // Nothing to wait out: it campaigns again at once and wins a new term.
    let st = until(&a, "a second term", |s| s.terms_started == 2 && s.is_leader);
    assert!(st.fence > Some(fence), "{st:?}");
    a.shutdown().unwrap();
}

#[test]
fn a_fatal_renewal_ends_the_term_as_fatal_and_nobody_leads() {
    let (_store, a, guard) = alone_until_failing_ends_the_term(ErrorKind::Fatal);
    drop(guard);
    let st = until(&a, "the fatal end counted", |s| s.terms_ended.fatal == 1);
    assert_eq!((st.terms_started, st.terms_ended), (1, ended(0, 0, 0, 1, 0)), "{st:?}");
    assert!(st.renewals_failed >= 1 && st.calls_abandoned == 0, "{st:?}");
    assert!(st.last_error.as_ref().is_some_and(|e| e.is_fatal()), "{st:?}");
    let line = st.to_string();
    assert!(line.starts_with(&format!("\"jobs\": {}: nobody leads (its own term with fence ", a.identity())), "{line}");
    // The last error is the renewal's, or that of a call after it: the
    // ended term's release and the polls that follow fail as the store
    // does, and may land before the status is read.
    let last = line.rsplit_once("; last error: ").map(|(_, e)| e).unwrap_or_default();
    assert!(
        ["renew", "release", "inspect"]
            .iter()
            .any(|op| last == format!("{op} failed: memstore: failing on purpose (fatal)")),
        "{line}"
    );
    a.shutdown_without_release();
}

#[test]
fn renewals_that_fail_until_the_deadline_end_the_term_as_expired() {
    let (store, a, guard) = alone_until_failing_ends_the_term(ErrorKind::Retryable);
    let st = until(&a, "the expiry counted", |s| s.terms_ended.expired == 1);
    assert_eq!((st.terms_started, st.terms_ended), (1, ended(0, 0, 1, 0, 0)), "{st:?}");
    // Retried every retry delay (75 ms) from the first failure to the deadline.
    assert!(st.renewals_failed >= 2 && st.calls_abandoned == 0, "{st:?}");
    store.set_failing(None);
    drop(guard);
    a.shutdown().unwrap();
}

#[test]
fn hung_renewals_are_abandoned_at_the_operation_timeout_and_the_term_expires() {
    let (store, a, guard) = alone();
    let ok = until(&a, "a renewal", |s| s.renewals_ok >= 1).renewals_ok;
    store.pause(); // every call hangs until resume
    term_ends(&guard);
    let st = until(&a, "the expiry counted", |s| s.terms_ended.expired == 1);
    assert_eq!(st.terms_ended, ended(0, 0, 1, 0, 0), "{st:?}");
    // A 300 ms timeout, retried 75 ms later, within 1.3 s: at least two.
    assert!(st.calls_abandoned >= 2 && st.renewals_failed >= 2, "{st:?}");
    assert!(st.renewals_ok <= ok + 1, "no renewal landed while the store hung: {st:?}");
    store.resume();
    drop(guard);
    a.shutdown_without_release();
}

#[test]
fn the_last_round_trip_is_the_store_calls_own_time() {
    let delay = ms(40);
    let slow = LeasesOnly::delayed(MemStore::new(), delay);
    let a = Elector::start(Config::new(slow, NAME).identity("a").timing(timing())).unwrap();
    let guard = lead(&a);
    let st = until(&a, "a renewal", |s| s.renewals_ok >= 1);
    let rtt = st.last_call_rtt.expect("a call answered");
    assert!(rtt >= delay && rtt < delay + ms(100), "round trip {rtt:?} for a {delay:?} store");
    assert!(!st.to_string().contains("last call none"), "{st}");
    drop(guard);
    a.shutdown().unwrap();
}

#[test]
fn the_status_line_shows_the_leader_a_follower_and_a_participant_that_is_held_back() {
    let (store, a, guard) = alone();
    let fence = guard.fence();
    let b = start(&store, "b");
    let follows = until(&b, "b sees a", |s| {
        s.leader.as_ref().is_some_and(|l| leaderelection::base_identity(&l.identity) == "a" && l.valid)
    });
    let (ia, ib) = (a.identity(), b.identity());
    let want = format!(
        "\"jobs\": {ib} follows {ia} (fence {fence}); terms 0 (ended: 0 resigned, 0 lost, 0 expired, 0 fatal, \
         0 shutdown), renewals 0 ok 0 failed, 0 abandoned, last call "
    );
    assert!(follows.to_string().starts_with(&want), "{follows}\n{want}");
    let leads = a.status().to_string();
    assert!(leads.starts_with(&format!("\"jobs\": {ia} leads (fence {fence}, term ")), "{leads}");
    assert!(leads.contains(" left); terms 1 (ended: 0 resigned, "), "{leads}");

    // The lease disappears while a's program holds its guard: the term ends,
    // and the old guard keeps a from campaigning.
    b.shutdown_without_release();
    assert!(store.delete_row(NAME));
    term_ends(&guard);
    let held = until(&a, "held back", |s| s.held_back);
    let line = held.to_string();
    let want = format!(
        "\"jobs\": {ia}: nobody leads (its own term with fence {fence} has ended), held back by guards of an ended \
         term; terms 1 (ended: 0 resigned, 1 lost, "
    );
    assert!(line.starts_with(&want), "{line}\n{want}");
    drop(guard);
    let st = until(&a, "led again once the guard is gone", |s| s.is_leader);
    assert!(!st.held_back && st.terms_started == 2, "{st:?}");
    a.shutdown().unwrap();
}

#[test]
fn the_status_line_says_why_nobody_leads() {
    let store = MemStore::new();
    store.set_failing(Some(ErrorKind::Fatal));
    let c = start(&store, "c");
    let st = until(&c, "a failed call", |s| s.last_error.is_some());
    let line = st.to_string();
    assert!(line.starts_with(&format!("\"jobs\": {}: nobody leads; terms 0 (ended: ", c.identity())), "{line}");
    assert!(line.ends_with("; last error: inspect failed: memstore: failing on purpose (fatal)"), "{line}");
    c.shutdown().unwrap();
}
