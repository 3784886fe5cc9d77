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
pub mod proxy;
pub mod terms;

use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use leaderelection::{Config, Elector, LeaderGuard, Store, Timing};

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
    a: Elector,
    store: &S,
    name: &str,
    checked: bool,
    who: &str,
    commit: impl FnOnce(),
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

/// Ten random hex digits, to keep names of concurrent tests apart.
pub fn random_tag() -> String {
    let mut r = [0u8; 5];
    getrandom::fill(&mut r).unwrap();
    r.iter().map(|b| format!("{b:02x}")).collect()
}

/// Polls `f` every 20 ms until it returns true or `within` passes.
pub fn wait_for(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(20));
    }
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
