//! Helpers every database suite shares, whatever the server: the timings of
//! the elector tests, a config with them, a random tag for names, a bounded
//! wait for a condition, and a TCP proxy that can cut or slow the path. The
//! chaos suite's parts are here too: the fault proxy ([`faults`]), the
//! oracle and its participants ([`oracle`]), and servers a scenario owns
//! ([`pg_server`], [`maria_server`]).
//! The server-specific helpers (DSNs, URLs, plain clients) live in
//! `pg_support` and `mysql_support`, which re-export these; the scenarios both
//! elector suites run live in [`elector`].
#![allow(dead_code)]

pub mod elector;
pub mod faults;
pub mod feed;
#[path = "../forward/mod.rs"]
mod forward;
#[cfg(feature = "mysql")]
pub mod galera;
pub mod inherited;
#[cfg(feature = "mysql")]
pub mod maria_replica;
#[cfg(feature = "mysql")]
pub mod maria_server;
pub mod oracle;
#[cfg(feature = "postgres")]
pub mod patroni;
pub mod pause;
#[cfg(feature = "postgres")]
pub mod pg_replica;
#[cfg(feature = "postgres")]
pub mod pg_server;
pub mod poll;
pub mod ports;
pub mod proxy;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub mod replicated;
pub mod terms;
pub(crate) use forward::forward_calls;

use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use leaderelection::{BatchItem, Config, Elector, ErrorKind, LeaderGuard, Lease, Store, StoreError, Timing};

pub use proxy::Proxy;

/// The timings of every elector test, on either server. The invariant holds:
/// 400 + 2*500 + 100 = 1500 ms <= 2500 - 250 = 2250 ms.
pub const TIMING: Timing = Timing {
    lease_duration: Duration::from_millis(2500),
    renew_interval: Duration::from_millis(400),
    retry_period: Duration::from_millis(300),
    operation_timeout: Duration::from_millis(500),
    safety_margin: Duration::from_millis(250),
};

/// A batch of `names`, each with its fence of `fences`, all with `payload`.
pub fn items<'a>(names: &'a [String], fences: &[u64], payload: &'a [u8]) -> Vec<BatchItem<'a>> {
    names.iter().zip(fences).map(|(name, &fence)| BatchItem { name, fence, payload }).collect()
}

/// A batch claiming `names`: fence 0, no payload.
pub fn claims<N: AsRef<str>>(names: &[N]) -> Vec<BatchItem<'_>> {
    names.iter().map(|name| BatchItem { name: name.as_ref(), fence: 0, payload: b"" }).collect()
}

/// Four fresh elections, `{prefix}-{tag}/0` to `/3`, each claimed by "a"
/// on `s` for [`STORE_TTL`]: their names, leases and fences.
pub fn four_held_by_a(s: &dyn Store, prefix: &str) -> (Vec<String>, Vec<Lease>, Vec<u64>) {
    let base = format!("{prefix}-{}", random_tag());
    let names: Vec<String> = (0..4).map(|i| format!("{base}/{i}")).collect();
    let held: Vec<Lease> = names.iter().map(|n| s.acquire(n, "a", STORE_TTL, b"", STORE_TIMEOUT).unwrap()).collect();
    let fences = held.iter().map(|l| l.fence).collect();
    (names, held, fences)
}

/// `id` claims `names` on `s` for `ttl`: one call for one name, one batch
/// for more; the answers in order.
pub fn claim(
    s: &dyn Store, id: &str, names: &[String], ttl: Duration, timeout: Duration,
) -> Vec<Result<Lease, StoreError>> {
    match names {
        [name] => vec![s.acquire(name, id, ttl, b"", timeout)],
        _ => s.acquire_many(id, ttl, &claims(names), timeout),
    }
}

/// Someone leads again within this once a fault heals or a leader is gone
/// (the chaos suites' bound, with [`TIMING`]): a lease that may still run
/// on the database (renewals that landed unanswered), a renewal interval,
/// a retry period and two operation timeouts (a call in flight when the
/// fault healed, and the claim that wins), plus 1 s for reconnecting on
/// this loaded two-core machine.
pub const RECOVERY: Duration = Duration::from_millis(
    (TIMING.lease_duration.as_millis()
        + TIMING.renew_interval.as_millis()
        + TIMING.retry_period.as_millis()
        + 2 * TIMING.operation_timeout.as_millis()
        + 1000) as u64,
);

/// An elector config with [`TIMING`].
pub fn config(store: impl Store + 'static, name: &str, id: &str) -> Config {
    Config::new(store, name).identity(id).timing(TIMING)
}

/// An elector for `id` in `name` on `store`, once it leads (within 10 s),
/// and its guard.
pub fn leader<S: Store + Clone + 'static>(store: &S, name: &str, id: &str) -> (Elector, LeaderGuard) {
    let e = Elector::start(config(store.clone(), name, id)).expect("start");
    let g = e.wait_leader_timeout(Duration::from_secs(10)).expect("leads");
    (e, g)
}

/// The rest of an "open checked transaction holds a claim off" test (both
/// databases), with `a` leading `name` on `store` and the program's
/// transaction open, having checked `a`'s lease in it if `checked`: `a`
/// keeps renewing (three renewals within 5 s), then stops without
/// releasing; a successor `b` starts and is watched for a lease and two
/// seconds. Unchecked (the negative control), `b` must lead meanwhile;
/// checked, it must not, and must lead within 5 s once `commit` has ended
/// the transaction. `who` names the setting in messages. Returns `a`'s
/// last round trip meanwhile and `b`.
pub fn successor_waits_for_a_checked_transaction<S: Store + Clone + 'static>(
    a: Elector, store: &S, name: &str, checked: bool, who: &str, commit: impl FnOnce(),
) -> (Duration, Elector) {
    let before = a.status().renewals_ok;
    assert!(
        wait_for(Duration::from_secs(5), || a.status().renewals_ok >= before + 3),
        "{who}: renewals stalled behind the check: {}",
        a.status()
    );
    let rtt = a.status().last_call_rtt.unwrap();
    // The holder stops renewing; its lease runs out on the database.
    a.shutdown_without_release();
    let b = Elector::start(config(store.clone(), name, "b")).unwrap();
    let open_for = TIMING.lease_duration + Duration::from_secs(2);
    let held_off = !wait_for(open_for, || b.is_leader());
    if !checked {
        assert!(!held_off, "{who}: without the check the successor should have led while the transaction was open");
        return (rtt, b);
    }
    assert!(held_off, "{who}: a successor claimed while a checked transaction was open: {}", b.status());
    let committed = Instant::now();
    commit();
    assert!(wait_for(Duration::from_secs(5), || b.is_leader()), "{who}: no successor after the commit: {}", b.status());
    eprintln!(
        "{who}: successor led {:?} after the checked transaction ended; renewal rtt meanwhile {rtt:?}",
        committed.elapsed()
    );
    (rtt, b)
}

/// The ttl of plain store calls in the store suites (a minute: nothing
/// expires by itself), and their timeout.
pub const STORE_TTL: Duration = Duration::from_secs(60);
pub const STORE_TIMEOUT: Duration = Duration::from_secs(5);

/// Six stores from `make(i)`, released together, each run `ensure` (their
/// `ensure_schema`) and then claim `e{i}` for `a`: every one must succeed
/// and hold its claim (`round` names the attempt in the message).
pub fn ensure_schema_then_claim_at_once<S>(
    round: usize, make: impl Fn(usize) -> S + Sync, ensure: impl Fn(&S) -> Result<(), StoreError> + Sync,
) where
    S: Store + Send,
{
    let results = at_once(6, make, |s, i| -> Result<bool, StoreError> {
        ensure(&s)?;
        s.acquire(&format!("e{i}"), "a", STORE_TTL, b"", STORE_TIMEOUT).map(|l| l.held_by("a"))
    });
    for r in &results {
        assert!(matches!(r, Ok(true)), "round {round}: concurrent ensure_schema, then acquire: {r:?}");
    }
}

/// With `name` (claimed by `a` under `fence`) locked by another session,
/// a renewal, a claim and a release through `s` with `timeout` each fail,
/// retryably, within `timeout + slack`; the errors, by call, for the
/// caller's own checks.
pub fn locked_row_calls_give_up_in_time(
    s: &dyn Store, name: &str, fence: u64, timeout: Duration, slack: Duration,
) -> Vec<(&'static str, StoreError)> {
    let mut errors = Vec::new();
    for op in ["renew", "acquire", "release"] {
        let start = Instant::now();
        let r = match op {
            "renew" => s.renew(name, "a", fence, STORE_TTL, b"", timeout).map(|_| ()),
            "acquire" => s.acquire(name, "b", STORE_TTL, b"", timeout).map(|_| ()),
            _ => s.release(name, "a", fence, timeout),
        };
        let took = start.elapsed();
        let e = r.expect_err("a call on a locked row must not succeed while the lock is held");
        eprintln!("locked row: {op} with a {timeout:?} timeout returned after {took:?}: {e}");
        assert!(e.is_retryable(), "{op}: {e:?}");
        assert!(took < timeout + slack, "{op} took {took:?} with a {timeout:?} timeout");
        errors.push((op, e));
    }
    errors
}

/// On a path that swallows everything, six reads of `name` through `s`
/// each fail, retryably, within `timeout + slack`.
pub fn swallowed_reads_give_up_in_time(s: &dyn Store, name: &str, timeout: Duration, slack: Duration) {
    for _ in 0..6 {
        let start = Instant::now();
        let e = s.inspect(name, timeout).expect_err("no answer can come through a swallowing path");
        let took = start.elapsed();
        assert!(e.is_retryable(), "{e:?}");
        assert!(took < timeout + slack, "call took {took:?}");
    }
}

/// A table of a store test's own (`storetest_mysql`, `storetest_postgres`
/// give it their own methods and a `Drop` that removes it).
pub struct Scratch {
    pub table: String,
}

impl Scratch {
    pub fn new(prefix: &str) -> Scratch {
        Scratch { table: format!("{prefix}_{}", random_tag()) }
    }
}

/// `s` is on a table without the `terms` column that holds an old row `e`
/// under fence 5: `ensure` (its `ensure_schema`), run twice, adds the
/// column and counts no term (`terms_columns`, `terms` read the table);
/// the first claim holds the row above fence 5 and counts one term.
pub fn ensure_schema_on_an_old_row<S: Store>(
    s: &S, ensure: impl Fn(&S) -> Result<(), StoreError>, terms_columns: impl Fn() -> i64, terms: impl Fn(&str) -> i64,
) {
    for _ in 0..2 {
        ensure(s).expect("ensure_schema on an old table");
        assert_eq!((terms_columns(), terms("e")), (1, 0));
    }
    let a = s.acquire("e", "a", STORE_TTL, b"", STORE_TIMEOUT).unwrap();
    assert!(a.held_by("a") && a.fence > 5, "{a:?}");
    assert_eq!(terms("e"), 1, "the first counted term of an old row");
}

/// After `lease` (of `a`, `ttl`) on `name` was released while a renewal
/// that read its clock before was queued behind the release's row lock:
/// the renewal (`renewed`) found its lease lost, the row is expired with
/// no payload, and `b` claims at once under a higher fence.
pub fn a_late_renewal_extended_nothing(
    who: &str, s: &dyn Store, lease: &Lease, ttl: Duration, renewed: &Result<Lease, StoreError>,
) {
    let after = s.inspect(&lease.name, STORE_TIMEOUT).unwrap();
    eprintln!("renewal behind a release{who}: {renewed:?}; the row after: {after:?}");
    assert!(renewed.as_ref().is_err_and(|e| e.is_lease_lost()), "the late renewal landed: {renewed:?}");
    assert!(after.expired() && after.payload.is_empty(), "the released lease was extended: {after:?}");
    let next = s.acquire(&lease.name, "b", ttl, b"", STORE_TIMEOUT).unwrap();
    assert!(next.held_by("b") && next.fence > lease.fence, "the successor could not claim at once: {next:?}");
}

/// With the row of `names[2]` (each of `names` held by `a` under `fences`)
/// locked by another writer, whose transaction `unlock` ends: a renewal
/// batch and a release batch through `s` with `timeout` each answer within
/// half of it, failing that row retryably (`locked`) and doing the rest;
/// after `unlock` the locked term is as it was, and `names[0]` and
/// `names[3]` are released. `who` starts the printed line.
pub fn batches_skip_a_row_another_writer_locked(
    who: &str, s: &dyn Store, names: &[String], fences: &[u64], timeout: Duration, unlock: impl FnOnce(),
) {
    let start = Instant::now();
    let out = s.renew_many("a", STORE_TTL, &items(names, fences, b"renewed"), timeout);
    let took = start.elapsed();
    eprintln!("{who}a renew batch with one row under a writer's lock answered in {took:?}");
    assert!(took < timeout / 2, "the renew batch waited {took:?} for the lock");
    let e = out[2].as_ref().expect_err("a row under another writer's lock was renewed");
    assert!(e.is_retryable() && !e.is_lease_lost() && e.to_string().contains("locked"), "{e}");
    for (j, r) in out.iter().enumerate().filter(|(j, _)| *j != 2) {
        assert!(r.as_ref().is_ok_and(|l| l.held_by("a") && l.payload == b"renewed"), "{j}: {r:?}");
    }
    let start = Instant::now();
    let out = s.release_many("a", &items(names, fences, b""), timeout);
    assert!(start.elapsed() < timeout / 2, "the release batch waited {:?} for the lock", start.elapsed());
    let e = out[2].as_ref().expect_err("a row under another writer's lock was released");
    assert!(e.is_retryable() && e.to_string().contains("locked"), "{e}");
    assert!(out.iter().enumerate().all(|(j, r)| j == 2 || r.is_ok()), "{out:?}");
    unlock();
    let left = s.inspect(&names[2], STORE_TIMEOUT).unwrap();
    assert!(left.held_by("a") && left.fence == fences[2], "the locked term was left as it was: {left:?}");
    for n in [&names[0], &names[3]] {
        assert!(s.inspect(n, STORE_TIMEOUT).unwrap().expired(), "{n} was not released");
    }
}

/// The members table lost its `leads` column and `ensure` (the store's
/// `ensure_schema`) runs twice: heartbeats through `s` by `ids` work again
/// and count what each member leads.
pub fn heartbeats_count_leads_once_the_schema_is_ensured<S: Store>(
    s: &S, ensure: impl Fn(&S) -> Result<(), StoreError>, ids: [&str; 2],
) {
    ensure(s).unwrap();
    ensure(s).unwrap();
    let m = s.heartbeat("g", ids[0], 4, STORE_TTL, STORE_TIMEOUT).unwrap();
    assert_eq!((m.live, m.led, m.most), (1, Some(4), Some(4)));
    let m = s.heartbeat("g", ids[1], 6, STORE_TTL, STORE_TIMEOUT).unwrap();
    assert_eq!((m.live, m.rank, m.led, m.most), (2, Some(1), Some(10), Some(6)));
}

/// Ten random hex digits, to keep names of concurrent tests apart.
pub fn random_tag() -> String {
    let mut r = [0u8; 5];
    getrandom::fill(&mut r).unwrap();
    r.iter().map(|b| format!("{b:02x}")).collect()
}

/// Polls `f` every 20 ms until it returns true or `within` passes.
pub fn wait_for(within: Duration, f: impl FnMut() -> bool) -> bool {
    poll::poll_until(within, Duration::from_millis(20), f)
}

/// Runs `f(prepare(i), i)` for each `i` in `0..n` on a thread of its own,
/// all released together by a barrier once every `prepare` has run (the
/// replicas of a fleet starting at the same instant); the results in order.
pub fn at_once<P, R: Send>(n: usize, prepare: impl Fn(usize) -> P + Sync, f: impl Fn(P, usize) -> R + Sync) -> Vec<R> {
    let barrier = Barrier::new(n);
    thread::scope(|sc| {
        let (prepare, f, barrier) = (&prepare, &f, &barrier);
        let hs: Vec<_> = (0..n)
            .map(|i| {
                sc.spawn(move || {
                    let p = prepare(i);
                    barrier.wait();
                    f(p, i)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// The check of a call refused for want of room beside election table
/// `table`: fatal, naming the table beside (`{table}_{beside}`) and saying
/// `limit` (the server's bound on a name) and to use a shorter name.
pub fn refused_beside<'a>(table: &'a str, limit: &'a str) -> impl Fn(&str, &str, StoreError) + 'a {
    move |call, beside, e| {
        assert_eq!(e.kind(), ErrorKind::Fatal, "{call}: {e}");
        assert!(e.message().contains(&format!("{table}_{beside}")), "{call}: {e}");
        assert!(e.message().contains(limit), "{call}: {e}");
        assert!(e.message().contains("use a shorter election table name"), "{call}: {e}");
    }
}

/// On `s`, whose election table `table` exists but leaves no room for the
/// tables beside it: elections run, and the slot calls (`_slots`) and the
/// group calls (`_members`) are refused as [`refused_beside`] checks.
pub fn elections_run_but_not_the_calls_beside(s: &dyn Store, table: &str, limit: &str) {
    let refused = refused_beside(table, limit);
    let lease = s.acquire("e", "a", STORE_TIMEOUT, b"", STORE_TIMEOUT).expect("elections run on it");
    assert!(lease.held_by("a"));
    refused("claim_slot", "slots", s.claim_slot("e", "a", lease.fence, "s", false, STORE_TIMEOUT).unwrap_err());
    refused("finish_slot", "slots", s.finish_slot("e", lease.fence, "s", 0, STORE_TIMEOUT).unwrap_err());
    refused("heartbeat", "members", s.heartbeat("g", "m", 0, STORE_TIMEOUT, STORE_TIMEOUT).unwrap_err());
    refused("leave_group", "members", s.leave_group("g", "m", STORE_TIMEOUT).unwrap_err());
}
