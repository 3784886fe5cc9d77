//! The feed of releases on MariaDB (issue 36): named locks instead of
//! `LISTEN`. A follower that has seen a leader leads within a round trip of
//! the leader's release, not at its next poll; a live leader wakes nobody.
//! Run with `bash scripts/test.sh`.
//!
//! The followers here poll once a minute (the first poll after seeing a
//! leader comes 12 to 72 s later), so a hand-over within the few seconds
//! these tests allow can only come from the feed; the controls without it
//! show that. Timings satisfy the invariant
//! `renew 1 s + 2*timeout 1 s + retry delay 250 ms <= lease 5 s - margin 500 ms`.

mod mysql_support;
mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use leaderelection::mysql::MySqlStore;
use leaderelection::{Config, Elector, Group, GroupConfig, LeaderGuard, Store, Timing};
use mysql::prelude::Queryable;
use mysql_support::{admin, url, SHARED};
use support::{forward_calls, random_tag, wait_for};

const TABLE: &str = "le_feed";

/// Followers that poll once a minute.
const SLOW_POLL: Timing = Timing {
    lease_duration: Duration::from_secs(5),
    renew_interval: Duration::from_secs(1),
    retry_period: Duration::from_secs(60),
    operation_timeout: Duration::from_secs(1),
    safety_margin: Duration::from_millis(500),
};

/// Well within the earliest poll (12 s), well beyond a round trip.
const QUICK: Duration = Duration::from_secs(3);

fn store(feed: bool) -> MySqlStore {
    let s = MySqlStore::builder(&url(SHARED)).table(TABLE).release_feed(feed).build().expect("store");
    s.ensure_schema().unwrap_or_else(|e| panic!("ensure_schema: {e}"));
    s
}

fn config(store: impl Store + 'static, name: &str, id: &str) -> Config {
    Config::new(store, name).identity(id).timing(SLOW_POLL)
}

/// `a` leads `name` (holding its guard: dropping it would resign); `b` (on
/// `b_store`) has seen it lead.
fn leader_and_follower(
    a_store: impl Store + 'static, b_store: impl Store + 'static, name: &str,
) -> (Elector, Elector, LeaderGuard) {
    let a = Elector::start(config(a_store, name, "a")).expect("start a");
    let guard = a.wait_leader_timeout(Duration::from_secs(10)).expect("a leads");
    let b = Elector::start(config(b_store, name, "b")).expect("start b");
    let seen = wait_for(Duration::from_secs(10), || b.status().leader.is_some_and(|l| l.identity.starts_with("a#")));
    assert!(seen, "b never saw a lead: {:?}", b.status());
    (a, b, guard)
}

/// How long after `a`'s release `b` led, if within `within`.
fn hand_over(a: &Elector, b: &Elector, within: Duration) -> Option<Duration> {
    let released = Instant::now();
    a.shutdown().expect("a releases");
    b.wait_leader_timeout(within).ok().map(|_| released.elapsed())
}

/// The session holding `lock`, if any.
fn holder(admin: &mut mysql::Conn, lock: &str) -> Option<u64> {
    admin.query_first::<Option<u64>, _>(format!("SELECT IS_USED_LOCK('{lock}')")).expect("IS_USED_LOCK").flatten()
}

/// The identity `e` leads under, once it leads.
fn identity_of(e: &Elector) -> String {
    e.status().leader.expect("a leader").identity
}

#[test]
fn a_follower_leads_within_a_round_trip_of_a_release() {
    let name = format!("feed-{}", random_tag());
    let (a, b, _guard) = leader_and_follower(store(true), store(true), &name);
    let took = hand_over(&a, &b, QUICK);
    eprintln!("mariadb: the follower led {took:?} after the release (its poll: every {:?})", SLOW_POLL.retry_period);
    assert!(took.is_some(), "no hand-over within {QUICK:?}: {:?}", b.status());
}

/// The control: without the feed the same follower waits for its poll.
#[test]
fn without_the_feed_a_follower_waits_for_its_poll() {
    let name = format!("feed-{}", random_tag());
    let (a, b, _guard) = leader_and_follower(store(true), store(false), &name);
    let took = hand_over(&a, &b, QUICK);
    assert!(took.is_none(), "the follower led {took:?} after the release without a feed");
}

/// Names of `name` a watcher that has seen `leader` lead receives in 3.5 s
/// (three renewals or more) while `leader` lives.
fn sent_while_the_leader_lives(watcher: &MySqlStore, leader: MySqlStore, name: &str) -> (usize, Elector) {
    let rx = watcher.releases().expect("feed");
    let a = Elector::start(config(leader, name, "a")).expect("start a");
    let guard = a.wait_leader_timeout(Duration::from_secs(10)).expect("a leads");
    let seen = watcher.inspect(name, Duration::from_secs(5)).expect("inspect");
    assert_eq!(seen.holder, identity_of(&a));
    let _ = guard.wait_lost_timeout(Duration::from_millis(3500));
    assert!(a.is_leader() && a.status().renewals_ok >= 3, "{:?}", a.status());
    (rx.try_iter().filter(|n| n == name).count(), a)
}

/// Nothing comes while the leader renews (its lock held); the release that
/// ends the term sends the name once.
#[test]
fn only_a_release_that_ends_a_term_is_sent() {
    let name = format!("feed-{}", random_tag());
    let watcher = store(true);
    let rx = watcher.releases().expect("feed");
    let (quiet, a) = sent_while_the_leader_lives(&watcher, store(true), &name);
    assert_eq!(quiet, 0, "sent while the leader renewed");
    a.shutdown().expect("a releases");
    let deadline = Instant::now() + QUICK;
    let mut got = 0;
    while let Ok(n) = rx.recv_deadline(deadline) {
        got += usize::from(n == name);
    }
    assert_eq!(got, 1, "the release was sent {got} times");
}

/// A leader that holds no lock (its feed off, or an older version) wakes
/// nobody while it lives: a free lock is not a release.
#[test]
fn a_leader_without_a_lock_wakes_nobody() {
    let name = format!("feed-{}", random_tag());
    let (sent, _a) = sent_while_the_leader_lives(&store(true), store(false), &name);
    assert_eq!(sent, 0, "a free lock woke the watcher while the leader lived");
}

/// The negative control of the rule above: waiters that wake whenever the
/// lock is free, without seeing it held first, wake every second.
#[test]
fn control_waking_on_a_free_lock_is_caught() {
    let name = format!("feed-{}", random_tag());
    let (sent, _a) = sent_while_the_leader_lives(&store(true).__release_feed_waking_on_free(), store(false), &name);
    assert!(sent >= 2, "waking on a free lock sent {sent} names; the storm check would not catch it");
}

/// A store that counts the claims of one identity.
struct Counting {
    inner: MySqlStore,
    claims: Arc<AtomicUsize>,
}

impl Store for Counting {
    forward_calls!(inner => renew, release, inspect, releases);
    fn acquire(
        &self, name: &str, identity: &str, ttl: Duration, payload: &[u8], timeout: Duration,
    ) -> Result<leaderelection::Lease, leaderelection::StoreError> {
        self.claims.fetch_add(1, Ordering::SeqCst);
        self.inner.acquire(name, identity, ttl, payload, timeout)
    }
}

/// `n` followers of `name` on `shared` (one waiter session for them all),
/// each counting its claims; returns once every one has seen a leader.
fn followers(shared: &MySqlStore, name: &str, n: usize) -> Vec<(Elector, Arc<AtomicUsize>)> {
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

fn claims(followers: &[(Elector, Arc<AtomicUsize>)]) -> Vec<usize> {
    followers.iter().map(|(_, c)| c.load(Ordering::SeqCst)).collect()
}

/// Twenty followers on one store and one release: exactly one leads, and
/// none claims more than once.
#[test]
fn twenty_followers_and_one_release_claim_once_each() {
    let name = format!("feed-{}", random_tag());
    let shared = store(true);
    let a = Elector::start(config(shared.clone(), &name, "a")).expect("start a");
    let _guard = a.wait_leader_timeout(Duration::from_secs(10)).expect("a leads");
    let followers = followers(&shared, &name, 20);
    let before: Vec<usize> = claims(&followers);
    std::thread::sleep(Duration::from_secs(2)); // two renewals: still no claim
    assert_eq!(claims(&followers), before, "claims while the leader lived");
    let released = Instant::now();
    a.shutdown().expect("a releases");
    // The followers' last look was 2 s ago or more, and the lease they saw
    // had 4 s left or more: they would claim at its expiry, 2 s after the
    // release at the earliest. Sooner can only be the feed.
    let within = Duration::from_millis(1500);
    let led = wait_for(within, || followers.iter().any(|(f, _)| f.is_leader()));
    assert!(led, "nobody led within {within:?}");
    eprintln!("mariadb, 20 followers: led {:?} after the release", released.elapsed());
    std::thread::sleep(Duration::from_secs(1)); // let every woken claim land
    let leaders = followers.iter().filter(|(f, _)| f.is_leader()).count();
    assert_eq!(leaders, 1);
    let after: Vec<usize> = claims(&followers).iter().zip(&before).map(|(a, b)| a - b).collect();
    assert!(after.iter().all(|&n| n <= 1), "a follower claimed more than once: {after:?}");
    eprintln!("20 followers, one release: {} claims", after.iter().sum::<usize>());
}

/// A group's followers hear the releases of a whole group shutting down and
/// take every election within a few seconds.
#[test]
fn a_group_takes_over_a_released_group_at_once() {
    let group = format!("feedgroup-{}", random_tag());
    let names: Vec<String> = (0..20).map(|i| format!("{group}-{i}")).collect();
    let start = |id: &str| {
        let template = Config::new(store(true), group.clone()).identity(id).timing(SLOW_POLL);
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
    let released = Instant::now();
    a.shutdown().expect("a releases");
    drop(a_elections);
    let all = wait_for(QUICK, || b_elections.iter().all(|e| e.is_leader()));
    assert!(all, "b led {} of 20 within {QUICK:?}", b_elections.iter().filter(|e| e.is_leader()).count());
    eprintln!("mariadb group: 20 elections led again {:?} after the release", released.elapsed());
    drop(b);
}

/// The leader's lock session killed while it leads: each follower claims
/// at most once (the lock went from held to free once), nobody takes over,
/// the leader's store takes its lock again on a new session, and the next
/// release is heard.
#[test]
fn a_killed_lock_session_wakes_each_follower_once_and_the_feed_recovers() {
    let name = format!("feed-{}", random_tag());
    let leader_store = store(true);
    let a = Elector::start(config(leader_store.clone(), &name, "a")).expect("start a");
    let _guard = a.wait_leader_timeout(Duration::from_secs(10)).expect("a leads");
    let lock = leader_store.__release_lock(&identity_of(&a));
    let mut admin = admin(SHARED);
    let mut first = None;
    assert!(
        wait_for(Duration::from_secs(10), || {
            first = holder(&mut admin, &lock);
            first.is_some()
        }),
        "the leader's store never took its lock"
    );
    let first = first.expect("a lock session");
    let followers = followers(&store(true), &name, 5);
    let before = claims(&followers);
    admin.query_drop(format!("KILL CONNECTION {first}")).expect("kill the lock session");
    // Four renewals and two looks at the lock: no storm.
    std::thread::sleep(Duration::from_secs(4));
    let woken: Vec<usize> = claims(&followers).iter().zip(&before).map(|(a, b)| a - b).collect();
    eprintln!("mariadb: claims per follower after the lock session was killed: {woken:?}");
    assert!(woken.iter().all(|&n| n <= 1), "a follower claimed more than once while the leader lived: {woken:?}");
    assert!(a.is_leader() && followers.iter().all(|(f, _)| !f.is_leader()), "the leadership moved");
    let mut again = None;
    let back = wait_for(Duration::from_secs(10), || {
        again = holder(&mut admin, &lock).filter(|&s| s != first);
        again.is_some()
    });
    assert!(back, "the leader's store did not take its lock again");
    // Heard again: the release comes through.
    let released = Instant::now();
    a.shutdown().expect("a releases");
    let led = wait_for(QUICK, || followers.iter().any(|(f, _)| f.is_leader()));
    assert!(led, "nobody led within {QUICK:?} of the release after the lock came back");
    eprintln!("mariadb: after the kill, a follower led {:?} after the release", released.elapsed());
}

/// Dropping the store ends the feed: its channel closes, and every session
/// of it (the pool's, the lock session, the waiters blocked in `GET_LOCK`)
/// is gone from the process list. The store here runs as a user of its own,
/// so its sessions are told apart by user.
#[test]
fn the_feed_ends_with_its_store_and_its_sessions_go() {
    let user = "le_feed_end";
    let mut admin = admin(SHARED);
    store(false); // the schema, made by the shared user
    let own = mysql_support::own_user_url(&mut admin, user, TABLE);
    let s = MySqlStore::builder(&own).table(TABLE).build().expect("store");
    let rx = s.releases().expect("feed");
    // Followed: a leader elsewhere (a waiter session in GET_LOCK) ...
    let name = format!("feed-{}", random_tag());
    let a = Elector::start(config(store(true), &name, "a")).expect("start a");
    let _guard = a.wait_leader_timeout(Duration::from_secs(10)).expect("a leads");
    s.inspect(&name, Duration::from_secs(5)).expect("inspect");
    // ... and led: a lock session.
    let mine = format!("feed-{}", random_tag());
    s.acquire(&mine, "me", Duration::from_secs(30), b"", Duration::from_secs(5)).expect("claim");
    let sessions = |admin: &mut mysql::Conn, what: &str| -> usize {
        let q = format!("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER = '{user}'{what}");
        admin.query_first::<usize, _>(q).expect("PROCESSLIST").unwrap_or(0)
    };
    let waiting = wait_for(Duration::from_secs(10), || sessions(&mut admin, " AND INFO LIKE '%GET_LOCK%'") == 1);
    assert!(waiting, "no waiter session in GET_LOCK");
    assert!(
        wait_for(Duration::from_secs(10), || holder(&mut admin, &s.__release_lock("me")).is_some()),
        "no lock session"
    );
    eprintln!("mariadb: the store's sessions before the drop: {}", sessions(&mut admin, ""));
    drop(s);
    assert!(
        matches!(rx.recv_timeout(Duration::from_secs(2)), Err(e) if e.is_disconnected()),
        "the feed outlived its store"
    );
    let gone = wait_for(Duration::from_secs(10), || sessions(&mut admin, "") == 0);
    assert!(gone, "{} sessions outlived their store", sessions(&mut admin, ""));
}

/// Where the feed cannot work it is off, and says so by `None`: a
/// multi-primary cluster (named locks do not cross nodes), a store turned
/// off, a store over a pool built elsewhere. No server needed.
#[test]
fn no_feed_on_a_multi_primary_cluster_or_when_turned_off() {
    let on = MySqlStore::builder("mysql://u@127.0.0.1:1/db").build().expect("store");
    assert!(on.releases().is_some(), "the feed is on by default");
    let multi = MySqlStore::builder("mysql://u@127.0.0.1:1/db").multi_primary(true).build().expect("store");
    assert!(multi.releases().is_none(), "a feed on a multi-primary cluster");
    let off = MySqlStore::builder("mysql://u@127.0.0.1:1/db").release_feed(false).build().expect("store");
    assert!(off.releases().is_none());
    #[cfg(unix)]
    {
        let opts = mysql::OptsBuilder::new()
            .ip_or_hostname(Some("127.0.0.1"))
            .tcp_port(1)
            .pool_opts(mysql::PoolOpts::default().with_constraints(mysql::PoolConstraints::new(0, 1).expect("sizes")));
        let pool = mysql::Pool::new(opts).expect("a pool with no connection yet");
        assert!(MySqlStore::from_pool(pool).expect("store").releases().is_none(), "a feed on a borrowed pool");
    }
}
