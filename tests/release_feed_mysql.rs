//! The feed of releases on MariaDB (issue 36): named locks instead of
//! `LISTEN`. A follower that has seen a leader leads within a round trip of
//! the leader's release, not at its next poll; a live leader wakes nobody.
//! Run with `bash scripts/test.sh`.
//!
//! The followers poll once a minute (`support::feed`), so a hand-over
//! within the few seconds these tests allow can only come from the feed;
//! the controls without it show that.

mod mysql_support;
mod support;

use std::time::Duration;

use leaderelection::mysql::MySqlStore;
use leaderelection::{Elector, Store};
use mysql::prelude::Queryable;
use mysql_support::{admin, url, SHARED};
use support::feed::{config, one_follower_and_a_release, sent_while_the_leader_lives, LockOf};
use support::{random_tag, wait_for};

const TABLE: &str = "le_feed";

fn store(feed: bool) -> MySqlStore {
    let s = MySqlStore::builder(&url(SHARED)).table(TABLE).release_feed(feed).build().expect("store");
    s.ensure_schema().unwrap_or_else(|e| panic!("ensure_schema: {e}"));
    s
}

/// The session holding `lock`, if any.
fn holder(admin: &mut mysql::Conn, lock: &str) -> Option<u64> {
    admin.query_first::<Option<u64>, _>(format!("SELECT IS_USED_LOCK('{lock}')")).expect("IS_USED_LOCK").flatten()
}

/// Returns once a waiter session waits for `lock` (`GET_LOCK`): a follower
/// that has just seen a leader has its waiter connect and look first, and a
/// release before that is learned at the poll.
fn waiting_for(lock: &str) {
    let mut admin = admin(SHARED);
    let q = format!("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE '%GET_LOCK(''{lock}''%'");
    let waits = wait_for(Duration::from_secs(10), || {
        admin.query_first::<usize, _>(q.as_str()).expect("PROCESSLIST").unwrap_or(0) > 0
    });
    assert!(waits, "no waiter session waits for {lock}");
}

#[test]
fn a_follower_leads_within_a_round_trip_of_a_release() {
    let ready = |leader: &str| waiting_for(&store(false).__release_lock(leader));
    one_follower_and_a_release("mariadb", store(true), store(true), true, ready);
}

/// The control: without the feed the same follower waits for its poll.
#[test]
fn without_the_feed_a_follower_waits_for_its_poll() {
    one_follower_and_a_release("mariadb", store(true), store(false), false, |_| {});
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
    support::feed::released_once(&a, &rx, &name);
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

/// Twenty followers on one store (one waiter session for them all) and
/// one release: exactly one leads, and none claims more than once.
#[test]
fn twenty_followers_and_one_release_claim_once_each() {
    let took = support::feed::twenty_followers_and_one_release(&store(true), |leader| {
        waiting_for(&store(false).__release_lock(leader))
    });
    eprintln!("mariadb, 20 followers: led {took:?} after the release");
}

/// A group's followers hear the releases of a whole group shutting down and
/// take every election within a few seconds.
#[test]
fn a_group_takes_over_a_released_group_at_once() {
    let took = support::feed::a_group_takes_over_a_released_group(
        || store(true),
        |leader| waiting_for(&store(false).__release_lock(leader)),
    );
    eprintln!("mariadb group: 20 elections led again {took:?} after the release");
}

/// The leader's lock session killed while it leads: each follower claims
/// once, nobody takes over, the lock is taken again and the next release
/// is heard.
#[test]
fn a_killed_lock_session_wakes_each_follower_once_and_the_feed_recovers() {
    let lock = |identity: &str| store(false).__release_lock(identity);
    support::feed::a_killed_lock_session_wakes_each_follower_once(
        "mariadb",
        || store(true),
        LockOf {
            holder: |identity: &str| holder(&mut admin(SHARED), &lock(identity)),
            kill: |session: u64| admin(SHARED).query_drop(format!("KILL CONNECTION {session}")).expect("kill"),
            waiting: |identity: &str| waiting_for(&lock(identity)),
        },
    );
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
