//! The acceptance suite every [`Store`] must pass (feature `storetest`).
//!
//! Each case is a function that takes the store under test, works on
//! election names of its own (random, so runs can share one table), and
//! panics with a message that names the broken rule. Run them all with
//! [`run_all`], or get one `#[test]` per case with [`storetest_suite!`](crate::storetest_suite):
//!
//! ```
//! // In tests/my_store.rs of a crate that implements `Store`:
//! leaderelection::storetest_suite!(leaderelection::MemStore::new());
//! # fn main() {}
//! ```
//!
//! The batched forms (`acquire_many` and the rest, see [`crate::batch`]) are
//! among [`CASES`]: the trait's defaults pass them, so a store that
//! overrides them must decide every item as the single-lease call would.
//! Group members ([`Store::heartbeat`]) have cases of their own,
//! [`MEMBER_CASES`], run by [`run_member_cases`].
//!
//! The store must keep real time (leases expire by themselves): the cases
//! that need an expiry use TTLs of a few hundred milliseconds and poll
//! [`Store::inspect`] until the database says the lease has expired. They
//! never compare a database time with the local clock.
//!
//! A second set, [`OPERATOR_CASES`], also plays an operator or a failover on
//! the table behind the store (a deleted row, an older copy of a row coming
//! back, a re-created table) and checks that fences keep growing. It needs
//! those hands as an [`Operator`]; [`MemStore`] is one:
//!
//! ```
//! use leaderelection::{storetest, MemStore};
//!
//! let store = MemStore::new();
//! storetest::run_operator_cases(&store, &store);
//! // Or one #[test] per case, from an expression giving (store, operator):
//! // leaderelection::storetest_suite!(operator: { let s = MemStore::new(); (s.clone(), s) });
//! ```

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use crate::batch::{BatchItem, Heartbeat};
use crate::lease::Lease;
use crate::memstore::MemStore;
use crate::slot::SlotClaim;
use crate::store::{Store, StoreError};

/// The timeout every call of the suite passes.
pub const TIMEOUT: Duration = Duration::from_secs(10);
/// A TTL long enough that no case sees it run out by accident.
pub const LONG: Duration = Duration::from_secs(60);
/// A TTL short enough to wait out.
pub const SHORT: Duration = Duration::from_millis(300);

/// One case of the suite.
pub type Case = fn(&dyn Store);

/// One case that also needs an [`Operator`].
pub type OperatorCase = fn(&dyn Store, &dyn Operator);

/// Hands on the table behind a store, for the cases that play an operator or
/// a database failover. Each method acts at once, outside the store's own
/// calls, and panics with a message saying what failed.
pub trait Operator {
    /// Deletes election `name`'s row, as `DELETE … WHERE name = …` would.
    fn delete_row(&self, name: &str);
    /// Writes `row` (every field but `now`) as the row of election
    /// `row.name`, over whatever is there: an older copy of the row coming
    /// back, as after a failover to a replica that missed the last terms.
    fn restore_row(&self, row: &Lease);
    /// Drops the table and creates it again, empty. The store must work on
    /// the new table afterwards.
    fn recreate_table(&self);
}

impl Operator for MemStore {
    fn delete_row(&self, name: &str) {
        MemStore::delete_row(self, name);
    }
    fn restore_row(&self, row: &Lease) {
        MemStore::restore_row(self, row);
    }
    fn recreate_table(&self) {
        self.clear();
    }
}

/// Every case, by name, in the order [`run_all`] runs them.
pub const CASES: &[(&str, Case)] = &[
    ("first_claim_wins_with_a_fence", first_claim_wins_with_a_fence),
    ("holder_reacquiring_keeps_its_term", holder_reacquiring_keeps_its_term),
    ("loser_leaves_the_row_untouched", loser_leaves_the_row_untouched),
    ("atomic_takeover_after_expiry", atomic_takeover_after_expiry),
    ("takeover_after_release", takeover_after_release),
    ("fences_never_repeat_or_go_backwards", fences_never_repeat_or_go_backwards),
    ("renew_is_guarded", renew_is_guarded),
    ("no_write_moves_the_expiry_backwards", no_write_moves_the_expiry_backwards),
    ("release_of_someone_elses_lease_is_a_noop", release_of_someone_elses_lease_is_a_noop),
    ("inspect_never_writes", inspect_never_writes),
    ("concurrent_acquire_exactly_one_wins", concurrent_acquire_exactly_one_wins),
    ("ttl_comes_from_the_database_clock", ttl_comes_from_the_database_clock),
    ("payload_round_trips", payload_round_trips),
    ("elections_share_one_table", elections_share_one_table),
    ("a_slot_is_claimed_once", a_slot_is_claimed_once),
    ("a_slot_claim_needs_the_term", a_slot_claim_needs_the_term),
    ("a_slot_whose_run_did_not_succeed_may_be_retried", a_slot_whose_run_did_not_succeed_may_be_retried),
    ("concurrent_slot_claims_one_wins", concurrent_slot_claims_one_wins),
    ("batched_claims_decide_each_row_on_its_own", batched_claims_decide_each_row_on_its_own),
    ("batched_renewals_are_guarded_per_row", batched_renewals_are_guarded_per_row),
    ("batched_releases_and_reads", batched_releases_and_reads),
    ("a_large_batch_answers_in_order", a_large_batch_answers_in_order),
    ("concurrent_batched_claims_one_wins_each", concurrent_batched_claims_one_wins_each),
];

/// Every case that needs an [`Operator`], in the order
/// [`run_operator_cases`] runs them.
pub const OPERATOR_CASES: &[(&str, OperatorCase)] = &[
    ("fences_grow_across_a_deleted_row", fences_grow_across_a_deleted_row),
    ("fences_grow_across_an_older_row_coming_back", fences_grow_across_an_older_row_coming_back),
    ("fences_grow_across_a_recreated_table", fences_grow_across_a_recreated_table),
];

/// Runs every case in [`CASES`] against `store`.
///
/// # Panics
///
/// On the first case that fails, naming it.
pub fn run_all(store: &dyn Store) {
    for (name, case) in CASES {
        run_one(name, || case(store));
    }
}

/// Runs every case in [`OPERATOR_CASES`] against `store`, with `operator`
/// acting on the table behind it.
///
/// # Panics
///
/// On the first case that fails, naming it.
pub fn run_operator_cases(store: &dyn Store, operator: &dyn Operator) {
    for (name, case) in OPERATOR_CASES {
        run_one(name, || case(store, operator));
    }
}

fn run_one(name: &str, case: impl FnOnce()) {
    if let Err(e) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(case)) {
        let msg = e
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_default();
        panic!("storetest case {name} failed: {msg}");
    }
}

/// Expands to one `#[test]` per case of the suite, each calling `$make` for
/// a fresh store (any expression whose value implements [`Store`]).
///
/// `storetest_suite!(operator: $make)` does the same for [`OPERATOR_CASES`],
/// with `$make` giving a `(store, operator)` pair; the operator may drop the
/// table, so give each case a table of its own. `storetest_suite!(members:
/// $make)` does it for [`MEMBER_CASES`], for a store that keeps group
/// members; `storetest_suite!(with members: $make)` runs both suites, the
/// member cases in a module `members` (`$make` is then written in the
/// caller's module).
#[macro_export]
macro_rules! storetest_suite {
    (operator: $make:expr) => {
        $crate::storetest_suite!(@operator_cases $make;
            fences_grow_across_a_deleted_row,
            fences_grow_across_an_older_row_coming_back,
            fences_grow_across_a_recreated_table,
        );
    };
    (members: $make:expr) => {
        $crate::storetest_suite!(@cases $make;
            heartbeats_count_live_members,
            a_member_that_leaves_is_counted_out_at_once,
            heartbeats_rank_live_members_by_their_bytes,
            heartbeats_sum_what_live_members_lead,
            renewals_go_with_a_heartbeat,
        );
    };
    (with members: $make:expr) => {
        /// The store of every case here and in `members`.
        fn storetest_store() -> impl $crate::Store {
            $make
        }
        $crate::storetest_suite!(storetest_store());
        mod members {
            $crate::storetest_suite!(members: super::storetest_store());
        }
    };
    ($make:expr) => {
        $crate::storetest_suite!(@cases $make;
            first_claim_wins_with_a_fence,
            holder_reacquiring_keeps_its_term,
            loser_leaves_the_row_untouched,
            atomic_takeover_after_expiry,
            takeover_after_release,
            fences_never_repeat_or_go_backwards,
            renew_is_guarded,
            no_write_moves_the_expiry_backwards,
            release_of_someone_elses_lease_is_a_noop,
            inspect_never_writes,
            concurrent_acquire_exactly_one_wins,
            ttl_comes_from_the_database_clock,
            payload_round_trips,
            elections_share_one_table,
            a_slot_is_claimed_once,
            a_slot_claim_needs_the_term,
            a_slot_whose_run_did_not_succeed_may_be_retried,
            concurrent_slot_claims_one_wins,
            batched_claims_decide_each_row_on_its_own,
            batched_renewals_are_guarded_per_row,
            batched_releases_and_reads,
            a_large_batch_answers_in_order,
            concurrent_batched_claims_one_wins_each,
        );
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                let store = $make;
                $crate::storetest::$case(&store);
            }
        )*
    };
    (@operator_cases $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                let (store, operator) = $make;
                $crate::storetest::$case(&store, &operator);
            }
        )*
    };
}

/// A fresh election name, unique across processes sharing a table.
pub fn fresh_name(case: &str) -> String {
    let mut r = [0u8; 6];
    getrandom::fill(&mut r).expect("system randomness");
    let tag: String = r.iter().map(|b| format!("{b:02x}")).collect();
    format!("storetest/{case}/{tag}")
}

fn acquire(s: &dyn Store, name: &str, id: &str, ttl: Duration, payload: &[u8]) -> Lease {
    s.acquire(name, id, ttl, payload, TIMEOUT).unwrap_or_else(|e| panic!("acquire({name}, {id}) failed: {e}"))
}

fn inspect(s: &dyn Store, name: &str) -> Lease {
    s.inspect(name, TIMEOUT).unwrap_or_else(|e| panic!("inspect({name}) failed: {e}"))
}

/// Polls `inspect` until the database reports the lease expired.
fn wait_expired(s: &dyn Store, name: &str) -> Lease {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let l = inspect(s, name);
        if l.expired() {
            return l;
        }
        assert!(Instant::now() < deadline, "lease {name} still valid after 10 s: {l:?}");
        thread::sleep(Duration::from_millis(20));
    }
}

/// The row with `now` cleared, for comparing what a statement left behind.
fn row(l: &Lease) -> (String, String, u64, crate::DbTime, crate::DbTime, crate::DbTime, Vec<u8>) {
    (l.name.clone(), l.holder.clone(), l.fence, l.acquired_at, l.renewed_at, l.expires_at, l.payload.clone())
}

/// Claiming an absent election wins with a fence (at least 1), the asked
/// TTL, and times read by one statement.
pub fn first_claim_wins_with_a_fence(s: &dyn Store) {
    let name = fresh_name("first");
    let l = acquire(s, &name, "a", LONG, b"p");
    assert!(l.held_by("a"), "first claim must win: {l:?}");
    assert_eq!(l.name, name);
    assert!(l.fence >= 1, "fences start at 1: {l:?}");
    assert_eq!(l.acquired_at, l.now, "acquired_at is the statement's now");
    assert_eq!(l.renewed_at, l.now, "renewed_at is the statement's now");
    assert_eq!(l.ttl(), LONG, "expires_at = now + ttl, both from the database");
    assert_eq!(l.payload, b"p");
}

/// A holder that acquires again keeps its fence and term start, and gets a
/// new expiry and payload.
pub fn holder_reacquiring_keeps_its_term(s: &dyn Store) {
    let name = fresh_name("reacquire");
    let first = acquire(s, &name, "a", LONG, b"1");
    let again = acquire(s, &name, "a", LONG, b"2");
    assert!(again.held_by("a"));
    assert_eq!(again.fence, first.fence, "re-acquiring a valid own lease keeps the fence");
    assert_eq!(again.acquired_at, first.acquired_at, "and the term's start");
    assert!(again.expires_at >= first.expires_at, "and extends it");
    assert_eq!(again.payload, b"2");
}

/// Losing is not an error: the loser learns who leads, and the row is left
/// exactly as it was.
pub fn loser_leaves_the_row_untouched(s: &dyn Store) {
    let name = fresh_name("loser");
    let won = acquire(s, &name, "a", LONG, b"mine");
    let lost = acquire(s, &name, "b", LONG, b"theirs");
    assert!(!lost.held_by("b"), "b must not win a valid lease held by a: {lost:?}");
    assert_eq!(row(&lost), row(&won), "the loser is told the holder's row");
    assert_eq!(row(&inspect(s, &name)), row(&won), "the losing acquire changed the row");
}

/// Once the database says the lease expired, another participant claims it
/// in one step, with a higher fence; the old holder can no longer renew.
pub fn atomic_takeover_after_expiry(s: &dyn Store) {
    let name = fresh_name("takeover");
    let a = acquire(s, &name, "a", SHORT, b"");
    wait_expired(s, &name);
    let b = acquire(s, &name, "b", LONG, b"b");
    assert!(b.held_by("b"), "an expired lease must be claimable: {b:?}");
    assert!(b.fence > a.fence, "a takeover must advance the fence: {} -> {}", a.fence, b.fence);
    assert_eq!(b.acquired_at, b.now, "a takeover starts a new term");
    let e = s.renew(&name, "a", a.fence, LONG, b"", TIMEOUT).expect_err("old holder renewed a lease it lost");
    assert!(e.is_lease_lost(), "old holder's renew must be LeaseLost, got {e:?}");
    let back = acquire(s, &name, "a", LONG, b"");
    assert!(!back.held_by("a") && back.holder == "b", "old holder must see the new one: {back:?}");
}

/// A released lease is claimable at once, with a higher fence, and the
/// release stamped `renewed_at` with its own instant.
pub fn takeover_after_release(s: &dyn Store) {
    let name = fresh_name("release");
    let a = acquire(s, &name, "a", LONG, b"");
    s.release(&name, "a", a.fence, TIMEOUT).expect("release");
    let after = inspect(s, &name);
    assert!(after.expired(), "release sets expires_at to now: {after:?}");
    assert_eq!((after.holder.as_str(), after.fence), ("a", a.fence), "release keeps the row and its fence");
    // So that a renewal whose clock reading is older cannot land after it.
    assert!(after.renewed_at >= after.expires_at, "release stamps renewed_at with its instant: {after:?}");
    let b = acquire(s, &name, "b", LONG, b"");
    assert!(b.held_by("b"));
    assert!(b.fence > a.fence, "a claim after a release is a new term: {} -> {}", a.fence, b.fence);
    // Reclaiming one's own released lease is also a new term.
    s.release(&name, "b", b.fence, TIMEOUT).expect("release");
    let b2 = acquire(s, &name, "b", LONG, b"");
    assert!(b2.fence > b.fence, "reclaiming a released own lease is a new term: {} -> {}", b.fence, b2.fence);
}

/// Across claims, releases, expiries and renewals, fences only grow, and
/// grow exactly when a new term starts.
pub fn fences_never_repeat_or_go_backwards(s: &dyn Store) {
    let name = fresh_name("fences");
    let ids = ["a", "b", "c"];
    let mut last = 0u64;
    let mut seen = Vec::new();
    for round in 0..9 {
        let id = ids[round % 3];
        let l = acquire(s, &name, id, LONG, b"");
        assert!(l.held_by(id), "round {round}: {id} must win a released lease: {l:?}");
        assert!(l.fence > last, "round {round}: fence went from {last} to {}", l.fence);
        assert!(!seen.contains(&l.fence), "fence {} repeated", l.fence);
        seen.push(l.fence);
        let r = s.renew(&name, id, l.fence, LONG, b"", TIMEOUT).expect("renew");
        assert_eq!(r.fence, l.fence, "renew never changes the fence");
        last = l.fence;
        s.release(&name, id, l.fence, TIMEOUT).expect("release");
    }
    let l = acquire(s, &name, "a", SHORT, b"");
    wait_expired(s, &name);
    let m = acquire(s, &name, "a", LONG, b"");
    assert!(
        l.fence > last && m.fence > l.fence,
        "expiry then reclaim by the same holder is a new term: {last}, {}, {}",
        l.fence,
        m.fence
    );
}

/// Renew applies only to the holder, with its fence, before expiry, and
/// fails with LeaseLost rather than succeeding silently otherwise.
pub fn renew_is_guarded(s: &dyn Store) {
    let name = fresh_name("renew");
    let a = acquire(s, &name, "a", LONG, b"");
    let lost = |r: Result<Lease, crate::StoreError>, what: &str| match r {
        Err(e) if e.is_lease_lost() => {}
        other => panic!("{what}: expected LeaseLost, got {other:?}"),
    };
    lost(s.renew(&name, "b", a.fence, LONG, b"", TIMEOUT), "renew by another identity");
    lost(s.renew(&name, "a", a.fence + 1, LONG, b"", TIMEOUT), "renew with a later fence");
    lost(s.renew(&name, "a", a.fence.saturating_sub(1), LONG, b"", TIMEOUT), "renew with an earlier fence");
    lost(s.renew(&fresh_name("absent"), "a", 1, LONG, b"", TIMEOUT), "renew of an absent election");
    assert_eq!(row(&inspect(s, &name)), row(&a), "failed renewals changed the row");
    let r = s.renew(&name, "a", a.fence, LONG, b"x", TIMEOUT).expect("the holder's renew");
    assert_eq!(r.ttl(), LONG, "renew sets expires_at = now + ttl");
    assert_eq!(r.acquired_at, a.acquired_at, "renew keeps the term start");
    assert_eq!(r.renewed_at, r.now);
    assert_eq!(r.fence, a.fence, "renew keeps the fence");
    s.release(&name, "a", a.fence, TIMEOUT).expect("release");
    let a1 = acquire(s, &name, "a", SHORT, b"");
    let r = s.renew(&name, "a", a1.fence, SHORT, b"", TIMEOUT).expect("the holder's renew");
    assert_eq!(r.ttl(), SHORT, "renew sets expires_at = now + ttl");
    wait_expired(s, &name);
    lost(s.renew(&name, "a", a1.fence, LONG, b"", TIMEOUT), "renew after expiry");
    let a2 = acquire(s, &name, "a", LONG, b"");
    s.release(&name, "a", a2.fence, TIMEOUT).expect("release");
    lost(s.renew(&name, "a", a2.fence, LONG, b"", TIMEOUT), "renew after release");
}

/// A renewal, or an acquire by the holder, never moves the expiry backwards:
/// it writes the later of the current expiry and `now + ttl`. (A renewal the
/// server delayed behind a lock or a freeze commits with an older `now`; it
/// must not shorten the lease under the deadline a newer renewal gave.) A
/// shorter TTL after a longer one has the same effect and stages it here.
pub fn no_write_moves_the_expiry_backwards(s: &dyn Store) {
    let name = fresh_name("expiry");
    let a = acquire(s, &name, "a", LONG, b"");
    let r = s.renew(&name, "a", a.fence, SHORT, b"r", TIMEOUT).expect("the holder's renew");
    assert!(
        r.expires_at >= a.expires_at,
        "a renewal moved the expiry back by {:?}",
        a.expires_at.saturating_duration_since(r.expires_at)
    );
    assert!(r.ttl() > SHORT, "the lease still runs to the longer expiry: {r:?}");
    assert_eq!((r.fence, r.renewed_at, r.payload.as_slice()), (a.fence, r.now, &b"r"[..]), "the renewal still applied");
    let again = acquire(s, &name, "a", SHORT, b"q");
    assert!(again.held_by("a") && again.fence == a.fence, "{again:?}");
    assert!(
        again.expires_at >= r.expires_at,
        "the holder's acquire moved the expiry back by {:?}",
        r.expires_at.saturating_duration_since(again.expires_at)
    );
    assert_eq!(again.payload, b"q");
    assert_eq!(row(&inspect(s, &name)), row(&again));
    // Release still ends the term at once, and a new term starts afresh.
    s.release(&name, "a", a.fence, TIMEOUT).expect("release");
    assert!(inspect(s, &name).expired(), "release must still end the term");
    let b = acquire(s, &name, "b", SHORT, b"");
    assert!(b.held_by("b") && b.fence > a.fence);
    assert_eq!(b.ttl(), SHORT, "a new term's expiry is its own now + ttl");
}

/// Releasing a lease one does not hold changes nothing and is not an error.
pub fn release_of_someone_elses_lease_is_a_noop(s: &dyn Store) {
    let name = fresh_name("noop");
    let a = acquire(s, &name, "a", LONG, b"a");
    s.release(&name, "b", a.fence, TIMEOUT).expect("releasing another's lease is not an error");
    s.release(&name, "a", a.fence + 1, TIMEOUT).expect("releasing with a wrong fence is not an error");
    s.release(&fresh_name("absent"), "a", 1, TIMEOUT).expect("releasing an absent election is not an error");
    let after = inspect(s, &name);
    assert_eq!(row(&after), row(&a), "a foreign release changed the row");
    assert!(after.held_by("a"));
    s.release(&name, "a", a.fence, TIMEOUT).expect("release");
    let released = inspect(s, &name);
    s.release(&name, "a", a.fence, TIMEOUT).expect("a second release is not an error");
    assert_eq!(row(&inspect(s, &name)), row(&released), "a second release moved the expiry again");
}

/// Inspect reports a missing election as NoLease and never changes a row.
pub fn inspect_never_writes(s: &dyn Store) {
    let name = fresh_name("inspect");
    match s.inspect(&name, TIMEOUT) {
        Err(e) if e.is_no_lease() => {}
        other => panic!("inspect of an absent election: expected NoLease, got {other:?}"),
    }
    match s.inspect(&name, TIMEOUT) {
        Err(e) if e.is_no_lease() => {}
        other => panic!("inspect must not create the row: got {other:?}"),
    }
    let a = acquire(s, &name, "a", LONG, b"p");
    let mut prev_now = a.now;
    for _ in 0..20 {
        let l = inspect(s, &name);
        assert_eq!(row(&l), row(&a), "inspect changed the row");
        assert!(l.now >= prev_now, "the database clock went backwards between statements");
        prev_now = l.now;
    }
}

/// Many threads claim one absent (then one released) election at once:
/// exactly one wins, and every loser is told the winner.
pub fn concurrent_acquire_exactly_one_wins(s: &dyn Store) {
    const N: usize = 8;
    for round in 0..3 {
        let name = fresh_name("race");
        let mut before = 0u64;
        for phase in 0..2 {
            let barrier = Arc::new(Barrier::new(N));
            let results: Vec<(String, Lease)> = thread::scope(|scope| {
                let handles: Vec<_> = (0..N)
                    .map(|i| {
                        let (barrier, name) = (Arc::clone(&barrier), name.clone());
                        scope.spawn(move || {
                            let id = format!("p{i}");
                            barrier.wait();
                            let l = acquire(s, &name, &id, LONG, id.as_bytes());
                            (id, l)
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().expect("acquiring thread panicked")).collect()
            });
            let winners: Vec<&str> =
                results.iter().filter(|(id, l)| l.held_by(id)).map(|(id, _)| id.as_str()).collect();
            assert_eq!(winners.len(), 1, "round {round} phase {phase}: exactly one must win, won: {winners:?}");
            let (winner, fence) = results.iter().find(|(id, _)| id == winners[0]).map(|(id, l)| (id, l.fence)).unwrap();
            assert!(fence > before, "round {round} phase {phase}: fence {before} -> {fence}");
            for (id, l) in &results {
                assert_eq!(
                    (l.holder.as_str(), l.fence, l.payload.as_slice()),
                    (winner.as_str(), fence, winner.as_bytes()),
                    "round {round} phase {phase}: {id} was told something other than the one winner's row"
                );
            }
            before = fence;
            let current = inspect(s, &name);
            assert_eq!(&current.holder, winner);
            s.release(&name, winner, current.fence, TIMEOUT).expect("release");
        }
    }
}

/// TTLs are measured on the database clock only: `expires_at - now` is
/// exactly what was asked, and the lease runs out when the database says so.
pub fn ttl_comes_from_the_database_clock(s: &dyn Store) {
    let name = fresh_name("ttl");
    for (i, ttl) in [Duration::from_micros(1_500_001), Duration::from_secs(3600), SHORT].into_iter().enumerate() {
        let l = acquire(s, &name, "a", ttl, b"");
        assert_eq!(l.ttl(), ttl, "acquire: ttl must be expires_at - now of one statement");
        let r = s.renew(&name, "a", l.fence, ttl, b"", TIMEOUT).expect("renew");
        assert_eq!(r.ttl(), ttl, "renew: ttl must be expires_at - now of one statement");
        if i < 2 {
            // A new term next, so a shorter TTL is not held up by this expiry.
            s.release(&name, "a", l.fence, TIMEOUT).expect("release");
        }
    }
    // The last lease (SHORT) runs down on the database clock, then expires.
    let first = inspect(s, &name);
    assert!(first.ttl() <= SHORT);
    let expired = wait_expired(s, &name);
    assert_eq!(expired.ttl(), Duration::ZERO);
    assert!(expired.now >= expired.expires_at, "expired means the database's now passed expires_at");
    assert!(expired.now > first.now, "the database clock moved");
}

/// Arbitrary bytes (including NUL, quotes, backslashes, invalid UTF-8 and a
/// large payload) come back exactly, through acquire, renew and inspect.
pub fn payload_round_trips(s: &dyn Store) {
    let name = fresh_name("payload");
    let all: Vec<u8> = (0..=255u8).collect();
    let big: Vec<u8> = (0..64 * 1024).map(|i| (i * 7 % 251) as u8).collect();
    let cases: [&[u8]; 5] = [b"", b"https://eu-west.internal:8443", b"'\\\0\"; DROP TABLE x; --\xff\xfe", &all, &big];
    let a = acquire(s, &name, "a", LONG, cases[0]);
    assert_eq!(a.payload, cases[0]);
    for p in cases {
        let r = s.renew(&name, "a", a.fence, LONG, p, TIMEOUT).expect("renew");
        assert_eq!(r.payload, p, "renew must return the payload it wrote");
        assert_eq!(inspect(s, &name).payload, p, "inspect must return the payload exactly");
        let again = acquire(s, &name, "a", LONG, p);
        assert_eq!(again.payload, p, "acquire must return the payload it wrote");
    }
    let other = acquire(s, &name, "b", LONG, b"nope");
    assert_eq!(other.payload, big, "a loser's payload must not be written");
}

/// Unrelated elections share one table: each has its own holder and fence,
/// and names that look like SQL are just names.
pub fn elections_share_one_table(s: &dyn Store) {
    let base = fresh_name("shared");
    let names = [
        format!("{base}/one"),
        format!("{base}/two"),
        format!("{base}/it's \\ \"quoted\"; DROP TABLE leases; --"),
        format!("{base}/ünïcødé ✓"),
    ];
    let ids = ["a", "b", "c'", "d\\"];
    let leases: Vec<Lease> = names.iter().zip(ids).map(|(n, id)| acquire(s, n, id, LONG, id.as_bytes())).collect();
    for ((n, id), l) in names.iter().zip(ids).zip(&leases) {
        assert!(l.held_by(id), "{id} must lead {n} independently: {l:?}");
        assert!(l.fence >= 1 && l.name == *n, "{l:?}");
    }
    s.release(&names[0], "a", leases[0].fence, TIMEOUT).expect("release");
    let one = acquire(s, &names[0], "b", LONG, b"");
    assert!(one.held_by("b") && one.fence > leases[0].fence, "{one:?}");
    for ((n, id), l) in names.iter().zip(ids).zip(&leases).skip(1) {
        let now = inspect(s, n);
        assert_eq!(row(&now), row(l), "{n} changed when another election did");
        assert!(now.held_by(id));
    }
    let lost = s.renew(&names[1], "a", leases[1].fence, LONG, b"", TIMEOUT);
    assert!(lost.is_err_and(|e| e.is_lease_lost()), "a holder of one election cannot renew another");
}

/// Claims, renews and releases one term for `id`; returns its fence.
fn one_term(s: &dyn Store, name: &str, id: &str) -> u64 {
    let l = acquire(s, name, id, LONG, id.as_bytes());
    assert!(l.held_by(id), "{id} must win a released or absent lease: {l:?}");
    let r = s.renew(name, id, l.fence, LONG, b"", TIMEOUT).unwrap_or_else(|e| panic!("renew by {id}: {e}"));
    assert_eq!(r.fence, l.fence);
    s.release(name, id, l.fence, TIMEOUT).unwrap_or_else(|e| panic!("release by {id}: {e}"));
    l.fence
}

/// Waits until the database clock has moved 2 ms past its reading of
/// election `name` now. Fences run ahead of the clock by one for each term
/// started within one clock tick (an in-memory store starts several in a
/// microsecond), so the operator cases let the clock pass them first, as any
/// real deletion or failover would.
fn let_the_clock_move(s: &dyn Store, name: &str) {
    let start = inspect(s, name).now;
    let deadline = Instant::now() + Duration::from_secs(10);
    while inspect(s, name).now.saturating_duration_since(start) < Duration::from_millis(2) {
        assert!(Instant::now() < deadline, "the database clock did not move in 10 s");
        thread::sleep(Duration::from_millis(1));
    }
}

/// A claim after `event`: its fence must be above every fence in `earlier`.
fn next_fence_is_higher(s: &dyn Store, name: &str, earlier: &[u64], event: &str) -> u64 {
    let l = acquire(s, name, "z", LONG, b"");
    assert!(l.held_by("z"), "after {event} the election must be claimable: {l:?}");
    eprintln!("storetest {name}: after {event}: fence {}, earlier {earlier:?}", l.fence);
    let highest = earlier.iter().copied().max().unwrap_or(0);
    assert!(
        l.fence > highest,
        "after {event} the next term got fence {}, not above the earlier fences {earlier:?}",
        l.fence
    );
    l.fence
}

/// An operator deletes the election's row, once between terms and once
/// under a live lease: every later claim gets a fence above every earlier
/// one (a store that starts a fresh row at 1 fails here).
pub fn fences_grow_across_a_deleted_row(s: &dyn Store, op: &dyn Operator) {
    let name = fresh_name("deleted");
    let mut fences = vec![one_term(s, &name, "a"), one_term(s, &name, "b")];
    let_the_clock_move(s, &name);
    op.delete_row(&name);
    assert!(s.inspect(&name, TIMEOUT).is_err_and(|e| e.is_no_lease()), "control: the row is gone");
    fences.push(next_fence_is_higher(s, &name, &fences, "the row was deleted between terms"));
    // Deleted while "z" still holds it.
    let_the_clock_move(s, &name);
    op.delete_row(&name);
    fences.push(next_fence_is_higher(s, &name, &fences, "the row was deleted under a live lease"));
}

/// An older copy of the row comes back (a failover to a replica that had
/// not seen the last terms): saved after term 1, restored after term 3. The
/// next claim's fence is above every earlier one, not term 1's + 1.
pub fn fences_grow_across_an_older_row_coming_back(s: &dyn Store, op: &dyn Operator) {
    let name = fresh_name("restored");
    let mut fences = vec![one_term(s, &name, "a")];
    let term1 = inspect(s, &name);
    assert!(term1.expired(), "term 1 was released: {term1:?}");
    fences.push(one_term(s, &name, "b"));
    fences.push(one_term(s, &name, "c"));
    let_the_clock_move(s, &name);
    op.restore_row(&term1);
    assert_eq!(row(&inspect(s, &name)), row(&term1), "control: the term-1 row is back");
    fences.push(next_fence_is_higher(s, &name, &fences, "the term-1 row came back"));
    // Once more under a live lease: the term "z" holds is lost with the failover.
    let_the_clock_move(s, &name);
    op.restore_row(&term1);
    fences.push(next_fence_is_higher(s, &name, &fences, "the term-1 row came back under a live lease"));
}

/// The table is dropped and created again (a botched migration, a restore
/// of the schema only): the next claim's fence is above every earlier one.
pub fn fences_grow_across_a_recreated_table(s: &dyn Store, op: &dyn Operator) {
    let name = fresh_name("recreated");
    let fences = [one_term(s, &name, "a"), one_term(s, &name, "b")];
    let other = fresh_name("recreated-other");
    let other_fence = one_term(s, &other, "a");
    let_the_clock_move(s, &name);
    op.recreate_table();
    assert!(s.inspect(&name, TIMEOUT).is_err_and(|e| e.is_no_lease()), "control: the table is empty");
    next_fence_is_higher(s, &name, &fences, "the table was re-created");
    next_fence_is_higher(s, &other, &[other_fence], "the table was re-created (another election)");
}

fn claim(s: &dyn Store, name: &str, id: &str, fence: u64, slot: &str, retry: bool) -> SlotClaim {
    s.claim_slot(name, id, fence, slot, retry, TIMEOUT)
        .unwrap_or_else(|e| panic!("claim_slot({name}, {id}, {fence}, {slot:?}) failed: {e}"))
}

/// A slot is claimed once across the election's terms: the term that
/// claims it gets `Claimed`, the same term asking again and every later
/// term get `Taken` with the claiming fence, and the run's outcome once
/// recorded. Slots are per election and per name (quotes and all).
pub fn a_slot_is_claimed_once(s: &dyn Store) {
    let name = fresh_name("slot-once");
    let slot = "2026-12-01 it's \\; -- ünï";
    let a = acquire(s, &name, "a", LONG, b"");
    assert_eq!(claim(s, &name, "a", a.fence, slot, false), SlotClaim::Claimed);
    assert_eq!(claim(s, &name, "a", a.fence, slot, false), SlotClaim::Taken { fence: a.fence, outcome: None });
    assert_eq!(claim(s, &name, "a", a.fence, "another slot", false), SlotClaim::Claimed);
    assert!(s.finish_slot(&name, a.fence, slot, 0, TIMEOUT).expect("finish_slot"), "the run records its outcome");
    s.release(&name, "a", a.fence, TIMEOUT).expect("release");
    let b = acquire(s, &name, "b", LONG, b"");
    assert!(b.held_by("b"));
    assert_eq!(claim(s, &name, "b", b.fence, slot, false), SlotClaim::Taken { fence: a.fence, outcome: Some(0) });
    assert_eq!(claim(s, &name, "b", b.fence, slot, true), SlotClaim::Taken { fence: a.fence, outcome: Some(0) });
    // Another election's slot of the same name is its own.
    let other = fresh_name("slot-other");
    let o = acquire(s, &other, "b", LONG, b"");
    assert_eq!(claim(s, &other, "b", o.fence, slot, false), SlotClaim::Claimed);
    assert!(!s.finish_slot(&name, b.fence, slot, 0, TIMEOUT).expect("finish_slot"), "b never had the slot");
    assert!(!s.finish_slot(&name, a.fence, "never claimed", 0, TIMEOUT).expect("finish_slot"));
}

/// Only the live term may claim a slot: another identity, another fence,
/// or a lease that has expired or was released get LeaseLost, and nothing
/// is recorded (the holder claims the slot afterwards).
pub fn a_slot_claim_needs_the_term(s: &dyn Store) {
    let name = fresh_name("slot-term");
    let a = acquire(s, &name, "a", SHORT, b"");
    for (id, fence) in [("b", a.fence), ("a", a.fence + 1), ("a", a.fence - 1)] {
        let r = s.claim_slot(&name, id, fence, "s", false, TIMEOUT);
        assert!(r.as_ref().is_err_and(StoreError::is_lease_lost), "{id}/{fence}: {r:?}");
    }
    wait_expired(s, &name);
    let r = s.claim_slot(&name, "a", a.fence, "s", false, TIMEOUT);
    assert!(r.as_ref().is_err_and(StoreError::is_lease_lost), "an expired lease claimed a slot: {r:?}");
    let b = acquire(s, &name, "b", LONG, b"");
    s.release(&name, "b", b.fence, TIMEOUT).expect("release");
    let r = s.claim_slot(&name, "b", b.fence, "s", false, TIMEOUT);
    assert!(r.as_ref().is_err_and(StoreError::is_lease_lost), "a released lease claimed a slot: {r:?}");
    let c = acquire(s, &name, "c", LONG, b"");
    assert_eq!(claim(s, &name, "c", c.fence, "s", false), SlotClaim::Claimed, "nothing was recorded before");
    let r = s.claim_slot("storetest/no-such-election", "c", c.fence, "s", false, TIMEOUT);
    assert!(r.as_ref().is_err_and(StoreError::is_lease_lost), "{r:?}");
}

/// A run that did not record success (it failed, or recorded nothing: it
/// was killed) may be claimed again by a later term that asks to retry;
/// not by one that does not, nor by its own term, and never once a run
/// succeeded. The run that lost its slot can no longer record an outcome.
pub fn a_slot_whose_run_did_not_succeed_may_be_retried(s: &dyn Store) {
    let name = fresh_name("slot-retry");
    let a = acquire(s, &name, "a", LONG, b"");
    assert_eq!(claim(s, &name, "a", a.fence, "failed", false), SlotClaim::Claimed);
    assert_eq!(claim(s, &name, "a", a.fence, "killed", false), SlotClaim::Claimed);
    assert!(s.finish_slot(&name, a.fence, "failed", 3, TIMEOUT).unwrap());
    assert_eq!(claim(s, &name, "a", a.fence, "failed", true), SlotClaim::Taken { fence: a.fence, outcome: Some(3) });
    s.release(&name, "a", a.fence, TIMEOUT).expect("release");
    let b = acquire(s, &name, "b", LONG, b"");
    assert_eq!(claim(s, &name, "b", b.fence, "failed", false), SlotClaim::Taken { fence: a.fence, outcome: Some(3) });
    assert_eq!(claim(s, &name, "b", b.fence, "killed", false), SlotClaim::Taken { fence: a.fence, outcome: None });
    assert_eq!(claim(s, &name, "b", b.fence, "failed", true), SlotClaim::Claimed);
    assert_eq!(claim(s, &name, "b", b.fence, "killed", true), SlotClaim::Claimed);
    assert_eq!(claim(s, &name, "b", b.fence, "killed", true), SlotClaim::Taken { fence: b.fence, outcome: None });
    assert!(!s.finish_slot(&name, a.fence, "failed", 0, TIMEOUT).unwrap(), "the run that lost its slot recorded");
    assert!(s.finish_slot(&name, b.fence, "failed", 0, TIMEOUT).unwrap());
    s.release(&name, "b", b.fence, TIMEOUT).expect("release");
    let c = acquire(s, &name, "c", LONG, b"");
    assert_eq!(claim(s, &name, "c", c.fence, "failed", true), SlotClaim::Taken { fence: b.fence, outcome: Some(0) });
}

/// Many threads of the live term claim one slot at once: exactly one is
/// told `Claimed`.
pub fn concurrent_slot_claims_one_wins(s: &dyn Store) {
    const N: usize = 8;
    let name = fresh_name("slot-race");
    let a = acquire(s, &name, "a", LONG, b"");
    let barrier = Arc::new(Barrier::new(N));
    let claims: Vec<SlotClaim> = thread::scope(|scope| {
        let handles: Vec<_> = (0..N)
            .map(|_| {
                let (barrier, name) = (Arc::clone(&barrier), name.clone());
                scope.spawn(move || {
                    barrier.wait();
                    claim(s, &name, "a", a.fence, "s", false)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("claiming thread panicked")).collect()
    });
    let won = claims.iter().filter(|c| c.is_claimed()).count();
    assert_eq!(won, 1, "{claims:?}");
    assert!(claims.iter().all(|c| c.is_claimed() || *c == SlotClaim::Taken { fence: a.fence, outcome: None }));
}

// ---- batched calls (crate::batch) ----

fn item<'a>(name: &'a str, fence: u64, payload: &'a [u8]) -> BatchItem<'a> {
    BatchItem { name, fence, payload }
}

fn answers<T>(what: &str, out: &[Result<T, StoreError>], len: usize) {
    assert_eq!(out.len(), len, "{what} must answer once per item, in order");
}

/// A batched claim decides each election by its own row, as `acquire`
/// would: an absent row is claimed, another holder's valid lease is left
/// exactly as it was, an expired one is taken with a higher fence, and
/// the caller's own valid lease keeps its term.
pub fn batched_claims_decide_each_row_on_its_own(s: &dyn Store) {
    let base = fresh_name("batch-claim");
    let names = [format!("{base}/absent"), format!("{base}/theirs"), format!("{base}/expired"), format!("{base}/mine")];
    let theirs = acquire(s, &names[1], "b", LONG, b"b");
    let expired = acquire(s, &names[2], "b", SHORT, b"b");
    let mine = acquire(s, &names[3], "a", LONG, b"old");
    wait_expired(s, &names[2]);
    let items: Vec<BatchItem<'_>> = names.iter().map(|n| item(n, 0, b"new")).collect();
    let out = s.acquire_many("a", LONG, &items, TIMEOUT);
    answers("acquire_many", &out, 4);
    let got: Vec<Lease> = out
        .into_iter()
        .zip(&names)
        .map(|(r, n)| r.unwrap_or_else(|e| panic!("acquire_many: {n} failed: {e}")))
        .collect();
    for (l, n) in got.iter().zip(&names) {
        assert_eq!(&l.name, n, "answers come in the items' order");
    }
    let (absent, taken, claimed, own) = (&got[0], &got[1], &got[2], &got[3]);
    assert!(absent.held_by("a") && absent.fence >= 1 && absent.ttl() == LONG, "absent row claimed: {absent:?}");
    assert_eq!(absent.payload, b"new");
    assert_eq!(row(taken), row(&theirs), "another holder's valid lease must be left as it was");
    assert_eq!(row(&inspect(s, &names[1])), row(&theirs), "and not written");
    assert!(claimed.held_by("a") && claimed.fence > expired.fence, "an expired lease is a new term: {claimed:?}");
    assert_eq!(claimed.acquired_at, claimed.now);
    assert!(own.held_by("a") && own.fence == mine.fence, "the holder keeps its term: {own:?}");
    assert!(own.expires_at >= mine.expires_at && own.payload == b"new", "{own:?}");
    assert_eq!(own.acquired_at, mine.acquired_at);
    assert!(s.acquire_many("a", LONG, &[], TIMEOUT).is_empty(), "an empty batch answers nothing");
}

/// A batched renewal is guarded per row: a term the caller still holds is
/// extended with the new payload; another holder's row, a wrong fence and
/// an absent row each fail with LeaseLost on their own and are not written.
pub fn batched_renewals_are_guarded_per_row(s: &dyn Store) {
    let base = fresh_name("batch-renew");
    let names = [format!("{base}/held"), format!("{base}/taken"), format!("{base}/fence"), format!("{base}/absent")];
    let held = acquire(s, &names[0], "a", LONG, b"");
    let lost = acquire(s, &names[1], "a", SHORT, b"");
    let wrong = acquire(s, &names[2], "a", LONG, b"w");
    wait_expired(s, &names[1]);
    let taken = acquire(s, &names[1], "b", LONG, b"b");
    assert!(taken.held_by("b"));
    let items = [
        item(&names[0], held.fence, b"r0"),
        item(&names[1], lost.fence, b"r1"),
        item(&names[2], wrong.fence + 1, b"r2"),
        item(&names[3], 7, b"r3"),
    ];
    let out = s.renew_many("a", LONG, &items, TIMEOUT);
    answers("renew_many", &out, 4);
    match &out[0] {
        Ok(l) => {
            assert!(l.held_by("a") && l.fence == held.fence && l.ttl() == LONG && l.payload == b"r0", "{l:?}");
            assert_eq!(&l.name, &names[0]);
        }
        Err(e) => panic!("renew_many: the held term must renew, got {e}"),
    }
    for (k, what) in [(1, "a lease another holder took"), (2, "a wrong fence"), (3, "an absent row")] {
        assert!(out[k].as_ref().is_err_and(StoreError::is_lease_lost), "{what} must be LeaseLost: {:?}", out[k]);
    }
    assert_eq!(row(&inspect(s, &names[1])), row(&taken), "the other holder's row was written");
    assert_eq!(row(&inspect(s, &names[2])), row(&wrong), "a wrong fence's row was written");
    assert!(s.inspect(&names[3], TIMEOUT).is_err_and(|e| e.is_no_lease()), "a renewal created a row");
    let renewed = out[0].as_ref().expect("checked above");
    assert_eq!(renewed.acquired_at, held.acquired_at, "renew_many keeps the term start");
    assert_eq!(renewed.renewed_at, renewed.now, "renewed_at is the statement's now");
    assert_eq!(row(renewed), row(&inspect(s, &names[0])), "renew_many answered another row than it wrote");
}

/// A batched release ends the caller's terms (the row and fence stay) and
/// leaves another holder's alone; a batched read answers each name, a
/// missing one with NoLease, and writes nothing.
pub fn batched_releases_and_reads(s: &dyn Store) {
    let base = fresh_name("batch-release");
    let names = [format!("{base}/mine"), format!("{base}/theirs"), format!("{base}/missing")];
    let mine = acquire(s, &names[0], "a", LONG, b"");
    let theirs = acquire(s, &names[1], "b", LONG, b"");
    let out = s.release_many("a", &[item(&names[0], mine.fence, b""), item(&names[1], theirs.fence, b"")], TIMEOUT);
    answers("release_many", &out, 2);
    assert!(out.iter().all(Result::is_ok), "releases answer Ok, also for a lease not held: {out:?}");
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let read = s.inspect_many(&refs, TIMEOUT);
    answers("inspect_many", &read, 3);
    let released = read[0].as_ref().expect("inspect_many of a released row");
    assert!(released.expired() && released.fence == mine.fence && released.holder == "a", "{released:?}");
    assert!(released.renewed_at >= released.expires_at, "a release stamps renewed_at: {released:?}");
    assert_eq!(row(read[1].as_ref().expect("inspect_many")), row(&theirs), "another holder's lease was released");
    assert!(read[2].as_ref().is_err_and(StoreError::is_no_lease), "a missing row: {:?}", read[2]);
    let again = s.inspect_many(&refs, TIMEOUT);
    for (a, b) in read.iter().zip(&again).take(2) {
        assert_eq!(row(a.as_ref().unwrap()), row(b.as_ref().unwrap()), "inspect_many wrote a row");
    }
    assert!(s.inspect_many(&[], TIMEOUT).is_empty() && s.release_many("a", &[], TIMEOUT).is_empty());
}

/// Hundreds of elections in one batch, names that look like SQL among
/// them: every answer belongs to its item, in order, whatever order the
/// names come in, through claims, renewals, reads and releases.
pub fn a_large_batch_answers_in_order(s: &dyn Store) {
    const N: usize = 300;
    let base = fresh_name("batch-large");
    let names: Vec<String> = (0..N)
        .map(|i| match i % 3 {
            0 => format!("{base}/{i:03}"),
            1 => format!("{base}/it's \\ \"{i}\"; DROP TABLE leases; --"),
            _ => format!("{base}/ünïcødé ✓ {i}"),
        })
        .rev()
        .collect();
    for n in names.iter().skip(1).step_by(2) {
        acquire(s, n, "b", LONG, b"b");
    }
    let items: Vec<BatchItem<'_>> = names.iter().map(|n| item(n, 0, n.as_bytes())).collect();
    let out = s.acquire_many("a", LONG, &items, TIMEOUT);
    answers("acquire_many", &out, N);
    let mut fences = Vec::new();
    for (i, (r, n)) in out.iter().zip(&names).enumerate() {
        let l = r.as_ref().unwrap_or_else(|e| panic!("acquire_many item {i}: {e}"));
        assert_eq!(&l.name, n, "item {i} answered for another election");
        assert_eq!(l.held_by("a"), i % 2 == 0, "item {i}: {l:?}");
        if i % 2 == 0 {
            assert_eq!(l.payload, n.as_bytes(), "item {i}'s payload");
            fences.push(l.fence);
        }
    }
    let mine: Vec<&String> = names.iter().step_by(2).collect();
    let payloads: Vec<String> = (0..mine.len()).map(|i| format!("r{i}")).collect();
    let renew: Vec<BatchItem<'_>> =
        mine.iter().zip(&fences).zip(&payloads).map(|((n, f), p)| item(n, *f, p.as_bytes())).collect();
    let out = s.renew_many("a", LONG, &renew, TIMEOUT);
    answers("renew_many", &out, mine.len());
    for (i, r) in out.iter().enumerate() {
        let l = r.as_ref().unwrap_or_else(|e| panic!("renew_many item {i}: {e}"));
        assert!(&l.name == mine[i] && l.fence == fences[i] && l.payload == payloads[i].as_bytes(), "item {i}: {l:?}");
    }
    let refs: Vec<&str> = mine.iter().map(|n| n.as_str()).collect();
    for (i, (r, back)) in out.iter().zip(s.inspect_many(&refs, TIMEOUT)).enumerate() {
        let back = back.unwrap_or_else(|e| panic!("inspect_many {}: {e}", refs[i]));
        assert_eq!(row(r.as_ref().unwrap()), row(&back), "renew_many item {i} answered another row than it wrote");
    }
    let mut shuffled: Vec<&str> = names.iter().map(String::as_str).collect();
    shuffled.rotate_left(N / 3);
    let read = s.inspect_many(&shuffled, TIMEOUT);
    answers("inspect_many", &read, N);
    for (r, n) in read.iter().zip(&shuffled) {
        assert_eq!(r.as_ref().map(|l| l.name.as_str()).unwrap_or_else(|e| panic!("inspect_many {n}: {e}")), *n);
    }
    let out = s.release_many("a", &renew, TIMEOUT);
    answers("release_many", &out, mine.len());
    for (r, n) in s.inspect_many(&refs, TIMEOUT).iter().zip(&refs) {
        let l = r.as_ref().unwrap_or_else(|e| panic!("inspect_many {n}: {e}"));
        assert!(l.expired(), "{n} was not released: {l:?}");
    }
}

/// Several participants claim the same elections in one batch each, in
/// different orders, at once: every election has exactly one winner, each
/// participant is told that winner, and no batch fails (a store must take
/// its row locks in one order, so two batches cannot deadlock).
pub fn concurrent_batched_claims_one_wins_each(s: &dyn Store) {
    const N: usize = 4;
    const ELECTIONS: usize = 40;
    let base = fresh_name("batch-race");
    let names: Vec<String> = (0..ELECTIONS).map(|i| format!("{base}/{i:02}")).collect();
    let barrier = Arc::new(Barrier::new(N));
    let results: Vec<(String, Vec<Lease>)> = thread::scope(|scope| {
        let handles: Vec<_> = (0..N)
            .map(|t| {
                let (barrier, names) = (Arc::clone(&barrier), &names);
                scope.spawn(move || {
                    let id = format!("p{t}");
                    let mut order: Vec<usize> = (0..ELECTIONS).collect();
                    order.rotate_left(t * ELECTIONS / N);
                    if t % 2 == 1 {
                        order.reverse();
                    }
                    let items: Vec<BatchItem<'_>> = order.iter().map(|&i| item(&names[i], 0, id.as_bytes())).collect();
                    barrier.wait();
                    let out = s.acquire_many(&id, LONG, &items, TIMEOUT);
                    answers("acquire_many", &out, ELECTIONS);
                    let mut by_index: Vec<Option<Lease>> = vec![None; ELECTIONS];
                    for (&i, r) in order.iter().zip(out) {
                        by_index[i] =
                            Some(r.unwrap_or_else(|e| panic!("{id}: acquire_many of {} failed: {e}", names[i])));
                    }
                    (id, by_index.into_iter().map(Option::unwrap).collect())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("claiming thread panicked")).collect()
    });
    for (i, n) in names.iter().enumerate() {
        let winners: Vec<&str> =
            results.iter().filter(|(id, ls)| ls[i].held_by(id)).map(|(id, _)| id.as_str()).collect();
        assert_eq!(winners.len(), 1, "{n}: exactly one must win, won: {winners:?}");
        let current = inspect(s, n);
        for (id, ls) in &results {
            assert_eq!(
                (ls[i].holder.as_str(), ls[i].fence),
                (winners[0], current.fence),
                "{id} was told another row of {n}"
            );
        }
    }
}

// ---- group members (Store::heartbeat, Store::leave_group) ----

/// Every case that needs group members, in the order
/// [`run_member_cases`] runs them. A store that keeps no members (the
/// trait's default) fails them; groups without a fair share do not need
/// them.
pub const MEMBER_CASES: &[(&str, Case)] = &[
    ("heartbeats_count_live_members", heartbeats_count_live_members),
    ("a_member_that_leaves_is_counted_out_at_once", a_member_that_leaves_is_counted_out_at_once),
    ("heartbeats_rank_live_members_by_their_bytes", heartbeats_rank_live_members_by_their_bytes),
    ("heartbeats_sum_what_live_members_lead", heartbeats_sum_what_live_members_lead),
    ("renewals_go_with_a_heartbeat", renewals_go_with_a_heartbeat),
];

/// Runs every case in [`MEMBER_CASES`] against `store`.
///
/// # Panics
///
/// On the first case that fails, naming it.
pub fn run_member_cases(store: &dyn Store) {
    for (name, case) in MEMBER_CASES {
        run_one(name, || case(store));
    }
}

fn beat(s: &dyn Store, group: &str, member: &str, ttl: Duration) -> crate::Members {
    leads(s, group, member, 0, ttl)
}

fn leads(s: &dyn Store, group: &str, member: &str, n: u32, ttl: Duration) -> crate::Members {
    s.heartbeat(group, member, n, ttl, TIMEOUT).unwrap_or_else(|e| panic!("heartbeat({group}, {member}) failed: {e}"))
}

/// [`Store::renew_many_with_heartbeat`] does what [`Store::renew_many`] and
/// [`Store::heartbeat`] do apart: each item renewed, or refused, by its own
/// row (a wrong fence is `LeaseLost` and leaves the row as it was), and the
/// member's heartbeat written and answered (another member then counts
/// it).
pub fn renewals_go_with_a_heartbeat(s: &dyn Store) {
    let group = fresh_name("members-renew");
    let names = [fresh_name("renew-beat-a"), fresh_name("renew-beat-b")];
    let me = "renewer";
    let claim = |n: &str| s.acquire(n, me, LONG, b"p", TIMEOUT).unwrap_or_else(|e| panic!("acquire {n}: {e}"));
    let (a, b) = (claim(&names[0]), claim(&names[1]));
    assert_eq!(beat(s, &group, "other", LONG).live, 1);
    let items = [
        BatchItem { name: &names[0], fence: a.fence, payload: b"q" },
        BatchItem { name: &names[1], fence: b.fence + 1, payload: b"q" },
    ];
    let beat_of = Heartbeat { group: &group, leading: 2, ttl: LONG };
    let (out, members) = s.renew_many_with_heartbeat(me, LONG, &items, beat_of, TIMEOUT);
    assert_eq!(out.len(), 2, "one answer per item");
    let r = out[0].as_ref().unwrap_or_else(|e| panic!("the renewal under the right fence failed: {e}"));
    assert!(r.held_by(me) && r.fence == a.fence && r.payload == b"q", "renewed as renew_many renews: {r:?}");
    assert!(out[1].as_ref().is_err_and(StoreError::is_lease_lost), "a wrong fence must be LeaseLost: {:?}", out[1]);
    let still = s.inspect(&names[1], TIMEOUT).unwrap_or_else(|e| panic!("inspect: {e}"));
    assert_eq!((still.fence, still.payload.as_slice()), (b.fence, &b"p"[..]), "the refused row as it was");
    let m = members.unwrap_or_else(|e| panic!("the heartbeat with the renewals failed: {e}"));
    assert_eq!(m.live, 2, "the renewer counted with the other member");
    if m.led.is_some() {
        assert_eq!((m.led, m.most), (Some(2), Some(2)), "the renewer's report and the other's 0");
    }
    assert_eq!(beat(s, &group, "third", LONG).live, 3, "the renewer's heartbeat was written");
}

/// A heartbeat that tells what the members lead tells the sum and the
/// most of the live members' last reports, this one's as it just wrote
/// it: a report replaces the member's last, an expired member's report
/// no longer counts, nor another group's. A store that tells none passes.
pub fn heartbeats_sum_what_live_members_lead(s: &dyn Store) {
    let group = fresh_name("members-lead");
    let other = fresh_name("members-lead-other");
    leads(s, &other, "x", 1_000, LONG);
    let first = leads(s, &group, "gone", 7, SHORT);
    if first.led.is_none() {
        return;
    }
    assert_eq!((first.led, first.most), (Some(7), Some(7)), "the first member's own report");
    let m = leads(s, &group, "a", 3, LONG);
    let (with_gone, without) = ((Some(10), Some(7)), (Some(3), Some(3)));
    assert!([with_gone, without].contains(&(m.led, m.most)), "a's report and gone's, if gone still lives: {m:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = leads(s, &group, "b", 5, LONG);
        if m.led == Some(8) {
            assert_eq!(m.most, Some(5), "the most of a's 3 and b's 5 once gone expired");
            break;
        }
        assert_eq!((m.led, m.most), (Some(15), Some(7)), "gone 7, a 3, b 5");
        assert!(Instant::now() < deadline, "an expired member's report still counts after 10 s");
        thread::sleep(Duration::from_millis(20));
    }
    let m = leads(s, &group, "a", u32::MAX, LONG);
    assert_eq!((m.led, m.most), (Some(u64::from(u32::MAX) + 5), Some(u32::MAX)), "a's new report replaces its last");
    let m = leads(s, &group, "a", 0, LONG);
    assert_eq!((m.led, m.most), (Some(5), Some(5)), "and again");
}

/// A heartbeat counts the group's members alive on the database clock,
/// itself included; other groups are counted apart; a member whose
/// heartbeat expired is no longer counted, and counts again once it beats.
pub fn heartbeats_count_live_members(s: &dyn Store) {
    let group = fresh_name("members");
    let other = fresh_name("members-other");
    assert_eq!(beat(s, &group, "a", SHORT).live, 1, "the first member counts itself");
    assert_eq!(beat(s, &group, "b", LONG).live, 2);
    assert_eq!(beat(s, &group, "it's \\ \"c\"; --", LONG).live, 3, "members with any name");
    assert_eq!(beat(s, &other, "a", LONG).live, 1, "another group is counted apart");
    let again = beat(s, &group, "b", LONG);
    assert_eq!(again.live, 3, "a member beating again is counted once");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = beat(s, &group, "b", LONG);
        if m.live == 2 {
            assert!(m.now > again.now, "the database clock moved");
            break;
        }
        assert_eq!(m.live, 3);
        assert!(Instant::now() < deadline, "a member whose heartbeat expired is still counted after 10 s");
        thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(beat(s, &group, "a", LONG).live, 3, "an expired member counts again once it beats");
}

/// A heartbeat that tells a rank tells how many of the other live members
/// come before this one byte by byte (`"Z" < "a" < "b" < "é"`, whatever
/// the database's collation says), counting neither expired members nor
/// other groups'. A store that tells none passes.
pub fn heartbeats_rank_live_members_by_their_bytes(s: &dyn Store) {
    let group = fresh_name("members-rank");
    let other = fresh_name("members-rank-other");
    beat(s, &other, "0", LONG);
    let first = beat(s, &group, "A", SHORT);
    if first.rank.is_none() {
        return;
    }
    let order = ["Z", "a", "b", "\u{e9}"];
    for m in ["b", "\u{e9}", "a", "Z"] {
        beat(s, &group, m, LONG);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let ranks: Vec<Option<u32>> = order.iter().map(|m| beat(s, &group, m, LONG).rank).collect();
        // Each ranks after A while A lives, and A may expire between two
        // of the heartbeats, never to come back.
        let gone = ranks.iter().zip(0..).position(|(r, k)| *r == Some(k)).unwrap_or(order.len());
        let want: Vec<Option<u32>> = (0..).take(order.len()).map(|k| Some(k + u32::from(k < gone as u32))).collect();
        assert_eq!(ranks, want, "ranks of {order:?} after A (expired from the {gone}th on)");
        if gone == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "a member whose heartbeat expired still ranks after 10 s");
        thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(beat(s, &group, "A", LONG).rank, Some(0), "a member that beats again ranks again");
    assert_eq!(beat(s, &group, "Z", LONG).rank, Some(1));
}

/// A member that leaves is counted out at once by the next heartbeat of
/// another, and for good: a heartbeat of it that reaches the store after
/// the leave (sent before it, and slower), alone or with renewals, does
/// not count it in again, even when the leave came before any heartbeat
/// of it. Leaving a group one is not in changes nothing for the others.
pub fn a_member_that_leaves_is_counted_out_at_once(s: &dyn Store) {
    let group = fresh_name("members-leave");
    beat(s, &group, "a", LONG);
    assert_eq!(beat(s, &group, "b", LONG).live, 2);
    s.leave_group(&group, "a", TIMEOUT).expect("leave_group");
    assert_eq!(beat(s, &group, "b", LONG).live, 1, "a member that left is still counted");
    let late = beat(s, &group, "a", LONG);
    // `led` is optional (a store may not say): when told, the late member leads nothing.
    assert!(
        late.live == 1 && late.led.is_none_or(|led| led == 0),
        "a heartbeat after the leave counted its member in again: {late:?}"
    );
    let name = fresh_name("members-leave-renew");
    let items = [BatchItem { name: &name, fence: 1, payload: b"" }];
    let with = Heartbeat { group: &group, leading: 3, ttl: LONG };
    let (_, late) = s.renew_many_with_heartbeat("a", LONG, &items, with, TIMEOUT);
    let late = late.unwrap_or_else(|e| panic!("a heartbeat with renewals failed: {e}"));
    assert_eq!(late.live, 1, "a heartbeat with renewals after the leave counted its member in again");
    assert_eq!(beat(s, &group, "b", LONG).live, 1, "the member that left is counted again");
    s.leave_group(&group, "never-joined", TIMEOUT).expect("leaving a group one is not in");
    s.leave_group(&fresh_name("no-such-group"), "b", TIMEOUT).expect("leaving a group nobody is in");
    assert_eq!(beat(s, &group, "b", LONG).live, 1);
    beat(s, &group, "never-joined", LONG);
    assert_eq!(beat(s, &group, "b", LONG).live, 1, "a heartbeat after a leave that came first counted");
}
