//! The scenarios both suites of the feed of releases run
//! (`tests/release_feed.rs` on PostgreSQL, `tests/release_feed_mysql.rs` on
//! MariaDB), written once over any store.
//!
//! The followers here poll once a minute (the first poll after seeing a
//! leader comes 12 to 72 s later), so a hand-over within the few seconds
//! these scenarios allow can only come from the feed; the suites' controls
//! without it show that. Timings satisfy the invariant
//! `renew 1 s + 2*timeout 1 s + retry delay 250 ms <= lease 5 s - margin 500 ms`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use leaderelection::{Config, Elector, Group, GroupConfig, LeaderGuard, Lease, Released, Store, StoreError, Timing};

use super::{forward_calls, random_tag, wait_for};

/// Followers that poll once a minute.
pub const SLOW_POLL: Timing = Timing {
    lease_duration: Duration::from_secs(5),
    renew_interval: Duration::from_secs(1),
    retry_period: Duration::from_secs(60),
    operation_timeout: Duration::from_secs(1),
    safety_margin: Duration::from_millis(500),
};

/// Well within the earliest poll (12 s), well beyond a round trip.
pub const QUICK: Duration = Duration::from_secs(3);

pub fn config(store: impl Store + 'static, name: &str, id: &str) -> Config {
    Config::new(store, name).identity(id).timing(SLOW_POLL)
}

/// `a` leads `name` (holding its guard: dropping it would resign); `b` (on
/// `b_store`) has seen it lead. Returns both and the guard.
pub fn leader_and_follower(
    a_store: impl Store + 'static, b_store: impl Store + 'static, name: &str,
) -> (Elector, Elector, LeaderGuard) {
    let a = Elector::start(config(a_store, name, "a")).expect("start a");
    let guard = a.wait_leader_timeout(Duration::from_secs(10)).expect("a leads");
    let b = Elector::start(config(b_store, name, "b")).expect("start b");
    let seen = wait_for(Duration::from_secs(10), || b.status().leader.is_some_and(|l| l.identity.starts_with("a#")));
    assert!(seen, "b never saw a lead: {:?}", b.status());
    (a, b, guard)
}

/// One follower that polls once a minute (`b_store`, its feed on or off)
/// and its leader's release: with the feed it leads within [`QUICK`]
/// (printed under `label`), without it (the control) it does not.
/// `ready(leader)` returns once the follower's feed waits for the leader's
/// releases.
pub fn one_follower_and_a_release(
    label: &str, a_store: impl Store + 'static, b_store: impl Store + 'static, feed: bool, ready: impl Fn(&str),
) {
    let name = format!("feed-{}", random_tag());
    let (a, b, _guard) = leader_and_follower(a_store, b_store, &name);
    if feed {
        ready(&a.status().leader.expect("a leads").identity);
    }
    let took = hand_over(&a, &b, QUICK);
    if feed {
        eprintln!(
            "{label}: the follower led {took:?} after the release (its poll: every {:?})",
            SLOW_POLL.retry_period
        );
        assert!(took.is_some(), "no hand-over within {QUICK:?}: {:?}", b.status());
    } else {
        assert!(took.is_none(), "the follower led {took:?} after the release without a feed");
    }
}

/// How long after `a`'s release `b` led, if within `within`.
pub fn hand_over(a: &Elector, b: &Elector, within: Duration) -> Option<Duration> {
    let released = Instant::now();
    a.shutdown().expect("a releases");
    b.wait_leader_timeout(within).ok().map(|_| released.elapsed())
}

/// `a`'s release (ending its term) sends `name`, with the fence of `a`'s
/// term, on `rx` exactly once.
pub fn released_once(a: &Elector, rx: &crossbeam_channel::Receiver<Released>, name: &str) {
    // The lease as `a` last read it: its own term (its validity may be
    // between a renewal's send and its answer).
    let st = a.status();
    let fence = st.leader.as_ref().filter(|l| l.identity == st.identity).map(|l| l.fence);
    let fence = fence.unwrap_or_else(|| panic!("a does not lead: {st:?}"));
    a.shutdown().expect("a releases");
    let deadline = Instant::now() + QUICK;
    let mut got = Vec::new();
    while let Ok(r) = rx.recv_deadline(deadline) {
        if r.name == name {
            got.push(r.fence);
        }
    }
    assert_eq!(got, [Some(fence)], "the release was not sent once with its fence");
}

/// A store that counts the claims of one identity.
pub struct Counting<S> {
    pub inner: S,
    pub claims: Arc<AtomicUsize>,
}

impl<S: Store> Store for Counting<S> {
    forward_calls!(inner => renew, release, inspect, releases);
    fn acquire(
        &self, name: &str, identity: &str, ttl: Duration, payload: &[u8], timeout: Duration,
    ) -> Result<Lease, StoreError> {
        self.claims.fetch_add(1, Ordering::SeqCst);
        self.inner.acquire(name, identity, ttl, payload, timeout)
    }
}

/// `n` followers of `name` on `shared` (one feed for them all), each
/// counting its claims; returns once every one has seen a leader.
pub fn followers<S: Store + Clone + 'static>(shared: &S, name: &str, n: usize) -> Vec<(Elector, Arc<AtomicUsize>)> {
    let followers: Vec<(Elector, Arc<AtomicUsize>)> = (0..n)
        .map(|i| {
            let claims = Arc::new(AtomicUsize::new(0));
            let s = Counting { inner: shared.clone(), claims: Arc::clone(&claims) };
            (Elector::start(config(s, name, &format!("f{i}"))).expect("start"), claims)
        })
        .collect();
    let all_seen = wait_for(Duration::from_secs(10), || followers.iter().all(|(f, _)| f.status().leader.is_some()));
    assert!(all_seen, "not every follower saw the leader");
    followers
}

/// Each follower's claims so far.
pub fn claims(followers: &[(Elector, Arc<AtomicUsize>)]) -> Vec<usize> {
    followers.iter().map(|(_, c)| c.load(Ordering::SeqCst)).collect()
}

/// Twenty followers on `shared` with their leader, and one release: no
/// claim while the leader renews, then exactly one leads, sooner than any
/// poll or the lease's expiry could make it, and none claims more than
/// once. `ready(leader)` returns once the feed waits for that leader's
/// release. Returns how long the hand-over took.
pub fn twenty_followers_and_one_release<S: Store + Clone + 'static>(shared: &S, ready: impl Fn(&str)) -> Duration {
    let name = format!("feed-{}", random_tag());
    let a = Elector::start(config(shared.clone(), &name, "a")).expect("start a");
    let _guard = a.wait_leader_timeout(Duration::from_secs(10)).expect("a leads");
    let followers = followers(shared, &name, 20);
    let before = claims(&followers);
    std::thread::sleep(Duration::from_secs(2)); // two renewals: still no claim
    assert_eq!(claims(&followers), before, "claims while the leader lived");
    ready(&a.status().leader.expect("a leads").identity);
    let released = Instant::now();
    a.shutdown().expect("a releases");
    // The followers' last look was 2 s ago or more, and the lease they saw
    // had 4 s left or more: they would claim at its expiry, 2 s after the
    // release at the earliest. Sooner can only be the feed.
    let within = Duration::from_millis(1500);
    let led = wait_for(within, || followers.iter().any(|(f, _)| f.is_leader()));
    assert!(led, "nobody led within {within:?}");
    let took = released.elapsed();
    std::thread::sleep(Duration::from_secs(1)); // let every woken claim land
    let leaders = followers.iter().filter(|(f, _)| f.is_leader()).count();
    assert_eq!(leaders, 1);
    let after: Vec<usize> = claims(&followers).iter().zip(&before).map(|(a, b)| a - b).collect();
    assert!(after.iter().all(|&n| n <= 1), "a follower claimed more than once: {after:?}");
    eprintln!("20 followers, one release: led {took:?} after it, {} claims", after.iter().sum::<usize>());
    took
}

/// A group's followers hear the releases of a whole group shutting down,
/// after it has led for longer than a lease, and take every election within
/// a few seconds. `ready(leader)` returns once
/// the feed waits for that leader's releases. Returns how long that took.
pub fn a_group_takes_over_a_released_group<S: Store + 'static>(
    store: impl Fn() -> S, ready: impl Fn(&str),
) -> Duration {
    let group = format!("feedgroup-{}", random_tag());
    let names: Vec<String> = (0..20).map(|i| format!("{group}-{i}")).collect();
    let start = |id: &str| {
        let template = Config::new(store(), group.clone()).identity(id).timing(SLOW_POLL);
        let g = Group::start(GroupConfig::new(template)).expect("group");
        let elections: Vec<_> = names.iter().map(|n| g.join(n).expect("join")).collect();
        (g, elections)
    };
    let (a, a_elections) = start("a");
    assert!(wait_for(Duration::from_secs(10), || a_elections.iter().all(|e| e.is_leader())), "a leads all");
    let (b, b_elections) = start("b");
    let seen = wait_for(Duration::from_secs(10), || {
        b_elections.iter().all(|e| e.status().leader.is_some_and(|l| l.identity.starts_with("a#")))
    });
    assert!(seen, "b did not see a lead every election");
    // Past a's first lease: a's batched renewals must keep the leases it
    // holds known as led, or the feed would give a's releases up early.
    std::thread::sleep(SLOW_POLL.lease_duration + Duration::from_secs(1)); // not waiting on an outcome
    ready(&b_elections[0].status().leader.expect("a leads").identity);
    let released = Instant::now();
    a.shutdown().expect("a releases");
    drop(a_elections);
    let all = wait_for(QUICK, || b_elections.iter().all(|e| e.is_leader()));
    assert!(all, "b led {} of 20 within {QUICK:?}", b_elections.iter().filter(|e| e.is_leader()).count());
    let took = released.elapsed();
    eprintln!("group: 20 elections led again {took:?} after the release");
    drop(b);
    took
}

/// The identity `e` leads under, once it leads.
pub fn identity_of(e: &Elector) -> String {
    e.status().leader.expect("a leader").identity
}

/// Names of `name` that `watcher` (its feed on) receives in 3.5 s (three
/// renewals or more) after it has seen a leader on `leader` lead, while
/// that leader lives. Returns them and the leader.
pub fn sent_while_the_leader_lives<S: Store>(
    watcher: &S, leader: impl Store + 'static, name: &str,
) -> (usize, Elector) {
    let rx = watcher.releases().expect("feed");
    let a = Elector::start(config(leader, name, "a")).expect("start a");
    let guard = a.wait_leader_timeout(Duration::from_secs(10)).expect("a leads");
    let seen = watcher.inspect(name, Duration::from_secs(5)).expect("inspect");
    assert_eq!(seen.holder, identity_of(&a));
    let _ = guard.wait_lost_timeout(Duration::from_millis(3500));
    assert!(a.is_leader() && a.status().renewals_ok >= 3, "{:?}", a.status());
    (rx.try_iter().filter(|r| r.name == name).count(), a)
}

/// How a suite reaches the lock a leader's store holds while it leads:
/// `holder(identity)`, the session that holds it (if any); `kill(session)`
/// ends that session on the server; `waiting(identity)` returns once a
/// waiter session waits for it.
pub struct LockOf<H, K, W> {
    pub holder: H,
    pub kill: K,
    pub waiting: W,
}

/// The leader's lock session killed while it leads: the lock goes from
/// held to free once, with no release, so each of five followers (one
/// feed, one waiter) claims exactly once, nobody takes over, the leader's
/// store takes its lock again on a new session, and the next release is
/// heard. Only the lock can wake the followers here: no release was sent.
pub fn a_killed_lock_session_wakes_each_follower_once<S, H, K, W>(
    label: &str, store: impl Fn() -> S, lock: LockOf<H, K, W>,
) where
    S: Store + Clone + 'static,
    H: Fn(&str) -> Option<u64>,
    K: Fn(u64),
    W: Fn(&str),
{
    let name = format!("feed-{}", random_tag());
    let a = Elector::start(config(store(), &name, "a")).expect("start a");
    let _guard = a.wait_leader_timeout(Duration::from_secs(10)).expect("a leads");
    let id = identity_of(&a);
    let mut first = None;
    let took = wait_for(Duration::from_secs(10), || {
        first = (lock.holder)(&id);
        first.is_some()
    });
    assert!(took, "the leader's store never took its lock");
    let first = first.expect("a lock session");
    let followers = followers(&store(), &name, 5);
    (lock.waiting)(&id);
    let before = claims(&followers);
    (lock.kill)(first);
    // Four renewals and two looks at the lock: no storm.
    std::thread::sleep(Duration::from_secs(4));
    let woken: Vec<usize> = claims(&followers).iter().zip(&before).map(|(a, b)| a - b).collect();
    eprintln!("{label}: claims per follower after the lock session was killed: {woken:?}");
    assert!(woken.iter().all(|&n| n == 1), "each follower should claim once, woken by the lock: {woken:?}");
    assert!(a.is_leader() && followers.iter().all(|(f, _)| !f.is_leader()), "the leadership moved");
    let mut again = None;
    let back = wait_for(Duration::from_secs(10), || {
        again = (lock.holder)(&id).filter(|&s| s != first);
        again.is_some()
    });
    assert!(back, "the leader's store did not take its lock again");
    (lock.waiting)(&id);
    // Heard again: the release comes through.
    let released = Instant::now();
    a.shutdown().expect("a releases");
    let led = wait_for(QUICK, || followers.iter().any(|(f, _)| f.is_leader()));
    assert!(led, "nobody led within {QUICK:?} of the release after the lock came back");
    eprintln!("{label}: after the kill, a follower led {:?} after the release", released.elapsed());
}
