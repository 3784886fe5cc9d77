//! The store acceptance suite against the in-memory reference store.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use leaderelection::storetest::{self, Operator};
use leaderelection::{BatchItem, DbTime, Heartbeat, Lease, MemStore, Members, SlotClaim, Store, StoreError};

mod threaded;
use threaded::forward_calls;

leaderelection::storetest_suite!(with members: MemStore::new());

mod operator {
    use leaderelection::MemStore;
    leaderelection::storetest_suite!(operator: {
        let s = MemStore::new();
        (s.clone(), s)
    });
}

#[test]
fn run_all_passes_with_the_database_clock_days_away() {
    let store = MemStore::new();
    store.set_offset(-4 * 86_400_000_000);
    storetest::run_all(&store);
    storetest::run_operator_cases(&store, &store);
}

/// The fence rule this crate had before: 1 for an absent row, the stored
/// fence + 1 for an expired one. Played over a [`MemStore`] by renumbering
/// its fences, so everything else (guards, expiry) is the real store's.
struct OldFenceRule {
    inner: MemStore,
    /// (election, the inner store's fence) -> the fence the old rule gives.
    old: Mutex<HashMap<(String, u64), u64>>,
    /// One claim at a time: a claim reads the row before it and numbers
    /// the fence it made after it, and a claim that lost to one still
    /// between the two would be answered the inner fence, unnumbered (seen
    /// once in the batched claim race of a loaded CI run).
    claiming: Mutex<()>,
}

impl OldFenceRule {
    fn outer(&self, mut l: Lease) -> Lease {
        let old = self.old.lock().unwrap();
        l.fence = old.get(&(l.name.clone(), l.fence)).copied().unwrap_or(l.fence);
        l
    }
    fn inner_fence(&self, name: &str, fence: u64) -> u64 {
        let old = self.old.lock().unwrap();
        old.iter().find(|((n, _), o)| n == name && **o == fence).map(|((_, i), _)| *i).unwrap_or(u64::MAX)
    }
}

impl Store for OldFenceRule {
    fn acquire(&self, n: &str, id: &str, ttl: Duration, p: &[u8], t: Duration) -> Result<Lease, StoreError> {
        let _one = self.claiming.lock().unwrap();
        let before = self.inner.peek(n);
        let l = self.inner.acquire(n, id, ttl, p, t)?;
        if before.as_ref().map(|b| b.fence) != Some(l.fence) {
            let prev = before.map(|b| self.outer(b).fence).unwrap_or(0);
            self.old.lock().unwrap().insert((n.to_owned(), l.fence), prev + 1);
        }
        Ok(self.outer(l))
    }
    fn renew(&self, n: &str, id: &str, f: u64, ttl: Duration, p: &[u8], t: Duration) -> Result<Lease, StoreError> {
        let l = self.inner.renew(n, id, self.inner_fence(n, f), ttl, p, t)?;
        Ok(self.outer(l))
    }
    fn release(&self, n: &str, id: &str, f: u64, t: Duration) -> Result<(), StoreError> {
        self.inner.release(n, id, self.inner_fence(n, f), t)
    }
    fn inspect(&self, n: &str, t: Duration) -> Result<Lease, StoreError> {
        self.inner.inspect(n, t).map(|l| self.outer(l))
    }
    fn claim_slot(
        &self, n: &str, id: &str, f: u64, slot: &str, retry: bool, t: Duration,
    ) -> Result<SlotClaim, StoreError> {
        match self.inner.claim_slot(n, id, self.inner_fence(n, f), slot, retry, t)? {
            SlotClaim::Taken { fence, outcome } => {
                let fence = self.old.lock().unwrap().get(&(n.to_owned(), fence)).copied().unwrap_or(fence);
                Ok(SlotClaim::Taken { fence, outcome })
            }
            claimed => Ok(claimed),
        }
    }
    fn finish_slot(&self, n: &str, f: u64, slot: &str, outcome: i32, t: Duration) -> Result<bool, StoreError> {
        self.inner.finish_slot(n, self.inner_fence(n, f), slot, outcome, t)
    }
}

impl Operator for OldFenceRule {
    fn delete_row(&self, name: &str) {
        self.inner.delete_row(name);
    }
    fn restore_row(&self, row: &Lease) {
        let fence = self.inner_fence(&row.name, row.fence);
        self.inner.restore_row(&Lease { fence, ..row.clone() });
    }
    fn recreate_table(&self) {
        self.inner.clear();
    }
}

/// The operator cases must be able to fail: the old fence rule passes every
/// plain case but hands out old fences again after each operator event.
#[test]
fn the_suite_catches_fences_that_restart_after_a_delete_or_restore() {
    let old = || OldFenceRule { inner: MemStore::new(), old: Mutex::new(HashMap::new()), claiming: Mutex::new(()) };
    // Control: the renumbering wrapper is a working store otherwise.
    storetest::run_all(&old());
    for (name, case) in storetest::OPERATOR_CASES {
        let store = old();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| case(&store, &store)));
        let msg = r.expect_err(&format!("{name} passed a store whose fences restart"));
        let msg = msg.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains("not above the earlier fences"), "{name} failed for another reason: {msg}");
    }
}

type AcquireFn = fn(&MemStore, &str, &str, Duration, &[u8], Duration) -> Result<Lease, StoreError>;
type RenewFn = fn(&MemStore, &str, &str, u64, Duration, &[u8], Duration) -> Result<Lease, StoreError>;
type InspectFn = fn(&MemStore, &str, Duration) -> Result<Lease, StoreError>;

/// A [`MemStore`] with some of its calls replaced (to break it on
/// purpose); a call left `None` goes to the store unchanged.
#[derive(Default)]
struct Broken {
    inner: MemStore,
    acquire: Option<AcquireFn>,
    renew: Option<RenewFn>,
    inspect: Option<InspectFn>,
    claim_slot: Option<ClaimFn>,
}

type ClaimFn = fn(&MemStore, &str, &str, u64, &str, bool, Duration) -> Result<SlotClaim, StoreError>;

impl Store for Broken {
    forward_calls!(inner => release, finish_slot);
    fn acquire(&self, n: &str, id: &str, ttl: Duration, p: &[u8], t: Duration) -> Result<Lease, StoreError> {
        match self.acquire {
            Some(f) => f(&self.inner, n, id, ttl, p, t),
            None => self.inner.acquire(n, id, ttl, p, t),
        }
    }
    fn renew(&self, n: &str, id: &str, f: u64, ttl: Duration, p: &[u8], t: Duration) -> Result<Lease, StoreError> {
        match self.renew {
            Some(r) => r(&self.inner, n, id, f, ttl, p, t),
            None => self.inner.renew(n, id, f, ttl, p, t),
        }
    }
    fn inspect(&self, n: &str, t: Duration) -> Result<Lease, StoreError> {
        match self.inspect {
            Some(f) => f(&self.inner, n, t),
            None => self.inner.inspect(n, t),
        }
    }
    fn claim_slot(
        &self, n: &str, id: &str, f: u64, slot: &str, retry: bool, t: Duration,
    ) -> Result<SlotClaim, StoreError> {
        match self.claim_slot {
            Some(c) => c(&self.inner, n, id, f, slot, retry, t),
            None => self.inner.claim_slot(n, id, f, slot, retry, t),
        }
    }
}

/// The slot cases must be able to fail: a store that tells every claim it
/// won (so a slot would run on every host), and one that claims without
/// checking the term, are caught.
#[test]
fn the_suite_catches_slots_claimed_twice_or_without_the_term() {
    let twice = Broken {
        claim_slot: Some(|s, n, id, f, slot, retry, t| {
            s.claim_slot(n, id, f, slot, retry, t).map(|_| SlotClaim::Claimed)
        }),
        ..Broken::default()
    };
    for (what, case) in [
        ("a_slot_is_claimed_once", storetest::a_slot_is_claimed_once as fn(&dyn Store)),
        ("concurrent_slot_claims_one_wins", storetest::concurrent_slot_claims_one_wins),
    ] {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| case(&twice)));
        assert!(r.is_err(), "{what} passed a store that claims every slot again");
    }
    let unguarded = Broken {
        claim_slot: Some(|s, n, _id, _f, slot, retry, t| {
            // Claims for whoever holds the lease now, whoever asks.
            let holder = s.peek(n).ok_or_else(StoreError::lease_lost)?;
            let (holder, fence) = (holder.holder, holder.fence);
            s.restore_row(&Lease { expires_at: s.now().saturating_add(Duration::from_secs(60)), ..s.peek(n).unwrap() });
            s.claim_slot(n, &holder, fence, slot, retry, t)
        }),
        ..Broken::default()
    };
    let r =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| storetest::a_slot_claim_needs_the_term(&unguarded)));
    assert!(r.is_err(), "the suite passed a slot claim that does not check the term");
}

/// The expiry case must be able to fail: a store whose renewals write
/// `now + ttl` whatever the current expiry is caught.
#[test]
fn the_suite_catches_a_renewal_that_shortens_the_lease() {
    let shortening = Broken {
        renew: Some(|s, n, id, f, ttl, p, t| {
            // Renew, then write the shorter expiry an unguarded `SET expires_at = now() + ttl` would.
            let l = s.renew(n, id, f, ttl, p, t)?;
            let short = Lease { expires_at: l.now.saturating_add(ttl), ..l };
            s.restore_row(&short);
            Ok(short)
        }),
        ..Broken::default()
    };
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        storetest::no_write_moves_the_expiry_backwards(&shortening)
    }));
    let msg = r.expect_err("the suite passed a renewal that shortens the lease");
    let msg = msg.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(msg.contains("a renewal moved the expiry back"), "failed for another reason: {msg}");
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
    let bad = Broken {
        acquire: Some(|s, n, id, ttl, p, t| {
            let mut l = s.acquire(n, id, ttl, p, t)?;
            l.holder = id.to_owned();
            Ok(l)
        }),
        ..Broken::default()
    };
    let r =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| storetest::concurrent_acquire_exactly_one_wins(&bad)));
    assert!(r.is_err(), "the suite passed a store where everyone wins");
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| storetest::loser_leaves_the_row_untouched(&bad)));
    assert!(r.is_err(), "the suite passed a store where the loser is told it won");
}

/// A renew that succeeds without the guard is caught.
#[test]
fn the_suite_catches_an_unguarded_renew() {
    let sloppy = Broken {
        renew: Some(|s, n, id, f, ttl, p, t| match s.renew(n, id, f, ttl, p, t) {
            Err(e) if e.is_lease_lost() => s.inspect(n, t),
            other => other,
        }),
        ..Broken::default()
    };
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| storetest::renew_is_guarded(&sloppy)));
    assert!(r.is_err(), "the suite passed a renew that succeeds for the wrong caller");
}

/// A store whose `inspect` invents a row for an absent election is caught,
/// and `run_all` names the case that failed.
#[test]
fn run_all_names_the_case_that_catches_a_store_inventing_rows() {
    // Claims the row for a ghost instead of reporting it missing.
    let inventive = || Broken {
        inspect: Some(|s, n, t| match s.inspect(n, t) {
            Err(e) if e.is_no_lease() => s.acquire(n, "ghost", Duration::from_secs(60), b"", t),
            other => other,
        }),
        ..Broken::default()
    };
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| storetest::inspect_never_writes(&inventive())));
    let msg = panic_text(r.expect_err("the suite passed an inspect that invents rows"));
    assert!(msg.contains("expected NoLease"), "{msg}");

    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| storetest::run_all(&inventive())));
    let msg = panic_text(r.expect_err("run_all passed an inspect that invents rows"));
    assert!(msg.starts_with("storetest case "), "{msg}");
    let (case, why) = msg["storetest case ".len()..].split_once(" failed: ").expect("names the case and the reason");
    assert!(!case.is_empty() && !why.is_empty(), "{msg}");
}

/// A store whose `inspect` answers NoLease but creates the row on the way is
/// caught: followers must generate no writes.
#[test]
fn the_suite_catches_an_inspect_that_writes() {
    let writing = Broken {
        inspect: Some(|s, n, t| {
            let seen = s.inspect(n, t);
            if matches!(&seen, Err(e) if e.is_no_lease()) {
                s.acquire(n, "ghost", Duration::from_secs(60), b"", t)?;
            }
            seen
        }),
        ..Broken::default()
    };
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| storetest::inspect_never_writes(&writing)));
    let msg = panic_text(r.expect_err("the suite passed an inspect that writes"));
    assert!(msg.contains("inspect must not create the row"), "{msg}");
}

fn panic_text(e: Box<dyn std::any::Any + Send>) -> String {
    e.downcast_ref::<String>()
        .cloned()
        .or_else(|| e.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_default()
}

/// A [`MemStore`] whose batched calls or heartbeats are broken in one way
/// (to show the batch and member cases can fail); the single-lease calls
/// are the store's own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BatchBug {
    /// Answers in reverse order.
    Reversed,
    /// Renews every item's row for the caller whatever its holder and
    /// fence (a batch guarded on the name only).
    RenewsByNameOnly,
    /// Claims every item for the caller, valid or not (no mutual exclusion).
    ClaimsEverything,
    /// Counts members whose heartbeat expired.
    CountsExpiredMembers,
    /// Ranks every member ever seen, in the order of their names in lower
    /// case (a case-insensitive collation's, roughly).
    RanksByCollation,
    /// Adds each report to what the member reported before, instead of
    /// replacing it.
    AddsReports,
    /// A read that claims absent rows.
    InspectWrites,
    /// Renewals with a heartbeat that answer the heartbeat without writing
    /// it.
    BeatsWithoutWriting,
}

struct BrokenBatch {
    inner: MemStore,
    bug: BatchBug,
    /// Every member ever seen, for [`BatchBug::CountsExpiredMembers`].
    seen: Mutex<HashMap<String, std::collections::HashSet<String>>>,
    /// What each member reported so far, for [`BatchBug::AddsReports`].
    sums: Mutex<HashMap<(String, String), u64>>,
}

impl BrokenBatch {
    fn new(bug: BatchBug) -> BrokenBatch {
        BrokenBatch { inner: MemStore::new(), bug, seen: Mutex::new(HashMap::new()), sums: Mutex::new(HashMap::new()) }
    }
    fn order<T>(&self, mut v: Vec<T>) -> Vec<T> {
        if self.bug == BatchBug::Reversed {
            v.reverse();
        }
        v
    }
    /// For the bugs that answer each item by a rule of their own: the row
    /// `wrong` makes up for each item is written over the real one and
    /// returned.
    fn overwrite_each(
        &self, items: &[BatchItem<'_>], wrong: impl Fn(&BatchItem<'_>) -> Result<Lease, StoreError>,
    ) -> Vec<Result<Lease, StoreError>> {
        items
            .iter()
            .map(|i| {
                let l = wrong(i)?;
                self.inner.restore_row(&l);
                Ok(l)
            })
            .collect()
    }
}

impl Store for BrokenBatch {
    forward_calls!(inner => acquire, renew, release, inspect);
    fn acquire_many(
        &self, id: &str, ttl: Duration, items: &[BatchItem<'_>], t: Duration,
    ) -> Vec<Result<Lease, StoreError>> {
        let out = if self.bug == BatchBug::ClaimsEverything {
            self.overwrite_each(items, |i| {
                let l = self.inner.acquire(i.name, id, ttl, i.payload, t)?;
                Ok(Lease { holder: id.to_owned(), payload: i.payload.to_vec(), ..l })
            })
        } else {
            self.inner.acquire_many(id, ttl, items, t)
        };
        self.order(out)
    }
    fn renew_many(
        &self, id: &str, ttl: Duration, items: &[BatchItem<'_>], t: Duration,
    ) -> Vec<Result<Lease, StoreError>> {
        let out = if self.bug == BatchBug::RenewsByNameOnly {
            self.overwrite_each(items, |i| {
                let l = self.inner.inspect(i.name, t).map_err(|_| StoreError::lease_lost())?;
                Ok(Lease {
                    holder: id.to_owned(),
                    fence: i.fence,
                    expires_at: l.now.saturating_add(ttl),
                    payload: i.payload.to_vec(),
                    ..l
                })
            })
        } else {
            self.inner.renew_many(id, ttl, items, t)
        };
        self.order(out)
    }
    fn release_many(&self, id: &str, items: &[BatchItem<'_>], t: Duration) -> Vec<Result<(), StoreError>> {
        self.order(self.inner.release_many(id, items, t))
    }
    fn inspect_many(&self, names: &[&str], t: Duration) -> Vec<Result<Lease, StoreError>> {
        if self.bug == BatchBug::InspectWrites {
            for n in names {
                if self.inner.peek(n).is_none() {
                    let _ = self.inner.acquire(n, "ghost", Duration::from_secs(60), b"", t);
                }
            }
        }
        self.order(self.inner.inspect_many(names, t))
    }
    fn renew_many_with_heartbeat(
        &self, id: &str, ttl: Duration, items: &[BatchItem<'_>], beat: Heartbeat<'_>, t: Duration,
    ) -> (Vec<Result<Lease, StoreError>>, Result<Members, StoreError>) {
        if self.bug != BatchBug::BeatsWithoutWriting {
            // As the trait's default does.
            let m = self.heartbeat(beat.group, id, beat.leading, beat.ttl, t);
            return (self.renew_many(id, ttl, items, t), m);
        }
        let out = self.inner.renew_many(id, ttl, items, t);
        (out, Ok(Members::new(2, DbTime::from_unix_micros(0)).with_leading(2, 2)))
    }
    fn heartbeat(&self, g: &str, m: &str, n: u32, ttl: Duration, t: Duration) -> Result<Members, StoreError> {
        let real = self.inner.heartbeat(g, m, n, ttl, t)?;
        if self.bug == BatchBug::AddsReports {
            let mut sums = self.sums.lock().unwrap();
            let mine = sums.entry((g.to_owned(), m.to_owned())).or_default();
            let before = *mine;
            *mine += u64::from(n);
            return Ok(real.with_leading(real.led.unwrap_or(0) + before, real.most.unwrap_or(0)));
        }
        if !matches!(self.bug, BatchBug::CountsExpiredMembers | BatchBug::RanksByCollation) {
            return Ok(real);
        }
        let mut seen = self.seen.lock().unwrap();
        let all = seen.entry(g.to_owned()).or_default();
        all.insert(m.to_owned());
        if self.bug == BatchBug::RanksByCollation {
            let rank = all.iter().filter(|o| o.to_lowercase() < m.to_lowercase()).count();
            return Ok(real.with_rank(rank as u32));
        }
        Ok(Members::new(all.len() as u32, real.now))
    }
    fn leave_group(&self, g: &str, m: &str, t: Duration) -> Result<(), StoreError> {
        if let Some(all) = self.seen.lock().unwrap().get_mut(g) {
            all.remove(m);
        }
        self.inner.leave_group(g, m, t)
    }
}

/// The batch and member cases must be able to fail: each broken batch
/// form is caught by the case named for it, while a correct store passes
/// the whole suite with its batched calls.
#[test]
fn the_suite_catches_broken_batches_and_member_counts() {
    let caught = |bug: BatchBug, case: fn(&dyn Store), why: &str| {
        let store = BrokenBatch::new(bug);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| case(&store)));
        let msg = panic_text(r.expect_err(&format!("the suite passed {bug:?}")));
        assert!(msg.contains(why), "{bug:?} was caught for another reason: {msg}");
    };
    caught(BatchBug::Reversed, storetest::a_large_batch_answers_in_order, "answered for another election");
    caught(BatchBug::Reversed, storetest::batched_claims_decide_each_row_on_its_own, "in the items' order");
    caught(BatchBug::RenewsByNameOnly, storetest::batched_renewals_are_guarded_per_row, "must be LeaseLost");
    caught(BatchBug::ClaimsEverything, storetest::batched_claims_decide_each_row_on_its_own, "left as it was");
    caught(BatchBug::ClaimsEverything, storetest::concurrent_batched_claims_one_wins_each, "exactly one must win");
    caught(BatchBug::InspectWrites, storetest::batched_releases_and_reads, "a missing row");
    caught(BatchBug::CountsExpiredMembers, storetest::heartbeats_count_live_members, "still counted after 10 s");
    caught(BatchBug::RanksByCollation, storetest::heartbeats_rank_live_members_by_their_bytes, "after A");
    caught(BatchBug::AddsReports, storetest::heartbeats_sum_what_live_members_lead, "gone 7, a 3, b 5");
    caught(BatchBug::BeatsWithoutWriting, storetest::renewals_go_with_a_heartbeat, "heartbeat was written");
    // Control: the store the wrapper breaks passes every case.
    let plain = MemStore::new();
    storetest::run_all(&plain);
    storetest::run_member_cases(&plain);
}

/// A store that keeps no members (the trait's default) fails the member
/// cases with the default's own message, and still passes every other case
/// through the default batched calls (one single-lease call per item).
#[test]
fn a_store_without_batches_or_members_passes_the_batch_cases_by_default() {
    let plain = threaded::LeasesOnly::new(MemStore::new());
    for (name, case) in storetest::CASES.iter().filter(|(n, _)| n.contains("batch")) {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| case(&plain)));
        assert!(r.is_ok(), "{name} failed through the default batched calls");
    }
    assert_eq!(plain.0.stats().batches, 0, "the defaults call the single-lease methods");
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| storetest::run_member_cases(&plain)));
    let msg = panic_text(r.expect_err("a store without members passed the member cases"));
    assert!(msg.contains("this store keeps no group members"), "{msg}");
}
