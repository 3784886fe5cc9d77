//! The feed of releases on PostgreSQL's session advisory locks, through
//! the lock feed written once for both servers (`crate::lockfeed`, which
//! says how it works). Here: the lock of an identity is the advisory lock
//! of one `bigint` key (a hash of the table and the identity), taken with
//! `pg_try_advisory_lock` and given back with `pg_advisory_unlock`; a
//! waiter asks `pg_locks` whether it is held and waits with
//! `pg_advisory_lock(k), pg_advisory_unlock(k)` in one statement under a
//! `lock_timeout`; the feed's sessions end with `pg_terminate_backend`,
//! which a role may call on its own sessions.
//!
//! `NOTIFY` (`listen.rs`) wakes every listening process in the same
//! instant: with many follower processes their claims crowd the server at
//! once. The server grants a freed advisory lock to one waiter, which
//! passes it on at once, so followers wake one after another instead.
//!
//! **Only on sessions of their own.** A session lock outlives the
//! transaction that took it; behind a pooler in transaction mode it would
//! stay on a server connection the pooler lends to other clients. So the
//! feed opens no lock session until the listening connection has proved
//! that a connection here is a session of its own (its probe came back,
//! see `listen.rs`), and it turns off for good where that proof failed:
//! there followers poll, as with `LISTEN`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_postgres::error::SqlState;

use super::conn::{CallError, PgConnection, PgManager};
use super::sql;
use crate::feed::{fnv1a64, Subscribers};
use crate::lockfeed::{Failed, Locks, PACE};

/// The store's lock feed.
pub(super) type Feed = crate::lockfeed::Feed<AdvisoryLocks>;

/// Whether a pooler lends this server's sessions to other clients, as the
/// listening connection found out (its probe came back: no; it never did:
/// yes).
pub(super) type Lent = crate::lockfeed::Known;

/// The advisory lock key of `identity`'s leadership in the table
/// `qualified`, the same in every process.
pub(super) fn lock_key(qualified: &str, identity: &str) -> i64 {
    i64::from_ne_bytes(fnv1a64(&format!("{qualified}\n{identity}")).to_ne_bytes())
}

/// A new lock feed for the table `qualified`, whose sessions `manager`
/// opens once `lent` says no pooler lends them; its names go
/// to `subscribers`, which it shares with the `LISTEN` feed.
pub(super) fn feed(
    qualified: &str, manager: &Arc<PgManager>, lent: &Arc<Lent>, subscribers: &Arc<Subscribers>, wakes_on_free: bool,
) -> Feed {
    let locks = AdvisoryLocks { qualified: qualified.to_owned(), manager: Arc::clone(manager), lent: Arc::clone(lent) };
    crate::lockfeed::Feed::new(locks, Arc::clone(subscribers), wakes_on_free, PACE)
}

/// PostgreSQL's session advisory locks.
pub(super) struct AdvisoryLocks {
    qualified: String,
    manager: Arc<PgManager>,
    lent: Arc<Lent>,
}

impl AdvisoryLocks {
    /// Runs `sql` on `conn`, giving up `within` after the connect timeout;
    /// the first column of the last row.
    fn value(&self, conn: &mut PgConnection, sql: &str, within: Duration) -> Result<Option<String>, CallError> {
        let msgs = conn.simple_query(sql, Instant::now() + within + self.manager.connect_timeout())?;
        let rows = sql::rows(&msgs);
        Ok(rows.last().and_then(|r| r.first().copied().flatten()).map(str::to_owned))
    }

    fn yes(&self, conn: &mut PgConnection, sql: &str) -> Result<bool, Failed> {
        match self.value(conn, sql, Duration::ZERO).map_err(failed)? {
            Some(v) => Ok(v == "t"),
            None => Err(Failed::Session(format!("no answer to {sql}"))),
        }
    }
}

fn failed(e: CallError) -> Failed {
    Failed::Session(match e {
        CallError::Db(e) | CallError::Closed(Some(e)) => e.to_string(),
        CallError::Closed(None) => "the connection closed".into(),
        CallError::TimedOut => "no answer in time".into(),
        CallError::Misuse => "called inside a tokio runtime".into(),
    })
}

impl Locks for AdvisoryLocks {
    type Session = PgConnection;
    type Lock = i64;
    const SERVER: &'static str = "postgres";
    const OFF: &'static str = "session advisory locks need sessions of their own, which a pooler in transaction mode \
                               does not give";

    fn lock(&self, identity: &str) -> i64 {
        lock_key(&self.qualified, identity)
    }

    fn off(&self) -> bool {
        self.lent.known() == Some(true)
    }

    fn connect(&self) -> Result<(PgConnection, u32), Failed> {
        match self.lent.known() {
            Some(true) => return Err(Failed::Off),
            None => return Err(Failed::Session("not yet known whether connections here are sessions".into())),
            Some(false) => {}
        }
        let mut conn = self.manager.open_for("lock").map_err(|e| Failed::Session(e.to_string()))?;
        // A waiter's wait is bounded by its `lock_timeout` alone (set with
        // each wait), whatever the role's `statement_timeout`.
        let setup = "SET statement_timeout = 0; SELECT pg_backend_pid()";
        let pid = self.value(&mut conn, setup, Duration::ZERO).map_err(failed)?;
        let pid = pid.and_then(|p| p.parse::<u32>().ok()).ok_or_else(|| Failed::Session("no backend pid".into()))?;
        Ok((conn, pid))
    }

    fn take(&self, conn: &mut PgConnection, key: &i64) -> Result<bool, Failed> {
        self.yes(conn, &format!("SELECT pg_try_advisory_lock({key})"))
    }

    fn give_back(&self, conn: &mut PgConnection, key: &i64) -> Result<(), Failed> {
        self.yes(conn, &format!("SELECT pg_advisory_unlock({key})")).map(drop)
    }

    /// Without a statement: each would be a transaction, which the
    /// server counts (row 8 of BENCHMARKS.md counts them per renewal).
    fn check(&self, conn: &mut PgConnection) -> Result<(), Failed> {
        if conn.ended() {
            return Err(Failed::Session("the lock session ended".into()));
        }
        Ok(())
    }

    fn held(&self, conn: &mut PgConnection, key: &i64) -> Result<bool, Failed> {
        let sql = format!("SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_locks WHERE {})", sql::advisory_held(*key));
        self.yes(conn, &sql)
    }

    fn wait(&self, conn: &mut PgConnection, key: &i64, wait: Duration) -> Result<bool, Failed> {
        // Both in one implicit transaction, one round trip: a wait that runs
        // out aborts it, which undoes the `SET`, so each wait sets it anew.
        let sql = format!(
            "SET lock_timeout = '{}ms'; SELECT pg_advisory_lock({key}), pg_advisory_unlock({key})",
            wait.as_millis().max(1)
        );
        match self.value(conn, &sql, wait) {
            Ok(_) => Ok(true),
            // The `lock_timeout` ran out: still held.
            Err(CallError::Db(e)) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => Ok(false),
            Err(e) => Err(failed(e)),
        }
    }

    fn kill(&self, ids: &[u32]) {
        let Ok(mut conn) = self.manager.open_for("lock") else { return };
        let pids: Vec<String> = ids.iter().map(u32::to_string).collect();
        let sql = format!("SELECT pg_terminate_backend(p) FROM unnest('{{{}}}'::int[]) p", pids.join(","));
        let _ = self.value(&mut conn, &sql, Duration::ZERO);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_key_is_the_same_in_every_process() {
        let t = "\"public\".\"leader_election\"";
        let keys = [lock_key(t, "w-1"), lock_key(t, "w-2"), lock_key("\"public\".\"other\"", "w-1")];
        assert_eq!(keys[0], lock_key(t, "w-1"));
        assert!(keys[0] != keys[1] && keys[0] != keys[2] && keys[1] != keys[2], "{keys:?}");
        // Pinned: processes of different builds must agree.
        assert_eq!(lock_key("", ""), -5808579962898102051);
    }

    #[test]
    fn a_failed_step_says_what_failed() {
        let said = |e: CallError| match failed(e) {
            Failed::Session(s) => s,
            Failed::Off => panic!("a session's failure turned the feed off"),
        };
        assert_eq!(said(CallError::TimedOut), "no answer in time");
        assert_eq!(said(CallError::Closed(None)), "the connection closed");
        assert_eq!(said(CallError::Misuse), "called inside a tokio runtime");
    }

    #[test]
    fn the_lock_condition_names_both_halves_of_the_key() {
        // -1 is every bit set: both halves 4294967295.
        let c = sql::advisory_held(-1);
        assert!(c.contains("classid = '4294967295'::oid AND objid = '4294967295'::oid"), "{c}");
        let c = sql::advisory_held(1 << 32 | 7);
        assert!(c.contains("classid = '1'::oid AND objid = '7'::oid AND"), "{c}");
        assert!(c.contains("objsubid = 1") && c.ends_with(" AND granted"), "{c}");
        assert_eq!(c, format!("{} AND granted", sql::advisory_lock(1 << 32 | 7)));
    }

    /// The statements on a real server: a wait runs out after the wait it
    /// is given (the feed's pace, shortened in tests), waits again as long,
    /// and ends at once when the lock is given back.
    #[test]
    fn a_wait_lasts_what_it_is_given_and_ends_when_the_lock_is_given_back() {
        let dsn = crate::postgres::test_dsn();
        let manager = Arc::new(PgManager::from_dsn(&dsn, Some(Duration::from_secs(5)), None).expect("manager"));
        let locks = AdvisoryLocks {
            qualified: format!("locks-test-{}", std::process::id()),
            manager,
            lent: Arc::new(Lent::fixed(false)),
        };
        let (mut leader, _) = locks.connect().expect("the leader's session");
        let (mut waiter, _) = locks.connect().expect("a waiter's session");
        let key = locks.lock("me");
        assert!(!locks.held(&mut waiter, &key).unwrap(), "held before it was taken");
        assert!(locks.take(&mut leader, &key).unwrap());
        assert!(locks.held(&mut waiter, &key).unwrap());
        for wait in [Duration::from_millis(300), Duration::from_millis(600)] {
            let t = Instant::now();
            assert!(!locks.wait(&mut waiter, &key, wait).unwrap(), "the wait took a held lock");
            let took = t.elapsed();
            assert!(took >= wait && took < wait + Duration::from_secs(3), "a wait of {wait:?} took {took:?}");
        }
        let released = std::thread::scope(|s| {
            let w = s.spawn(|| locks.wait(&mut waiter, &key, Duration::from_secs(20)));
            let waiting = format!(
                "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_locks WHERE {} AND NOT granted)",
                sql::advisory_lock(key)
            );
            let deadline = Instant::now() + Duration::from_secs(10);
            while !locks.yes(&mut leader, &waiting).unwrap() {
                assert!(Instant::now() < deadline, "the waiter never waited");
            }
            locks.give_back(&mut leader, &key).unwrap();
            w.join().unwrap()
        });
        assert!(released.unwrap(), "the wait did not end with the release");
        assert!(!locks.held(&mut leader, &key).unwrap(), "the waiter kept the lock");
        locks.check(&mut leader).unwrap();
    }
}
