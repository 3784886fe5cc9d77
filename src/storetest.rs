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
//! The store must keep real time (leases expire by themselves): the cases
//! that need an expiry use TTLs of a few hundred milliseconds and poll
//! [`Store::inspect`] until the database says the lease has expired. They
//! never compare a database time with the local clock.

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use crate::lease::Lease;
use crate::store::Store;

/// The timeout every call of the suite passes.
pub const TIMEOUT: Duration = Duration::from_secs(10);
/// A TTL long enough that no case sees it run out by accident.
pub const LONG: Duration = Duration::from_secs(60);
/// A TTL short enough to wait out.
pub const SHORT: Duration = Duration::from_millis(300);

/// One case of the suite.
pub type Case = fn(&dyn Store);

/// Every case, by name, in the order [`run_all`] runs them.
pub const CASES: &[(&str, Case)] = &[
    ("first_claim_gets_fence_one", first_claim_gets_fence_one),
    ("holder_reacquiring_keeps_its_term", holder_reacquiring_keeps_its_term),
    ("loser_leaves_the_row_untouched", loser_leaves_the_row_untouched),
    ("atomic_takeover_after_expiry", atomic_takeover_after_expiry),
    ("takeover_after_release", takeover_after_release),
    ("fences_never_repeat_or_go_backwards", fences_never_repeat_or_go_backwards),
    ("renew_is_guarded", renew_is_guarded),
    ("release_of_someone_elses_lease_is_a_noop", release_of_someone_elses_lease_is_a_noop),
    ("inspect_never_writes", inspect_never_writes),
    ("concurrent_acquire_exactly_one_wins", concurrent_acquire_exactly_one_wins),
    ("ttl_comes_from_the_database_clock", ttl_comes_from_the_database_clock),
    ("payload_round_trips", payload_round_trips),
    ("elections_share_one_table", elections_share_one_table),
];

/// Runs every case in [`CASES`] against `store`.
///
/// # Panics
///
/// On the first case that fails, naming it.
pub fn run_all(store: &dyn Store) {
    for (name, case) in CASES {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| case(store)));
        if let Err(e) = result {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default();
            panic!("storetest case {name} failed: {msg}");
        }
    }
}

/// Expands to one `#[test]` per case of the suite, each calling `$make` for
/// a fresh store (any expression whose value implements [`Store`]).
#[macro_export]
macro_rules! storetest_suite {
    ($make:expr) => {
        $crate::storetest_suite!(@cases $make;
            first_claim_gets_fence_one,
            holder_reacquiring_keeps_its_term,
            loser_leaves_the_row_untouched,
            atomic_takeover_after_expiry,
            takeover_after_release,
            fences_never_repeat_or_go_backwards,
            renew_is_guarded,
            release_of_someone_elses_lease_is_a_noop,
            inspect_never_writes,
            concurrent_acquire_exactly_one_wins,
            ttl_comes_from_the_database_clock,
            payload_round_trips,
            elections_share_one_table,
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

/// Claiming an absent election gives fence 1, the asked TTL, and times read
/// by one statement.
pub fn first_claim_gets_fence_one(s: &dyn Store) {
    let name = fresh_name("first");
    let l = acquire(s, &name, "a", LONG, b"p");
    assert!(l.held_by("a"), "first claim must win: {l:?}");
    assert_eq!((l.name.as_str(), l.fence), (name.as_str(), 1), "first claim gets fence 1");
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
/// in one step, with the next fence; the old holder can no longer renew.
pub fn atomic_takeover_after_expiry(s: &dyn Store) {
    let name = fresh_name("takeover");
    let a = acquire(s, &name, "a", SHORT, b"");
    wait_expired(s, &name);
    let b = acquire(s, &name, "b", LONG, b"b");
    assert!(b.held_by("b"), "an expired lease must be claimable: {b:?}");
    assert_eq!(b.fence, a.fence + 1, "a takeover advances the fence by one");
    assert_eq!(b.acquired_at, b.now, "a takeover starts a new term");
    let e = s.renew(&name, "a", a.fence, LONG, b"", TIMEOUT).expect_err("old holder renewed a lease it lost");
    assert!(e.is_lease_lost(), "old holder's renew must be LeaseLost, got {e:?}");
    let back = acquire(s, &name, "a", LONG, b"");
    assert!(!back.held_by("a") && back.holder == "b", "old holder must see the new one: {back:?}");
}

/// A released lease is claimable at once, with the next fence.
pub fn takeover_after_release(s: &dyn Store) {
    let name = fresh_name("release");
    let a = acquire(s, &name, "a", LONG, b"");
    s.release(&name, "a", a.fence, TIMEOUT).expect("release");
    let after = inspect(s, &name);
    assert!(after.expired(), "release sets expires_at to now: {after:?}");
    assert_eq!((after.holder.as_str(), after.fence), ("a", a.fence), "release keeps the row and its fence");
    let b = acquire(s, &name, "b", LONG, b"");
    assert!(b.held_by("b"));
    assert_eq!(b.fence, a.fence + 1);
    // Reclaiming one's own released lease is also a new term.
    s.release(&name, "b", b.fence, TIMEOUT).expect("release");
    let b2 = acquire(s, &name, "b", LONG, b"");
    assert_eq!(b2.fence, b.fence + 1, "reclaiming a released own lease is a new term");
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
        assert_eq!(l.fence, last + 1, "round {round}: fence must grow by exactly one");
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
    assert_eq!((l.fence, m.fence), (last + 1, last + 2), "expiry then reclaim by the same holder is a new term");
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
    let r = s.renew(&name, "a", a.fence, SHORT, b"x", TIMEOUT).expect("the holder's renew");
    assert_eq!(r.ttl(), SHORT, "renew sets expires_at = now + ttl");
    assert_eq!(r.acquired_at, a.acquired_at, "renew keeps the term start");
    assert_eq!(r.renewed_at, r.now);
    wait_expired(s, &name);
    lost(s.renew(&name, "a", a.fence, LONG, b"", TIMEOUT), "renew after expiry");
    let a2 = acquire(s, &name, "a", LONG, b"");
    s.release(&name, "a", a2.fence, TIMEOUT).expect("release");
    lost(s.renew(&name, "a", a2.fence, LONG, b"", TIMEOUT), "renew after release");
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
        for (phase, expected_fence) in [(0, 1), (1, 2)] {
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
            let winner = winners[0];
            for (id, l) in &results {
                assert_eq!(
                    (l.holder.as_str(), l.fence, l.payload.as_slice()),
                    (winner, expected_fence, winner.as_bytes()),
                    "round {round} phase {phase}: {id} was told something other than the one winner's row"
                );
            }
            let current = inspect(s, &name);
            assert_eq!(current.holder, winner);
            s.release(&name, winner, current.fence, TIMEOUT).expect("release");
        }
    }
}

/// TTLs are measured on the database clock only: `expires_at - now` is
/// exactly what was asked, and the lease runs out when the database says so.
pub fn ttl_comes_from_the_database_clock(s: &dyn Store) {
    let name = fresh_name("ttl");
    for ttl in [Duration::from_micros(1_500_001), Duration::from_secs(3600), SHORT] {
        let l = acquire(s, &name, "a", ttl, b"");
        assert_eq!(l.ttl(), ttl, "acquire: ttl must be expires_at - now of one statement");
        let r = s.renew(&name, "a", l.fence, ttl, b"", TIMEOUT).expect("renew");
        assert_eq!(r.ttl(), ttl, "renew: ttl must be expires_at - now of one statement");
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
        assert_eq!((l.fence, l.name.as_str()), (1, n.as_str()));
    }
    s.release(&names[0], "a", 1, TIMEOUT).expect("release");
    let one = acquire(s, &names[0], "b", LONG, b"");
    assert_eq!((one.holder.as_str(), one.fence), ("b", 2));
    for ((n, id), l) in names.iter().zip(ids).zip(&leases).skip(1) {
        let now = inspect(s, n);
        assert_eq!(row(&now), row(l), "{n} changed when another election did");
        assert!(now.held_by(id));
    }
    let lost = s.renew(&names[1], "a", 1, LONG, b"", TIMEOUT);
    assert!(lost.is_err_and(|e| e.is_lease_lost()), "a holder of one election cannot renew another");
}
