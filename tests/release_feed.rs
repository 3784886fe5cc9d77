//! The feed of releases on real servers (issue 36): a follower that has
//! looked at the row leads within a round trip of the leader's release,
//! not at its next poll. Run with `bash scripts/test.sh`.
//!
//! The followers poll once a minute (`support::feed`), so a hand-over
//! within the few seconds these tests allow can only come from the feed;
//! the controls without it show that.

mod pg_support;
mod support;

use std::time::{Duration, Instant};

use leaderelection::postgres::PostgresStore;
use leaderelection::{Config, Elector, Group, GroupConfig, Released, Store, Timing};
use pg_support::{dsn, BOUNCER, DIRECT};
use support::feed::{
    config, hand_over, leader_and_follower, one_follower_and_a_release, sent_while_the_leader_lives, LockOf, QUICK,
    SLOW_POLL,
};
use support::{random_tag, wait_for};

const TABLE: &str = "le_feed";

fn store(var: &str, feed: bool) -> PostgresStore {
    let s = PostgresStore::builder(&dsn(var)).table("public", TABLE).release_feed(feed).build().expect("store");
    s.ensure_schema().unwrap_or_else(|e| panic!("ensure_schema via {var}: {e}"));
    s
}

#[test]
fn a_follower_leads_within_a_round_trip_of_a_release() {
    one_follower_and_a_release("direct", store(DIRECT, true), store(DIRECT, true), true, |_| {});
}

/// The control: without the feed the same follower waits for its poll.
#[test]
fn without_the_feed_a_follower_waits_for_its_poll() {
    one_follower_and_a_release("direct", store(DIRECT, true), store(DIRECT, false), false, |_| {});
}

/// Releases notify through PgBouncer too (`pg_notify` needs no session),
/// so a follower listening directly hears a leader that writes through the
/// pooler.
#[test]
fn a_release_through_pgbouncer_reaches_a_direct_listener() {
    let name = format!("feed-{}", random_tag());
    let (a, b, _guard) = leader_and_follower(store(BOUNCER, false), store(DIRECT, true), &name);
    let took = hand_over(&a, &b, QUICK);
    assert!(took.is_some(), "no hand-over within {QUICK:?}: {:?}", b.status());
}

/// Behind PgBouncer in transaction mode `LISTEN` cannot work: the feed's
/// probe finds so and the feed ends, and followers poll (their drivers see
/// the channel close).
#[test]
fn behind_pgbouncer_the_feed_ends() {
    let s = store(BOUNCER, true);
    let rx = s.releases().expect("a feed until proven deaf");
    let ended = Instant::now();
    let closed = loop {
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(_) => continue, // another test's release on the direct path
            Err(e) => break e,
        }
    };
    assert!(closed.is_disconnected(), "the feed through PgBouncer did not end within 30 s");
    eprintln!("pgbouncer: the feed ended after {:?}", ended.elapsed());
    assert!(s.releases().is_none(), "an ended feed takes new subscribers");
}

/// Nothing comes while the leader renews; a release that ends nothing sends
/// nothing; the release that ends the term sends the name once, though
/// the watcher both listens and waits on the leader's lock: the leader's
/// lock is held, so the release does not notify, and the lock's release
/// wakes the watcher.
#[test]
fn only_a_release_that_ends_a_term_is_sent() {
    let name = format!("feed-{}", random_tag());
    let watcher = store(DIRECT, true);
    let rx = watcher.releases().expect("feed");
    let a = Elector::start(config(store(DIRECT, true), &name, "a")).expect("start a");
    let guard = a.wait_leader_timeout(Duration::from_secs(10)).expect("a leads");
    watcher.inspect(&name, Duration::from_secs(5)).expect("inspect");
    lock_waited_for(watcher.__release_lock(&support::feed::identity_of(&a)));
    let fence = guard.fence();
    let _ = guard.wait_lost_timeout(Duration::from_millis(3500)); // three renewals or more
                                                                  // Not held under this fence by this identity: changes nothing.
    watcher.release(&name, "somebody", fence, Duration::from_secs(5)).expect("release");
    let quiet: Vec<Released> = rx.try_iter().filter(|r| r.name == name).collect();
    assert!(quiet.is_empty(), "sent while the leader renewed: {quiet:?}");
    assert!(a.status().renewals_ok >= 3, "{:?}", a.status());
    support::feed::released_once(&a, &rx, &name);
}

/// A release that leaves its identity leading other elections through
/// the store (a group's election that leaves while the group leads
/// others) keeps the identity's lock held, so the lock wakes nobody: the
/// release must be notified, and the follower of that election leads at
/// once.
#[test]
fn a_release_that_leaves_its_identity_leading_others_is_heard() {
    let (group, one, other) =
        (format!("feedg-{}", random_tag()), format!("feed-{}", random_tag()), format!("feed-{}", random_tag()));
    let template = Config::new(store(DIRECT, true), group).identity("a").timing(SLOW_POLL);
    let a = Group::start(GroupConfig::new(template)).expect("group a");
    let (a_one, a_other) = (a.join(&one).expect("join one"), a.join(&other).expect("join other"));
    assert!(wait_for(Duration::from_secs(10), || a_one.is_leader() && a_other.is_leader()), "a leads both");
    let key = store(DIRECT, false).__release_lock(a.identity());
    let mut admin = pg_support::client(DIRECT);
    assert!(wait_for(Duration::from_secs(10), || lock_holder(&mut admin, key).is_some()), "a took no lock");
    let b = Elector::start(config(store(DIRECT, true), &one, "b")).expect("start b");
    assert!(wait_for(Duration::from_secs(10), || b.status().leader.is_some()), "b never saw a lead");
    lock_waited_for(key);
    let released = Instant::now();
    a_one.leave().expect("a leaves one");
    let led = wait_for(QUICK, || b.is_leader());
    assert!(led, "b did not lead within {QUICK:?} of the release (its poll is a minute away)");
    eprintln!("one election of several released: b led {:?} after", released.elapsed());
    assert!(lock_holder(&mut admin, key).is_some(), "a, still leading other, gave its lock back");
    assert!(a_other.is_leader(), "a lost the other election");
}

/// Twenty followers on one store (one listening connection) and one
/// release: exactly one leads, and none claims more than once.
#[test]
fn twenty_followers_and_one_release_claim_once_each() {
    // The listener is proven before the first follower looks.
    support::feed::twenty_followers_and_one_release(&store(DIRECT, true), |_| {});
}

/// A group's followers hear the releases of a whole group shutting down and
/// take every election within a few seconds, on the one connection.
#[test]
fn a_group_takes_over_a_released_group_at_once() {
    support::feed::a_group_takes_over_a_released_group(|| store(DIRECT, true), |_| {});
}

/// A group whose store's feed ends (behind PgBouncer) goes on by polling:
/// its driver sees the feed close, and a released group is still taken
/// over, at the poll.
#[test]
fn a_group_goes_on_polling_when_its_feed_ends() {
    let group = format!("feedbouncer-{}", random_tag());
    let poll = Timing { retry_period: Duration::from_secs(1), ..SLOW_POLL };
    let start = |id: &str| {
        let s = store(BOUNCER, true);
        let ended = s.releases().expect("a feed until proven deaf");
        let template = Config::new(s, group.clone()).identity(id).timing(poll);
        let g = Group::start(GroupConfig::new(template)).expect("group");
        let e = g.join(&group).expect("join");
        (g, e, ended)
    };
    let (a, a_election, a_feed) = start("a");
    assert!(wait_for(Duration::from_secs(10), || a_election.is_leader()), "a leads");
    let (b, b_election, b_feed) = start("b");
    for feed in [a_feed, b_feed] {
        let closed = wait_for(Duration::from_secs(30), || {
            matches!(feed.try_recv(), Err(crossbeam_channel::TryRecvError::Disconnected))
        });
        assert!(closed, "the feed through PgBouncer did not end");
    }
    a.shutdown().expect("a releases");
    drop(a_election);
    assert!(wait_for(Duration::from_secs(5), || b_election.is_leader()), "b did not take over by polling");
    drop(b);
}

/// The feed outlives its connection: the listening session killed by the
/// server, it connects again, proves itself, and the next release is heard.
#[test]
fn the_feed_comes_back_after_its_connection_is_killed() {
    let app = format!("feedkill-{}", random_tag());
    let dsn_app = format!("{}?application_name={app}", dsn(DIRECT));
    let s = PostgresStore::builder(&dsn_app).table("public", TABLE).build().expect("store");
    s.ensure_schema().expect("ensure_schema");
    let rx = s.releases().expect("feed");
    let mut admin = pg_support::client(DIRECT);
    let listening = |admin: &mut postgres::Client| -> Option<i32> {
        let q = format!(
            "SELECT pid FROM pg_stat_activity WHERE application_name = '{app} listen' AND query LIKE 'LISTEN%'"
        );
        admin.query(q.as_str(), &[]).ok()?.first().map(|r| r.get(0))
    };
    let mut first = None;
    assert!(
        wait_for(Duration::from_secs(10), || {
            first = listening(&mut admin);
            first.is_some()
        }),
        "no listener"
    );
    let first = first.expect("a listener");
    admin.execute("SELECT pg_terminate_backend($1)", &[&first]).expect("terminate the listener");
    let mut again = None;
    let back = wait_for(Duration::from_secs(15), || {
        again = listening(&mut admin).filter(|&p| p != first);
        again.is_some()
    });
    assert!(back, "the feed did not connect again");
    assert!(!matches!(rx.try_recv(), Err(crossbeam_channel::TryRecvError::Disconnected)), "the feed ended");
    // Heard again: a leader's release comes through.
    let name = format!("feed-{}", random_tag());
    let a = Elector::start(config(store(DIRECT, false), &name, "a")).expect("start a");
    let guard = a.wait_leader_timeout(Duration::from_secs(10)).expect("a leads");
    a.shutdown().expect("a releases");
    drop(guard);
    let deadline = Instant::now() + QUICK;
    let heard = std::iter::from_fn(|| rx.recv_deadline(deadline).ok()).any(|r| r.name == name);
    assert!(heard, "the release after the reconnect was not heard");
    // Dropping the store ends the feed: its thread stops and closes the
    // connection.
    drop(s);
    let gone = wait_for(Duration::from_secs(5), || listening(&mut admin).is_none());
    assert!(gone, "the listening session outlived its store");
    assert!(matches!(rx.recv_timeout(Duration::from_secs(2)), Err(e) if e.is_disconnected()), "the feed stayed open");
}

/// A feed whose server cannot be reached keeps trying quietly (followers
/// poll meanwhile), and ends with its store.
#[test]
fn a_feed_without_a_server_keeps_trying_and_ends_with_its_store() {
    let s = PostgresStore::builder("postgres://root@127.0.0.1:1/test")
        .connect_timeout(Duration::from_millis(200))
        .build()
        .expect("store");
    let rx = s.releases().expect("feed");
    assert!(
        matches!(rx.recv_timeout(Duration::from_secs(2)), Err(e) if e.is_timeout()),
        "a feed without a server sent or ended"
    );
    drop(s);
    assert!(
        matches!(rx.recv_timeout(Duration::from_secs(5)), Err(e) if e.is_disconnected()),
        "the feed outlived its store"
    );
}

/// The `pg_locks` condition of the advisory lock `key`, as the library
/// writes it.
fn advisory(key: i64) -> String {
    PostgresStore::__advisory_lock(key)
}

/// The backend holding the advisory lock `key`, if any.
fn lock_holder(admin: &mut postgres::Client, key: i64) -> Option<u64> {
    let q = format!("SELECT pid FROM pg_locks WHERE {} AND granted", advisory(key));
    let rows = admin.query(q.as_str(), &[]).expect("pg_locks");
    rows.first().map(|r| u64::try_from(r.get::<_, i32>(0)).expect("a pid"))
}

/// Returns once a waiter session waits for the advisory lock `key`.
fn lock_waited_for(key: i64) {
    let mut admin = pg_support::client(DIRECT);
    let q = format!("SELECT count(*) FROM pg_locks WHERE {} AND NOT granted", advisory(key));
    let waits =
        wait_for(Duration::from_secs(10), || admin.query_one(q.as_str(), &[]).expect("pg_locks").get::<_, i64>(0) > 0);
    assert!(waits, "no waiter session waits for the lock {key}");
}

/// The lock feed (follower processes woken one at a time): the leader's
/// lock session killed while it leads wakes each follower once, with no
/// release sent, so only the lock can have woken them; nobody takes over,
/// the lock is taken again and the next release is heard.
#[test]
fn a_killed_lock_session_wakes_each_follower_once_and_the_feed_recovers() {
    let key = |identity: &str| store(DIRECT, false).__release_lock(identity);
    support::feed::a_killed_lock_session_wakes_each_follower_once(
        "postgres",
        || store(DIRECT, true),
        LockOf {
            holder: |identity: &str| lock_holder(&mut pg_support::client(DIRECT), key(identity)),
            kill: |pid: u64| {
                let pid = i32::try_from(pid).expect("a pid");
                pg_support::client(DIRECT).execute("SELECT pg_terminate_backend($1)", &[&pid]).expect("terminate");
            },
            waiting: |identity: &str| lock_waited_for(key(identity)),
        },
    );
}

/// A leader that holds no lock (its feed off, or an older version) wakes
/// nobody through the lock feed while it lives: a free lock is not a
/// release.
#[test]
fn a_leader_without_a_lock_wakes_nobody() {
    let name = format!("feed-{}", random_tag());
    let (sent, _a) = sent_while_the_leader_lives(&store(DIRECT, true), store(DIRECT, false), &name);
    assert_eq!(sent, 0, "a free lock woke the watcher while the leader lived");
}

/// The negative control of the rule above: waiters that wake whenever the
/// lock is free, without seeing it held first, wake every second.
#[test]
fn control_waking_on_a_free_lock_is_caught() {
    let name = format!("feed-{}", random_tag());
    let watcher = store(DIRECT, true).__release_feed_waking_on_free();
    let (sent, _a) = sent_while_the_leader_lives(&watcher, store(DIRECT, false), &name);
    assert!(sent >= 2, "waking on a free lock sent {sent} names; the storm check would not catch it");
}

/// Behind PgBouncer in transaction mode a session lock would stay on a
/// server connection the pooler lends to others: a leader there takes no
/// lock, before its feed has proved anything and after it found the
/// pooler. The same leader on the server directly takes its lock, so the
/// check can see one.
#[test]
fn behind_pgbouncer_a_leader_takes_no_lock() {
    let mut admin = pg_support::client(DIRECT);
    let lead = |var: &str| {
        let s = store(var, true);
        let rx = s.releases().expect("a feed until proven otherwise");
        let name = format!("feed-{}", random_tag());
        let a = Elector::start(config(s.clone(), &name, "a")).expect("start a");
        let guard = a.wait_leader_timeout(Duration::from_secs(10)).expect("a leads");
        (s.__release_lock(&support::feed::identity_of(&a)), rx, a, guard)
    };
    let (key, _rx, _a, _guard) = lead(DIRECT);
    let direct = wait_for(Duration::from_secs(10), || lock_holder(&mut admin, key).is_some());
    assert!(direct, "the leader on the server directly took no lock");
    let (key, rx, a, _guard) = lead(BOUNCER);
    let mut ended = None;
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        assert_eq!(lock_holder(&mut admin, key), None, "a lock taken through PgBouncer");
        match rx.try_recv() {
            Err(crossbeam_channel::TryRecvError::Disconnected) if ended.is_none() => ended = Some(Instant::now()),
            _ => {}
        }
        // Past the feed's end, a few renewals more.
        if ended.is_some_and(|t| t.elapsed() > Duration::from_secs(2)) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(ended.is_some(), "the feed through PgBouncer did not end within 30 s");
    assert!(a.is_leader(), "{:?}", a.status());
}

/// Dropping the store ends the lock feed too: its lock session and its
/// waiter sessions (one blocked in `pg_advisory_lock`) are gone from the
/// server.
#[test]
fn the_lock_sessions_end_with_their_store() {
    let app = format!("feedend-{}", random_tag());
    let s = PostgresStore::builder(&format!("{}?application_name={app}", dsn(DIRECT)))
        .table("public", TABLE)
        .build()
        .expect("store");
    s.ensure_schema().expect("ensure_schema");
    let _rx = s.releases().expect("feed");
    // Followed: a leader elsewhere (a waiter blocked on its lock) ...
    let name = format!("feed-{}", random_tag());
    let a = Elector::start(config(store(DIRECT, true), &name, "a")).expect("start a");
    let _guard = a.wait_leader_timeout(Duration::from_secs(10)).expect("a leads");
    s.inspect(&name, Duration::from_secs(5)).expect("inspect");
    lock_waited_for(s.__release_lock(&support::feed::identity_of(&a)));
    // ... and led: a lock session holding the lock of "me".
    let mine = format!("feed-{}", random_tag());
    s.acquire(&mine, "me", Duration::from_secs(30), b"", Duration::from_secs(5)).expect("claim");
    let mut admin = pg_support::client(DIRECT);
    let held = wait_for(Duration::from_secs(10), || lock_holder(&mut admin, s.__release_lock("me")).is_some());
    assert!(held, "no lock session");
    let sessions = |admin: &mut postgres::Client, app: &str| -> i64 {
        let q = format!("SELECT count(*) FROM pg_stat_activity WHERE application_name = '{app}'");
        admin.query_one(q.as_str(), &[]).expect("pg_stat_activity").get(0)
    };
    let lock_app = format!("{app} lock");
    assert_eq!(sessions(&mut admin, &lock_app), 2, "a lock session and a waiter");
    drop(s);
    let gone = wait_for(Duration::from_secs(10), || sessions(&mut admin, &lock_app) == 0);
    assert!(gone, "{} lock sessions outlived their store", sessions(&mut admin, &lock_app));
}
