//! The store acceptance suite and MySQL-specific checks, against MariaDB
//! (the shared server on 127.0.0.1:3306, and for TLS the private instance).
//! Run with `bash scripts/test.sh` (it exports the URLs).

mod mysql_support;
mod support;

use std::time::{Duration, Instant};

use leaderelection::mysql::{MySqlBuilder, MySqlStore};
use leaderelection::storetest::Operator;
use leaderelection::{Lease, Store, StoreError};
use mysql::prelude::Queryable;
use mysql_support::claims::{current_batch_claim, current_claim, old_claim, run_claim_cases, NOW_SQL};
use mysql_support::{admin, exec, own_user_url, port, url, url_via, PRIVATE, SHARED};
use support::{
    a_late_renewal_extended_nothing, at_once, batches_skip_a_row_another_writer_locked, claims,
    ensure_schema_on_an_old_row, ensure_schema_then_claim_at_once, four_held_by_a,
    heartbeats_count_leads_once_the_schema_is_ensured, locked_row_calls_give_up_in_time, random_tag,
    swallowed_reads_give_up_in_time, wait_for, Proxy, Scratch, STORE_TIMEOUT as T, STORE_TTL as LONG,
};

const TABLE: &str = "le_storetest";

fn store() -> MySqlStore {
    let s = MySqlStore::builder(&url(SHARED)).table(TABLE).build().expect("store");
    s.ensure_schema().unwrap_or_else(|e| panic!("ensure_schema: {e}"));
    s
}

leaderelection::storetest_suite!(with members: store());

mod operator {
    leaderelection::storetest_suite!(operator: super::operated());
}

/// A store whose connections report rows found rather than rows changed
/// (`CLIENT_FOUND_ROWS`, a connection option, here through the store's own
/// options as a user's `mysql::Pool` may have it): `ROW_COUNT()` of a
/// statement that leaves a row as it was says 1, not 0. No call may take
/// that for a write of its own.
fn found_rows_store() -> MySqlStore {
    store();
    let opts = mysql::OptsBuilder::from_opts(mysql::Opts::from_url(&url(SHARED)).unwrap())
        .additional_capabilities(mysql::consts::CapabilityFlags::CLIENT_FOUND_ROWS);
    MySqlStore::builder_from_opts(opts.into()).table(TABLE).build().unwrap()
}

mod found_rows {
    leaderelection::storetest_suite!(super::found_rows_store());
}

/// Plain SQL on the store's table through a client of its own, as an
/// operator or a failover would change it. Each operator has a table of its
/// own, dropped when the operator is, because it may drop and re-create it.
struct MySqlOperator {
    /// The table, quoted.
    table: String,
    /// A second store on the table, for `ensure_schema` after a re-creation.
    ddl: MySqlStore,
}

/// A store on a fresh table, and an operator on that table.
fn operated() -> (MySqlStore, MySqlOperator) {
    let table = format!("le_op_{}", random_tag());
    let build = || MySqlStore::builder(&url(SHARED)).table(table.clone()).build().expect("store");
    let (s, ddl) = (build(), build());
    s.ensure_schema().unwrap_or_else(|e| panic!("ensure_schema: {e}"));
    (s, MySqlOperator { table: format!("`{table}`"), ddl })
}

impl Operator for MySqlOperator {
    fn delete_row(&self, name: &str) {
        exec(&mut admin(SHARED), &format!("DELETE FROM {} WHERE name = {}", self.table, hex(name.as_bytes())));
    }
    fn restore_row(&self, row: &Lease) {
        // REPLACE deletes the row there and inserts this one: the older copy
        // wins whatever the current row holds.
        let sql = format!(
            "REPLACE INTO {t} (name, holder, fence, acquired_at, renewed_at, expires_at, payload) \
             VALUES ({n}, {h}, {f}, {a}, {r}, {e}, {p})",
            t = self.table,
            n = hex(row.name.as_bytes()),
            h = hex(row.holder.as_bytes()),
            f = row.fence,
            a = row.acquired_at.as_unix_micros(),
            r = row.renewed_at.as_unix_micros(),
            e = row.expires_at.as_unix_micros(),
            p = hex(&row.payload),
        );
        exec(&mut admin(SHARED), &sql);
    }
    fn recreate_table(&self) {
        exec(&mut admin(SHARED), &format!("DROP TABLE {}", self.table));
        self.ddl.ensure_schema().unwrap_or_else(|e| panic!("ensure_schema after the drop: {e}"));
    }
}

impl Drop for MySqlOperator {
    fn drop(&mut self) {
        let _ = admin(SHARED).query_drop(format!("DROP TABLE IF EXISTS {}", self.table));
    }
}

/// Bytes as a hex literal, which no `sql_mode` or character set changes.
fn hex(b: &[u8]) -> String {
    format!("X'{}'", b.iter().map(|b| format!("{b:02x}")).collect::<String>())
}

/// `url`'s options, every session starting with `statement` (as a pool's
/// `init` may have it).
fn init_opts(url: &str, statement: &str) -> mysql::OptsBuilder {
    mysql::OptsBuilder::from_opts(mysql::Opts::from_url(url).unwrap()).init(vec![statement.to_owned()])
}

/// A store of [`TABLE`] on one pooled session, made with `opts`; without
/// the feed of releases, whose lock session a leading store opens on a
/// thread of its own (tests here count the pool's sessions).
fn one_session(opts: mysql::OptsBuilder) -> MySqlStore {
    MySqlStore::builder_from_opts(opts.into()).table(TABLE).pool_size(1).build().unwrap().release_feed(false)
}

/// A store of [`TABLE`] at `url` as it is (its schema not ensured).
fn store_at(url: &str) -> MySqlStore {
    MySqlStore::builder(url).table(TABLE).build().unwrap()
}

/// A store of [`TABLE`] to build, as `user` of the test's own (see
/// [`own_user_url`]).
fn as_user(c: &mut mysql::Conn, user: &str) -> MySqlBuilder {
    MySqlStore::builder(&own_user_url(c, user, TABLE)).table(TABLE)
}

/// [`TABLE`]'s schema ensured, an admin session, a store built by `opts`
/// from [`as_user`]`(user)`, and a fresh election `prefix-…` that "a" holds
/// on it: the session, the store and the lease (its `name` is the
/// election's).
fn held_as_user(
    user: &str, prefix: &str, opts: impl FnOnce(MySqlBuilder) -> MySqlBuilder,
) -> (mysql::Conn, MySqlStore, Lease) {
    store();
    let mut c = admin(SHARED);
    // The pool's sessions alone: a leading store's feed of releases holds
    // a named lock on a session of its own, which would count too.
    let s = opts(as_user(&mut c, user)).release_feed(false).build().unwrap();
    let lease = s.acquire(&format!("{prefix}-{}", random_tag()), "a", LONG, b"", T).unwrap();
    (c, s, lease)
}

/// A session of its own holding election `name`'s row (`SELECT … FOR
/// UPDATE` in a transaction left open until it rolls back or is dropped).
fn lock_row(name: &str) -> mysql::Conn {
    lock_row_in(TABLE, name)
}

fn lock_row_in(table: &str, name: &str) -> mysql::Conn {
    let mut locker = admin(SHARED);
    exec(&mut locker, "START TRANSACTION");
    exec(&mut locker, &format!("SELECT * FROM {table} WHERE name = {} FOR UPDATE", hex(name.as_bytes())));
    locker
}

/// The ids of `user`'s sessions, in order.
fn sessions_of(c: &mut mysql::Conn, user: &str) -> Vec<u64> {
    c.query(format!("SELECT ID FROM information_schema.PROCESSLIST WHERE USER = '{user}' ORDER BY ID")).unwrap()
}

fn micros(l: &Lease) -> u64 {
    l.acquired_at.as_unix_micros() as u64
}

/// The fence rule itself (hardening issue): a claim of an absent row takes
/// the server's clock in microseconds; a claim of an expired row
/// `max(fence + 1, now)`; the valid holder keeps its fence. (That fences
/// then grow across a deleted row, an older row and a re-created table is
/// the suite's operator cases, above.)
#[test]
fn fences_follow_the_server_clock() {
    let s = store();
    let name = format!("fence-{}", random_tag());
    let a = s.acquire(&name, "a", LONG, b"", T).unwrap();
    assert_eq!(a.fence, micros(&a), "an absent row's claim takes now() in microseconds: {a:?}");
    let again = s.acquire(&name, "a", LONG, b"", T).unwrap();
    assert_eq!(again.fence, a.fence, "the valid holder keeps its fence");
    s.release(&name, "a", a.fence, T).unwrap();
    let b = s.acquire(&name, "b", LONG, b"", T).unwrap();
    assert!(b.fence > a.fence && b.fence == micros(&b).max(a.fence + 1), "{a:?} -> {b:?}");
}

/// Sessions in very different time zones read the same instants.
#[test]
fn the_session_time_zone_changes_nothing() {
    store();
    let in_zone = |tz: &str| {
        let opts = init_opts(&url(SHARED), &format!("SET time_zone = '{tz}'"));
        MySqlStore::builder_from_opts(opts.into()).table(TABLE).build().unwrap()
    };
    let (east, west) = (in_zone("+13:00"), in_zone("-11:00"));
    let name = format!("tz-{}", random_tag());
    let a = east.acquire(&name, "a", LONG, b"", T).unwrap();
    let b = west.inspect(&name, T).unwrap();
    assert_eq!((a.expires_at, a.acquired_at), (b.expires_at, b.acquired_at));
    let gap = b.now.saturating_duration_since(a.now);
    assert!(gap < Duration::from_secs(2) && b.now >= a.now, "clocks 24 h apart? {a:?} {b:?}");
    let mut c = admin(SHARED);
    let unix: i64 = c.query_first("SELECT UNIX_TIMESTAMP()").unwrap().unwrap();
    let diff = (a.now.as_unix_micros() / 1_000_000 - unix).abs();
    assert!(diff < 5, "the store's now is {diff} s away from UNIX_TIMESTAMP()");
}

/// Every replica runs `ensure_schema` at start, so six at the same instant
/// (a barrier) on a table that does not exist yet, three times over: all
/// succeed, each can use the table at once, and running it again is a no-op.
#[test]
fn ensure_schema_is_idempotent_and_safe_concurrently() {
    for round in 0..3 {
        let table = format!("le_schema_{}", random_tag());
        ensure_schema_then_claim_at_once(
            round,
            |_| MySqlStore::builder(&url(SHARED)).table(table.clone()).build().unwrap(),
            MySqlStore::ensure_schema,
        );
        let s = MySqlStore::builder(&url(SHARED)).table(table.clone()).build().unwrap();
        s.ensure_schema().expect("idempotent");
        assert!(s.inspect("e0", T).unwrap().held_by("a"), "a second ensure_schema changed the table");
        exec(&mut admin(SHARED), &format!("DROP TABLE `{table}`"));
    }
}

/// A missing table is fatal, reported at once with the server's code.
#[test]
fn missing_table_is_fatal() {
    let s = MySqlStore::builder(&url(SHARED)).table(format!("le_missing_{}", random_tag())).build().unwrap();
    for e in [s.inspect("e", T).unwrap_err(), s.acquire("e", "a", LONG, b"", T).unwrap_err()] {
        assert!(e.is_fatal(), "{e:?}");
        let text = e.to_string();
        assert!(text.contains("1146") && text.contains("doesn't exist"), "{text}");
    }
}

/// A table made by hand whose fence column is too narrow for this store's
/// fences (microseconds since 1970 need a BIGINT): the server refuses the
/// value (1264, SQLSTATE 22003) on every try, so it is fatal, with the code.
#[test]
fn a_fence_column_too_narrow_is_fatal() {
    let table = format!("le_narrow_{}", random_tag());
    let ddl = MySqlStore::schema(&table).unwrap().replace("fence       BIGINT", "fence       INT");
    assert!(ddl.contains("fence       INT "), "{ddl}");
    let mut c = admin(SHARED);
    exec(&mut c, &ddl);
    let s = MySqlStore::builder(&url(SHARED)).table(table.clone()).build().unwrap();
    let e = s.acquire("e", "a", LONG, b"", T).expect_err("a fence that does not fit was written");
    exec(&mut c, &format!("DROP TABLE `{table}`"));
    assert!(e.is_fatal(), "{e}");
    assert!(e.to_string().contains("1264"), "{e}");
}

/// First mistakes come back from the first call, at once, with the code.
#[test]
fn unknown_database_and_bad_password_are_fatal_at_once_without_the_password() {
    let p = port(SHARED);
    let cases = [
        (format!("mysql://root@127.0.0.1:{p}/le_no_such_db_{}", random_tag()), "1049"),
        (format!("mysql://le_nobody:hunter2@127.0.0.1:{p}/test"), "1045"),
    ];
    for (u, code) in cases {
        let s = MySqlStore::builder(&u).table(TABLE).build().unwrap();
        assert!(!format!("{s:?}").contains("hunter2"));
        let start = Instant::now();
        let e = s.inspect("e", Duration::from_secs(3)).unwrap_err();
        let took = start.elapsed();
        let text = format!("{e} {e:?}");
        assert!(e.is_fatal(), "{text}");
        assert!(text.contains(code), "{text}");
        assert!(!text.contains("hunter2"), "{text}");
        assert!(took < Duration::from_secs(1), "reported after {took:?}");
    }
}

/// A loopback TCP URL stays on TCP (the crate would switch to the socket).
#[test]
fn tcp_urls_use_tcp() {
    let s = store();
    let name = format!("tcp-{}", random_tag());
    s.acquire(&name, "a", LONG, b"", T).unwrap();
    let mut c = admin(SHARED);
    // The store's idle connection shows in the process list with its TCP
    // peer; a socket connection would show "localhost".
    let hosts: Vec<String> =
        c.query("SELECT HOST FROM information_schema.PROCESSLIST WHERE ID <> CONNECTION_ID() AND DB = 'test'").unwrap();
    assert!(!hosts.is_empty());
    assert!(hosts.iter().all(|h| h.starts_with("127.0.0.1:")), "a session not on TCP: {hosts:?}");
}

/// Another session holds the election row (`SELECT … FOR UPDATE`): renew,
/// acquire and release give up in time with a retryable error, reads do not
/// wait, and once the lock goes all works again.
///
/// With a timeout above the server's smallest lock wait (1 s) the server
/// gives up first (error 1205); with a shorter one the store gives up at its
/// own deadline and has the server end the abandoned session, so the
/// statement does not land once the lock goes. Ending it takes a connection
/// and a round trip of its own (milliseconds), so the test waits for those
/// sessions to be gone, with the lock still held, before letting it go: a
/// lock that goes sooner than that may still let a statement land.
#[test]
fn locked_row_gives_up_in_time() {
    let (mut c, s, lease) = held_as_user("le_locked", "locked", |b| b);
    let name = lease.name.clone();
    let mut locker = lock_row(&name);
    for timeout in [Duration::from_millis(1600), Duration::from_millis(600)] {
        let errors = locked_row_calls_give_up_in_time(&s, &name, lease.fence, timeout, Duration::from_millis(250));
        for (_, e) in errors.iter().filter(|_| timeout > Duration::from_secs(1)) {
            assert!(e.to_string().contains("1205"), "the server's lock wait bound did not fire: {e}");
        }
    }
    assert!(s.inspect(&name, Duration::from_millis(600)).is_ok(), "a plain read waited on a row lock");
    // The sessions of the calls given up on end while the lock is held, and
    // well before the server's own bound would end the last one (1 s after
    // it was sent, 600 ms ago).
    let ended = wait_for(Duration::from_millis(250), || {
        let running: Option<u64> = c
            .query_first(
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER = 'le_locked' AND COMMAND <> 'Sleep'",
            )
            .unwrap();
        running == Some(0)
    });
    assert!(ended, "a statement the store gave up on is still running on the server");
    exec(&mut locker, "ROLLBACK");
    // The abandoned calls finish, and none of them landed once the lock went.
    assert!(wait_for(Duration::from_secs(5), || format!("{s:?}").contains("abandoned_calls: 0")), "{s:?}");
    std::thread::sleep(Duration::from_millis(1200)); // past the server's 1 s lock-wait bound
    let l = s.inspect(&name, T).unwrap();
    assert_eq!(
        (l.holder.as_str(), l.fence, l.renewed_at, l.expires_at),
        (lease.holder.as_str(), lease.fence, lease.renewed_at, lease.expires_at),
        "a call the store gave up on landed after the lock went"
    );
    let renewed = s.renew(&name, "a", lease.fence, LONG, b"", T).expect("renew after the lock went");
    assert_eq!(renewed.fence, lease.fence);
}

/// A socket timeout shorter than the call's (the builder allows it): the
/// read gives up first and the call fails, while the statement is still
/// waiting on the server for a row lock. Its session is ended too, as for
/// a call given up on, so the release does not land once the lock goes.
#[test]
fn a_read_that_timed_out_does_not_land_later() {
    let (mut c, s, lease) =
        held_as_user("le_readtimeout", "read-timeout", |b| b.socket_timeout(Duration::from_millis(300)));
    let name = lease.name.clone();
    let mut locker = lock_row(&name);
    let start = Instant::now();
    let e = s.release(&name, "a", lease.fence, Duration::from_secs(3)).expect_err("a release of a locked row");
    let took = start.elapsed();
    eprintln!("read timeout: release returned after {took:?}: {e}");
    assert!(e.is_retryable(), "{e:?}");
    assert!(took < Duration::from_millis(900), "the socket timeout did not fire: {took:?}");
    // Its session ends while the lock is still held (the server would keep
    // it waiting for 2 s).
    let ended = wait_for(Duration::from_secs(1), || {
        let n: Option<u64> =
            c.query_first("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER = 'le_readtimeout'").unwrap();
        n == Some(0)
    });
    assert!(ended, "the statement whose read timed out is still running on the server");
    exec(&mut locker, "ROLLBACK");
    std::thread::sleep(Duration::from_millis(1500)); // past the statement's 2 s lock-wait bound
    let l = s.inspect(&name, T).unwrap();
    assert!(!l.expired() && l.expires_at == lease.expires_at, "the timed-out release landed later: {l:?}");
}

/// Another session holds the table (`LOCK TABLES … WRITE`): reads give up
/// in time too.
#[test]
fn locked_table_gives_up_in_time() {
    let table = format!("le_locked_{}", random_tag());
    let s = MySqlStore::builder(&url(SHARED)).table(table.clone()).build().unwrap();
    s.ensure_schema().unwrap();
    s.acquire("e", "a", LONG, b"", T).unwrap();
    let mut locker = admin(SHARED);
    exec(&mut locker, &format!("LOCK TABLES `{table}` WRITE"));
    let start = Instant::now();
    let e = s.inspect("e", Duration::from_millis(500)).expect_err("inspect on a locked table");
    let took = start.elapsed();
    eprintln!("locked table: inspect returned after {took:?}: {e}");
    assert!(e.is_retryable(), "{e:?}");
    assert!(took < Duration::from_millis(800), "took {took:?}");
    exec(&mut locker, "UNLOCK TABLES");
    assert!(s.inspect("e", T).unwrap().held_by("a"));
    exec(&mut locker, &format!("DROP TABLE `{table}`"));
}

/// `ensure_schema` is bounded too (by the builder's `ddl_timeout`): with the
/// table held by `LOCK TABLES … WRITE` elsewhere it gives up in time, and
/// works once the lock goes.
#[test]
fn ensure_schema_gives_up_at_its_timeout() {
    let table = format!("le_ddl_{}", random_tag());
    let build = |d| MySqlStore::builder(&url(SHARED)).table(table.clone()).ddl_timeout(d).build().unwrap();
    build(T).ensure_schema().unwrap();
    let s = build(Duration::from_millis(500));
    let mut locker = admin(SHARED);
    exec(&mut locker, &format!("LOCK TABLES `{table}` WRITE"));
    let start = Instant::now();
    let e = s.ensure_schema().expect_err("ensure_schema on a table locked elsewhere");
    let took = start.elapsed();
    eprintln!("locked table: ensure_schema returned after {took:?}: {e}");
    assert!(e.is_retryable(), "{e:?}");
    assert!(took < Duration::from_millis(800), "took {took:?} with a 500 ms ddl_timeout");
    exec(&mut locker, "UNLOCK TABLES");
    s.ensure_schema().expect("ensure_schema once the lock went");
    exec(&mut locker, &format!("DROP TABLE `{table}`"));
}

/// Calls waiting for one of the pool's connections give up at their own
/// deadline: with the only connection held by a call stuck on a row lock,
/// another call fails in time, saying the pool is busy.
#[test]
fn a_call_waiting_for_a_busy_pool_gives_up_in_time() {
    let s = MySqlStore::builder(&url(SHARED)).table(TABLE).pool_size(1).build().unwrap();
    s.ensure_schema().unwrap();
    let name = format!("busy-{}", random_tag());
    let lease = s.acquire(&name, "a", LONG, b"", T).unwrap();
    let mut locker = lock_row(&name);
    std::thread::scope(|sc| {
        let stuck = sc.spawn(|| s.renew(&name, "a", lease.fence, LONG, b"", Duration::from_millis(1600)));
        assert!(wait_for(T, || format!("{s:?}").contains("idle: 0")), "{s:?}");
        let start = Instant::now();
        let e = s.inspect(&name, Duration::from_millis(300)).expect_err("a call with no connection to run on");
        let took = start.elapsed();
        assert!(e.is_retryable() && e.to_string().contains("busy"), "{e}");
        assert!(took >= Duration::from_millis(250) && took < Duration::from_millis(450), "took {took:?}");
        assert!(stuck.join().unwrap().is_err(), "the renew of a locked row succeeded");
    });
    exec(&mut locker, "ROLLBACK");
    assert!(s.inspect(&name, T).unwrap().held_by("a"));
}

/// A path that swallows packets: calls return within the timeout, stuck
/// connections are closed (not pooled), and once the path heals the store
/// works again on fresh connections.
#[test]
fn swallowing_path() {
    store();
    let proxy = Proxy::start(("127.0.0.1", port(SHARED)));
    let s = MySqlStore::builder(&url_via(SHARED, "root", "127.0.0.1", proxy.port, ""))
        .table(TABLE)
        .connect_timeout(Duration::from_millis(700))
        .socket_timeout(Duration::from_secs(1))
        .release_feed(false) // the pool's connections alone go through the proxy
        .build()
        .unwrap();
    let name = format!("swallow-{}", random_tag());
    s.acquire(&name, "a", LONG, b"", T).unwrap();
    assert_eq!(proxy.open_connections(), 1);
    proxy.swallow(true);
    let timeout = Duration::from_millis(500);
    swallowed_reads_give_up_in_time(&s, &name, timeout, Duration::from_millis(150));
    assert!(proxy.open_connections() <= 4, "open: {}", proxy.open_connections());
    proxy.swallow(false);
    assert!(
        wait_for(Duration::from_secs(10), || s.inspect(&name, Duration::from_millis(800)).is_ok()),
        "store did not recover once the path healed: {s:?}"
    );
    // Connections abandoned at their deadline were closed, not kept.
    assert!(wait_for(Duration::from_secs(5), || proxy.open_connections() <= 1), "open: {}", proxy.open_connections());
    assert!(s.renew(&name, "a", 0, LONG, b"", T).is_err_and(|e| e.is_lease_lost()));
    let l = s.inspect(&name, T).unwrap();
    assert!(s.renew(&name, "a", l.fence, LONG, b"", T).is_ok());
}

/// The server kills the store's sessions: the next call still succeeds, on
/// a fresh connection.
#[test]
fn killed_sessions_are_replaced() {
    let (mut c, s, l) = held_as_user("le_kill", "kill", |b| b);
    let name = l.name.clone();
    for round in 0..3 {
        let ids: Vec<u64> = c.query("SELECT ID FROM information_schema.PROCESSLIST WHERE USER = 'le_kill'").unwrap();
        assert!(!ids.is_empty(), "round {round}: no session of the store to kill");
        for id in ids {
            let _ = c.query_drop(format!("KILL {id}"));
        }
        let r = s.renew(&name, "a", l.fence, LONG, b"", T);
        assert!(r.is_ok(), "round {round}: renew after the session was killed: {r:?}");
    }
}

// ---- TLS: the private instance has TLS on with the snakeoil certificate
// for "localhost"; the shared server has no TLS.

fn tls_ca() -> String {
    std::env::var("LE_MYSQL_TLS_CA")
        .unwrap_or_else(|_| panic!("LE_MYSQL_TLS_CA is not set: run `source scripts/mysql.sh`"))
}

#[test]
fn tls_verifies_and_encrypts() {
    let ca = tls_ca();
    let p = port(PRIVATE);
    let mut c = admin(PRIVATE);
    exec(&mut c, "CREATE USER IF NOT EXISTS 'le_tls'@'127.0.0.1' REQUIRE SSL");
    exec(&mut c, "GRANT ALL ON test.* TO 'le_tls'@'127.0.0.1'");
    // Certificate for "localhost", reached as 127.0.0.1: refused, not downgraded.
    let s = store_at(&format!("mysql://le_tls@127.0.0.1:{p}/test?ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}"));
    let e = s.inspect("e", Duration::from_secs(2)).unwrap_err();
    assert!(e.is_fatal(), "{e}");
    assert!(e.to_string().contains("TLS"), "{e}");
    // Right name and CA: it works, as a user the server only lets in over TLS.
    for mode in ["REQUIRED", "VERIFY_CA", "VERIFY_IDENTITY"] {
        let s = store_at(&format!("mysql://le_tls@localhost:{p}/test?ssl-mode={mode}&ssl-ca={ca}"));
        s.ensure_schema().unwrap_or_else(|e| panic!("{mode}: {e}"));
        let name = format!("tls-{}", random_tag());
        assert!(s.acquire(&name, "a", LONG, b"", T).unwrap().held_by("a"), "{mode}");
    }
    // And that user cannot get in without TLS (the control).
    let plain = store_at(&format!("mysql://le_tls@127.0.0.1:{p}/test"));
    assert!(plain.inspect("e", Duration::from_secs(2)).unwrap_err().is_fatal());
}

#[test]
fn tls_required_never_falls_back_to_plaintext() {
    let p = port(SHARED);
    let s = store_at(&format!("mysql://root@127.0.0.1:{p}/test?ssl-mode=REQUIRED"));
    let e = s.inspect("e", Duration::from_secs(2)).unwrap_err();
    assert!(e.is_fatal(), "{e}");
    assert!(e.to_string().contains("does not support"), "{e}");
}

/// Sessions that start with autocommit off (a server's `autocommit = 0`,
/// or an `init` statement as here) still commit every call: a release hands
/// over at once, and reads see the latest row, not a snapshot left open.
#[test]
fn sessions_with_autocommit_off_still_commit_every_call() {
    store();
    let s = one_session(init_opts(&url(SHARED), "SET autocommit = 0"));
    let other = store();
    let name = format!("autocommit-{}", random_tag());
    let a = s.acquire(&name, "a", LONG, b"", T).unwrap();
    assert!(s.inspect(&name, T).unwrap().held_by("a"));
    s.release(&name, "a", a.fence, T).unwrap();
    let seen = other.inspect(&name, T).unwrap();
    assert!(seen.expired(), "the release did not commit: another session still sees {seen:?}");
    let b = other.acquire(&name, "b", LONG, b"", Duration::from_secs(2)).expect("a claim after the release");
    assert!(b.held_by("b"), "{b:?}");
    let from_a = s.inspect(&name, T).unwrap();
    assert_eq!(from_a.holder, "b", "a read kept seeing an old snapshot: {from_a:?}");
}

/// Sessions left read-only by the application (`SET SESSION TRANSACTION
/// READ ONLY` in a pool's `init`, or on a borrowed session) still write:
/// only the server's own `read_only` makes a write's transaction
/// read-only (issue 37), and the session keeps its default afterwards.
#[test]
fn sessions_left_read_only_by_the_application_still_write() {
    store();
    let opts = init_opts(&url(SHARED), "SET SESSION TRANSACTION READ ONLY");
    let mut raw = mysql::Conn::new(opts.clone()).unwrap();
    let e = raw.query_drop(format!("UPDATE {TABLE} SET holder = holder WHERE name = 'none'"));
    assert!(matches!(&e, Err(mysql::Error::MySqlError(m)) if m.code == 1792), "the session is not read-only: {e:?}");
    let s = one_session(opts);
    let name = format!("session-read-only-{}", random_tag());
    let a = s.acquire(&name, "a", LONG, b"", T).expect("acquire on a read-only session");
    assert!(s.renew(&name, "a", a.fence, LONG, b"", T).unwrap().held_by("a"));
    s.release(&name, "a", a.fence, T).unwrap();
    assert!(store().inspect(&name, T).unwrap().expired(), "the release did not commit");
}

/// The history stamp is the server's own `server_id`, read once per call
/// into a variable the statements carry (issue 34, item 5): a session's
/// `server_id` (MariaDB lets a session set one; a borrowed or `init`ed
/// session may carry it) does not stamp the row, and under
/// statement-based replication a replica stores the value the source read.
/// Before, the statements read `@@server_id` themselves and stamped the
/// session's 4242.
#[test]
fn rows_are_stamped_with_the_servers_own_id_not_a_sessions() {
    store();
    let s = one_session(init_opts(&url(SHARED), "SET SESSION server_id = 4242"));
    let name = format!("stamp-{}", random_tag());
    s.acquire(&name, "a", LONG, b"", T).expect("acquire");
    let mut c = admin(SHARED);
    let q = format!("SELECT CAST(history AS CHAR) FROM {TABLE} WHERE name = {}", hex(name.as_bytes()));
    let stamp: Option<String> = c.query_first(q).unwrap();
    let own: Option<String> = c.query_first("SELECT CAST(@@GLOBAL.server_id AS CHAR)").unwrap();
    assert_eq!(stamp, own, "the row carries a session's server_id, not the server's");
    assert_ne!(own.as_deref(), Some("4242"), "the test's premise: the server's own id is not the session's");
}

/// A call given up on while its connection was still being opened (a slow
/// path, a server slow to greet) never runs once the connection is up: its
/// caller was told it failed, so it must not land later. The control: with
/// time enough, the same path works.
#[test]
fn a_call_given_up_on_while_connecting_never_runs() {
    store();
    let proxy = Proxy::start(("127.0.0.1", port(SHARED)));
    proxy.delay_connections(Duration::from_millis(800));
    let s = MySqlStore::builder(&url_via(SHARED, "root", "127.0.0.1", proxy.port, "")).table(TABLE).build().unwrap();
    let name = format!("late-connect-{}", random_tag());
    let start = Instant::now();
    let e = s.acquire(&name, "late", LONG, b"", Duration::from_millis(300)).expect_err("no connection within 300 ms");
    let took = start.elapsed();
    assert!(e.is_retryable() && e.to_string().contains("no connection within 300ms"), "{e:?}");
    assert!(took < Duration::from_millis(450), "took {took:?}");
    // The connection comes up 800 ms in, and the abandoned call ends.
    assert!(wait_for(Duration::from_secs(5), || format!("{s:?}").contains("abandoned_calls: 0")), "{s:?}");
    let r = store().inspect(&name, T);
    assert!(r.as_ref().is_err_and(|e| e.is_no_lease()), "the abandoned acquire landed after its caller gave up: {r:?}");
    let ok = s.acquire(&name, "on-time", LONG, b"", Duration::from_secs(3)).expect("the slow path works with time");
    assert!(ok.held_by("on-time"), "{ok:?}");
}

/// A connection whose call failed on the server (here a lock wait, 1205,
/// which leaves the transaction open and the session's lock-wait bound
/// changed) or that its caller gave up on is closed, never pooled: the next
/// call runs on a new session. A healthy connection is reused (the control).
#[test]
fn a_connection_that_failed_or_timed_out_is_never_reused() {
    let (mut c, s, lease) = held_as_user("le_reuse", "reuse", |b| b.pool_size(1));
    let mut sessions = || -> Vec<u64> { sessions_of(&mut c, "le_reuse") };
    let name = lease.name.clone();
    let first = sessions();
    s.inspect(&name, T).unwrap();
    assert!(first.len() == 1 && sessions() == first, "a healthy connection is reused: {first:?}");
    let mut locker = lock_row(&name);
    let mut seen = first.clone();
    for (timeout, what) in [(Duration::from_millis(1600), "1205"), (Duration::from_millis(600), "no answer")] {
        let e = s.renew(&name, "a", lease.fence, LONG, b"", timeout).expect_err("renew of a locked row");
        assert!(e.to_string().contains(what), "{e}");
        let before = seen.clone();
        assert!(
            wait_for(Duration::from_secs(3), || sessions().iter().all(|id| !before.contains(id))),
            "after '{e}' the session stayed open: {:?} (earlier {before:?})",
            sessions()
        );
        assert!(wait_for(Duration::from_secs(3), || format!("{s:?}").contains("abandoned_calls: 0")), "{s:?}");
        s.inspect(&name, T).unwrap();
        let now = sessions();
        assert!(now.len() == 1 && !before.contains(&now[0]), "after '{e}' the next call reused {now:?}");
        seen.extend(now);
    }
    exec(&mut locker, "ROLLBACK");
    assert!(s.renew(&name, "a", lease.fence, LONG, b"", T).is_ok());
}

/// A connection idle in the pool for longer than `idle_timeout` is closed
/// when next found, and the call runs on a new one; a younger one is reused.
#[test]
fn idle_connections_past_their_timeout_are_closed() {
    let (mut c, s, lease) = held_as_user("le_idle", "idle", |b| b.idle_timeout(Duration::from_millis(300)));
    let mut sessions = || -> Vec<u64> { sessions_of(&mut c, "le_idle") };
    let name = lease.name;
    let first = sessions();
    s.inspect(&name, T).unwrap();
    assert!(first.len() == 1 && sessions() == first, "a young idle connection is reused: {first:?}");
    std::thread::sleep(Duration::from_millis(400)); // past the idle timeout
    s.inspect(&name, T).unwrap();
    let replaced = wait_for(Duration::from_secs(2), || {
        let now = sessions();
        now.len() == 1 && now != first
    });
    assert!(replaced, "an old idle connection was reused or left open: {first:?} -> {:?}", sessions());
}

/// A row read back that is not what the call wrote (here a trigger changes
/// the payload on its way in) is an error, never a silent success.
#[test]
fn a_row_that_is_not_what_was_written_is_an_error() {
    let table = format!("le_tamper_{}", random_tag());
    let s = MySqlStore::builder(&url(SHARED)).table(table.clone()).build().unwrap();
    s.ensure_schema().unwrap();
    let mut c = admin(SHARED);
    // Control: without the triggers the same calls succeed.
    let ok = s.acquire("control", "a", LONG, b"mine", T).unwrap();
    assert!(ok.held_by("a"));
    exec(
        &mut c,
        &format!("CREATE TRIGGER `{table}_i` BEFORE INSERT ON `{table}` FOR EACH ROW SET NEW.payload = X'00'"),
    );
    exec(
        &mut c,
        &format!("CREATE TRIGGER `{table}_u` BEFORE UPDATE ON `{table}` FOR EACH ROW SET NEW.payload = X'00'"),
    );
    let e = s.acquire("e", "a", LONG, b"mine", T).expect_err("an acquire whose row came back altered succeeded");
    assert!(e.to_string().contains("not the one written"), "{e}");
    let e = s.renew("control", "a", ok.fence, LONG, b"mine", T).expect_err("a renew whose row came back altered");
    assert!(e.to_string().contains("not the one written"), "{e}");
    // A trigger that renames the row on its way in: the write leaves no row
    // under the name asked for, and that is no success either.
    exec(&mut c, &format!("DROP TRIGGER `{table}_i`"));
    exec(
        &mut c,
        &format!(
            "CREATE TRIGGER `{table}_i` BEFORE INSERT ON `{table}` FOR EACH ROW SET NEW.name = CONCAT(NEW.name, X'21')"
        ),
    );
    let e = s.acquire("f", "a", LONG, b"mine", T).expect_err("an acquire that left no row succeeded");
    assert!(e.is_retryable() && e.to_string().contains("no row after the write"), "{e}");
    exec(&mut c, &format!("DROP TABLE `{table}`"));
}

/// What [`tls_proxy`] does when the client's TLS ClientHello comes.
#[derive(Clone, Copy, PartialEq)]
enum AtClientHello {
    /// Shuts both ends down.
    Cut,
    /// Reads it and answers nothing, holding both ends open.
    Swallow,
}

/// A proxy on a free port of 127.0.0.1 to the private (TLS) server that
/// passes its greeting and the client's TLS request, then meets the
/// ClientHello as `then` says; for four connections. Returns its port.
fn tls_proxy(then: AtClientHello) -> u16 {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    let target = port(PRIVATE);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let proxy_port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for client in listener.incoming().take(4) {
            let Ok(mut client) = client else { continue };
            let Ok(mut server) = TcpStream::connect(("127.0.0.1", target)) else { continue };
            let mut buf = [0u8; 4096];
            // The server's greeting, whole.
            let n = server.read(&mut buf).unwrap_or(0);
            let _ = client.write_all(&buf[..n]);
            // The client's SSL request (a 32-byte packet), passed on.
            let mut req = [0u8; 36];
            if client.read_exact(&mut req).is_ok() {
                let _ = server.write_all(&req);
            }
            let _ = client.read(&mut buf);
            if then == AtClientHello::Cut {
                let _ = client.shutdown(std::net::Shutdown::Both);
                let _ = server.shutdown(std::net::Shutdown::Both);
            } else {
                held.push((client, server));
            }
        }
    });
    proxy_port
}

/// The connection breaks in the middle of the TLS handshake (a proxy passes
/// the greeting and the client's TLS request, then cuts both ends when the
/// handshake starts): an I/O failure, so retryable, not a certificate
/// problem.
#[test]
fn tls_handshake_cut_short_is_retryable() {
    let ca = tls_ca();
    let proxy_port = tls_proxy(AtClientHello::Cut);
    let s = store_at(&format!("mysql://root@localhost:{proxy_port}/test?ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}"));
    let e = s.inspect("e", Duration::from_secs(3)).unwrap_err();
    eprintln!("TLS handshake cut short: {e}");
    assert!(e.is_retryable(), "{e}");
    assert!(e.to_string().contains("TLS"), "{e}");
}

/// [`Scratch`] in this suite: a table of a test's own, dropped when it goes (even when the test
/// fails). The name may need quoting.
impl Scratch {
    /// The name quoted as the store quotes it.
    fn quoted(&self) -> String {
        format!("`{}`", self.table.replace('`', "``"))
    }

    fn store(&self) -> MySqlStore {
        MySqlStore::builder(&url(SHARED)).table(self.table.clone()).build().unwrap()
    }

    /// Creates the table as versions before the `terms` column did.
    fn create_old(&self) {
        exec(
            &mut admin(SHARED),
            &format!(
                "CREATE TABLE {} (name VARBINARY(255) NOT NULL, holder VARBINARY(255) NOT NULL, \
                 fence BIGINT NOT NULL CHECK (fence > 0), acquired_at BIGINT NOT NULL, renewed_at BIGINT NOT NULL, \
                 expires_at BIGINT NOT NULL, payload MEDIUMBLOB NOT NULL, PRIMARY KEY (name)) ENGINE = InnoDB",
                self.quoted()
            ),
        );
    }

    /// The election's `terms`, read by plain SQL.
    fn terms(&self, name: &str) -> i64 {
        let q = format!("SELECT terms FROM {} WHERE name = {}", self.quoted(), hex(name.as_bytes()));
        admin(SHARED).query_first(&q).unwrap_or_else(|e| panic!("{q}: {e}")).unwrap_or_else(|| panic!("{q}: no row"))
    }

    /// How many columns named `terms` the table has.
    fn terms_columns(&self) -> i64 {
        let q = format!(
            "SELECT COUNT(*) FROM information_schema.COLUMNS \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = {} AND COLUMN_NAME = 'terms'",
            hex(self.table.as_bytes())
        );
        admin(SHARED).query_first(&q).unwrap().unwrap()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let t = self.table.replace('`', "``");
        let _ =
            admin(SHARED).query_drop(format!("DROP TABLE IF EXISTS `{t}`, `{t}_slots`, `{t}_members`, `{t}_terms`"));
    }
}

/// `terms` counts claims (issue 12): 1 for an absent row; unchanged by a
/// renewal, the holder's re-acquire of its valid lease, a losing claim, an
/// inspect and a release by another identity; one more for a takeover of an
/// expired lease and for a claim after a release. The takeover case is the
/// `ON DUPLICATE KEY UPDATE` order: assigned after `expires_at`, `terms`
/// would see the new expiry and not count it.
#[test]
fn terms_count_claims_only() {
    let t = Scratch::new("le_terms");
    let s = t.store();
    s.ensure_schema().unwrap();
    support::terms::counts_claims_only(&s, |name| t.terms(name));
}

/// A table made by an older version's DDL and never `ensure_schema`d:
/// acquire fails fatally with 1054, and the message gives the exact
/// `ALTER TABLE` (quoted name) that fixes it; running that statement as
/// printed does. Inspect and renew never touch `terms`.
#[test]
fn a_table_without_terms_names_the_alter() {
    let t = Scratch::new("le old `t`");
    t.create_old();
    let s = t.store();
    let e = s.acquire("e", "a", LONG, b"", T).expect_err("acquire on a table without terms");
    let text = e.to_string();
    assert!(e.is_fatal() && text.contains("server error 1054 ") && text.contains("Unknown column"), "{e:?}");
    let alter = text.split("needs: ").nth(1).and_then(|r| r.split("; or ").next()).unwrap_or_else(|| panic!("{text}"));
    let expected = format!(
        "ALTER TABLE {q} ADD COLUMN terms BIGINT NOT NULL DEFAULT 0 CHECK (terms >= 0); \
         ALTER TABLE {q} ADD COLUMN history VARBINARY(64) NULL AFTER terms",
        q = t.quoted()
    );
    assert_eq!(alter, expected, "{text}");
    assert!(s.inspect("e", T).unwrap_err().is_no_lease());
    exec(&mut admin(SHARED), alter);
    assert!(s.acquire("e", "a", LONG, b"", T).unwrap().held_by("a"));
    assert_eq!(t.terms("e"), 1);
}

/// `ensure_schema` gives an old table the column, keeping its rows (their
/// count starts at 0), and running it again changes nothing. Then six
/// replicas at once (a barrier) on a fresh old table, three times over:
/// all succeed (a racing `ALTER`'s duplicate column counts as done), the
/// table has one `terms` column, and each replica's acquire works.
#[test]
fn ensure_schema_adds_terms_to_an_old_table() {
    let t = Scratch::new("le_old");
    t.create_old();
    exec(
        &mut admin(SHARED),
        &format!(
            "INSERT INTO {} (name, holder, fence, acquired_at, renewed_at, expires_at, payload) \
             VALUES ('e', 'old', 5, 1, 1, 1, '')",
            t.quoted()
        ),
    );
    ensure_schema_on_an_old_row(&t.store(), MySqlStore::ensure_schema, || t.terms_columns(), |n| t.terms(n));

    for round in 0..3 {
        let t = Scratch::new("le_old_race");
        t.create_old();
        ensure_schema_then_claim_at_once(round, |_| t.store(), MySqlStore::ensure_schema);
        assert_eq!(t.terms_columns(), 1, "round {round}");
        assert_eq!(t.terms("e0"), 1, "round {round}");
    }
}

/// The column is looked up before any `ALTER`: on an up-to-date table
/// `ensure_schema` does not wait behind a transaction that read the table
/// (holding its shared metadata lock). On an old table it gives up at its
/// DDL timeout (retryable) and succeeds once the transaction ends.
#[test]
fn ensure_schema_on_a_current_table_does_not_wait_behind_a_transaction() {
    let (new, old) = (Scratch::new("le_new_lock"), Scratch::new("le_old_lock"));
    new.store().ensure_schema().unwrap();
    old.create_old();
    let mut holder = admin(SHARED);
    exec(&mut holder, "START TRANSACTION");
    exec(&mut holder, &format!("SELECT * FROM {}", new.quoted()));
    exec(&mut holder, &format!("SELECT * FROM {}", old.quoted()));
    let start = Instant::now();
    new.store().ensure_schema().expect("ensure_schema on an up-to-date table");
    assert!(start.elapsed() < Duration::from_millis(300), "waited {:?} behind the transaction", start.elapsed());
    let bound = Duration::from_millis(1500);
    let ddl = MySqlStore::builder(&url(SHARED)).table(old.table.clone()).ddl_timeout(bound).build().unwrap();
    let start = Instant::now();
    let e = ddl.ensure_schema().expect_err("the ALTER cannot get the metadata lock");
    let took = start.elapsed();
    eprintln!("ensure_schema behind a transaction: {took:?}: {e}");
    assert!(e.is_retryable(), "{e:?}");
    assert!(took < bound + Duration::from_millis(300), "took {took:?}");
    exec(&mut holder, "COMMIT");
    ddl.ensure_schema().expect("once the transaction ended");
    assert_eq!(old.terms_columns(), 1);
}

/// The claim means the same whatever order the server evaluates its
/// `ON DUPLICATE KEY UPDATE` assignments in: run bare (without the
/// settings a call pins), on sessions with MariaDB's default order and with
/// `SIMULTANEOUS_ASSIGNMENT` (every assignment reads the old row), each
/// case leaves the row as it must. The negative control: the claim as it
/// was (it relied on `holder` being assigned first and seen by the rest)
/// is right under the default order and, under simultaneous assignment,
/// takes over expired rows with the dead leader's fence and expiry.
#[test]
fn the_claim_means_the_same_under_every_assignment_order() {
    let t = Scratch::new("le_order");
    t.store().ensure_schema().unwrap();
    let session = |mode: &str| {
        let mut c = admin(SHARED);
        exec(&mut c, &format!("SET SESSION sql_mode = CONCAT(@@sql_mode, '{mode}')"));
        c
    };
    for mode in ["", ",SIMULTANEOUS_ASSIGNMENT"] {
        let wrong = run_claim_cases(&mut session(mode), &t.table, &current_claim);
        assert!(wrong.is_empty(), "sql_mode +'{mode}': {wrong:#?}");
        let wrong = run_claim_cases(&mut session(mode), &t.table, &current_batch_claim);
        assert!(wrong.is_empty(), "the batch's claim, sql_mode +'{mode}': {wrong:#?}");
    }
    let default_order = run_claim_cases(&mut session(""), &t.table, &old_claim);
    assert!(
        default_order.iter().all(|w| w.starts_with("valid, mine, written later")),
        "the old claim under the default order: {default_order:#?}"
    );
    let simultaneous = run_claim_cases(&mut session(",SIMULTANEOUS_ASSIGNMENT"), &t.table, &old_claim);
    assert!(
        simultaneous.iter().any(|w| w.starts_with("expired, another's")),
        "the negative control was not caught: {simultaneous:#?}"
    );
    eprintln!("the old claim under SIMULTANEOUS_ASSIGNMENT: {simultaneous:#?}");
}

/// A table made by hand whose `name` column compares without case (a
/// `VARCHAR` in a `_ci` collation): the row of election "Jobs" is the
/// duplicate key of a claim of "jobs". The claim must leave that other
/// election's row alone (it checks the name byte for byte before writing),
/// and report the mix-up as fatal.
#[test]
fn a_case_insensitive_table_never_lets_one_election_claim_another() {
    let t = Scratch::new("le_ci");
    exec(
        &mut admin(SHARED),
        &format!(
            "CREATE TABLE {} (name VARCHAR(255) COLLATE utf8mb4_general_ci NOT NULL, holder VARBINARY(255) NOT NULL, \
             fence BIGINT NOT NULL, acquired_at BIGINT NOT NULL, renewed_at BIGINT NOT NULL, \
             expires_at BIGINT NOT NULL, payload MEDIUMBLOB NOT NULL, terms BIGINT NOT NULL DEFAULT 0, \
             history VARBINARY(64) NULL, PRIMARY KEY (name)) ENGINE = InnoDB",
            t.quoted()
        ),
    );
    let s = t.store();
    let jobs = s.acquire("Jobs", "a", Duration::from_secs(1), b"", T).unwrap();
    assert!(jobs.held_by("a"));
    assert!(wait_for(Duration::from_secs(5), || s.inspect("Jobs", T).unwrap().expired()));
    let e = s.acquire("jobs", "b", LONG, b"", T).expect_err("a claim that met another election's row");
    assert!(e.is_fatal() && e.to_string().contains("another election"), "{e}");
    let row_before = s.inspect("Jobs", T).unwrap();
    let row = row_before.clone();
    assert_eq!((row.holder.as_str(), row.fence), ("a", jobs.fence), "the other election's row was written: {row:?}");
    // A batch's claim, renewal and release of "jobs" leave "Jobs" alone too.
    let item = [leaderelection::BatchItem { name: "jobs", fence: jobs.fence, payload: b"" }];
    let claimed = s.acquire_many("b", LONG, &item, T);
    let e = claimed[0].as_ref().expect_err("a batched claim that met another election's row");
    assert!(e.is_fatal() && e.to_string().contains("another election"), "{e}");
    let renewed = s.renew_many("a", LONG, &item, T);
    assert!(renewed[0].as_ref().is_err_and(|e| !e.is_retryable()), "{renewed:?}");
    assert!(s.release_many("a", &item, T)[0].is_ok());
    let after = s.inspect("Jobs", T).unwrap();
    assert_eq!(Lease { now: row_before.now, ..after.clone() }, row_before, "a batch wrote another election's row");
}

/// A TLS handshake that stalls (a path that passes the greeting and the
/// client's TLS request, then swallows everything) runs into the socket's
/// read timeout: that is a timeout, retryable, not a TLS failure that
/// needs a person.
#[test]
fn a_tls_handshake_that_stalls_is_a_retryable_timeout() {
    let ca = tls_ca();
    let proxy_port = tls_proxy(AtClientHello::Swallow);
    let url = format!("mysql://root@localhost:{proxy_port}/test?ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}");
    let s = MySqlStore::builder(&url).table(TABLE).socket_timeout(Duration::from_millis(400)).build().unwrap();
    let start = Instant::now();
    let e = s.inspect("e", Duration::from_secs(3)).unwrap_err();
    eprintln!("TLS handshake stalled: after {:?}: {e}", start.elapsed());
    assert!(e.is_retryable(), "{e}");
    assert!(e.to_string().contains("TLS handshake got no answer within the socket timeout"), "{e}");
}

/// `completion_type = RELEASE` (a server or session setting) ends the
/// session at every plain `COMMIT`: every call's write committed and then
/// its connection dropped, so every acquire looked failed and nobody ever
/// led. The store commits with `COMMIT AND NO CHAIN NO RELEASE`, so calls
/// succeed and the connection is kept.
#[test]
fn completion_type_release_does_not_end_the_session_at_each_commit() {
    store();
    let mut c = admin(SHARED);
    let url = own_user_url(&mut c, "le_release", TABLE);
    let s = one_session(init_opts(&url, "SET SESSION completion_type = 'RELEASE'"));
    let mut sessions = || -> Vec<u64> { sessions_of(&mut c, "le_release") };
    let name = format!("release-mode-{}", random_tag());
    let a = s.acquire(&name, "a", LONG, b"", T).expect("acquire under completion_type=RELEASE");
    assert!(a.held_by("a"), "{a:?}");
    let first = sessions();
    assert!(s.renew(&name, "a", a.fence, LONG, b"", T).unwrap().held_by("a"));
    s.release(&name, "a", a.fence, T).unwrap();
    assert!(s.inspect(&name, T).unwrap().expired());
    assert!(first.len() == 1 && sessions() == first, "the session did not survive the commits: {first:?}");
}

/// The race of a renewal and its holder's release (issue 16, item 8): the
/// renewal reads its clock, then waits for the row behind another
/// session's lock; meanwhile a release that read its clock later takes the
/// row first and commits. The renewal then found `expires_at > now` still
/// true and set a new expiry: a released lease held for a whole TTL more.
/// The release is played by the session holding the row lock, stamping the
/// row as the store's release does, with its own (later) clock reading.
/// The renewal must change nothing.
#[test]
fn a_renewal_that_read_its_clock_before_a_release_cannot_extend_it() {
    store();
    // Sockets that outlast the long call below, so the renewal keeps
    // waiting until the watcher has seen it.
    let s = MySqlStore::builder(&url(SHARED)).table(TABLE).socket_timeout(LONG + T).build().unwrap();
    let name = format!("renew-release-{}", random_tag());
    let ttl = Duration::from_secs(15);
    let lease = s.acquire(&name, "a", ttl, b"", T).unwrap();
    let mut locker = lock_row(&name);
    let renewed = std::thread::scope(|sc| {
        // A long timeout (the server's lock-wait bound is 3/4 of it), so the
        // renewal is still waiting whenever a loaded machine lets the
        // watcher look.
        let renewal = sc.spawn(|| s.renew(&name, "a", lease.fence, ttl, b"late", LONG));
        // Some transaction waits for the locker's: only the renewal can
        // (the row is this test's own). Asked of the lock tables; and, as
        // MariaDB 10.11 at times lists neither the wait nor the waiting
        // transaction there for as long as it waits (seen in about one run
        // in five here, the renewal's `UPDATE` of this row shown in the
        // process list as "Updating" all along), of the process list too:
        // a session other than these two running an `UPDATE` of this row
        // has read its clock already and is held by the locker's lock.
        let mut watcher = admin(SHARED);
        let q = format!(
            "SELECT COUNT(*) FROM information_schema.INNODB_LOCK_WAITS w \
             JOIN information_schema.INNODB_TRX t ON t.trx_id = w.blocking_trx_id \
             WHERE t.trx_mysql_thread_id = {}",
            locker.connection_id()
        );
        let running = format!(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID NOT IN ({}, {}) \
             AND STATE = 'Updating' AND INFO LIKE 'UPDATE %' AND INSTR(INFO, \"{}\") > 0",
            locker.connection_id(),
            watcher.connection_id(),
            hex(name.as_bytes())
        );
        let waiting = wait_for(Duration::from_secs(20), || {
            watcher.query_first::<i64, _>(&q).unwrap() >= Some(1)
                || watcher.query_first::<i64, _>(&running).unwrap() >= Some(1)
                || renewal.is_finished()
        });
        if !waiting || renewal.is_finished() {
            let sessions: Vec<(u64, Option<String>, Option<String>)> =
                watcher.query("SELECT ID, STATE, LEFT(INFO, 120) FROM information_schema.PROCESSLIST").unwrap();
            exec(&mut locker, "ROLLBACK");
            panic!("the renewal never waited on the row lock: {:?}; sessions {sessions:?}", renewal.join().unwrap());
        }
        exec(
            &mut locker,
            &format!(
                "UPDATE {TABLE} SET renewed_at = GREATEST(renewed_at, {NOW_SQL}), expires_at = {NOW_SQL} WHERE name = {}",
                hex(name.as_bytes())
            ),
        );
        exec(&mut locker, "COMMIT");
        renewal.join().unwrap()
    });
    a_late_renewal_extended_nothing("", &s, &lease, ttl, &renewed);
}

/// The failover rule (issue 18) at the SQL level: a row stamped with
/// another server's history (a `server_id` no server here has, as a
/// replica promoted by a failover inherits its rows) is never claimed as it
/// stands; its holder may renew it; once expired, the first claim holds it
/// for nobody for a lease; its release changes nothing.
#[test]
fn rows_inherited_across_a_failover_are_never_claimed_as_they_stand() {
    let s = store();
    let tag = random_tag();
    let admin = std::cell::RefCell::new(admin(SHARED));
    let sql = |q: String| exec(&mut admin.borrow_mut(), &q);
    support::inherited::rows_inherited_across_a_failover_are_never_claimed_as_they_stand(
        &s,
        |case| format!("inherited-{case}-{tag}"),
        |n| sql(format!("UPDATE {TABLE} SET history = 'no-such-server' WHERE name = {}", hex(n.as_bytes()))),
        |n| sql(format!("UPDATE {TABLE} SET expires_at = {NOW_SQL} - 1000000 WHERE name = {}", hex(n.as_bytes()))),
    );
    // Every write stamps the row with the server's server_id.
    let name = format!("inherited-stamp-{tag}");
    s.acquire(&name, "a", Duration::from_secs(30), b"", T).unwrap();
    let q = format!("SELECT history = CAST(@@server_id AS BINARY) FROM {TABLE} WHERE name = {}", hex(name.as_bytes()));
    let same: Option<i64> = admin.borrow_mut().query_first(q).unwrap();
    assert_eq!(same, Some(1), "the row was not stamped with this server's server_id");
}

/// A small deterministic shuffle, seeded from the system: each
/// participant's order of the batch's items.
fn shuffled<T>(mut v: Vec<T>) -> Vec<T> {
    let mut seed = [0u8; 8];
    getrandom::fill(&mut seed).unwrap();
    let mut x = u64::from_le_bytes(seed) | 1;
    for k in (1..v.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.swap(k, (x % (k as u64 + 1)) as usize);
    }
    v
}

/// Batches that share rows take their locks in one order, so they never
/// deadlock (issue 20): four participants at once claim overlapping
/// halves of a set of elections, each in an order of its own, on a table
/// of their own: first claims of names no row has yet, with no other row
/// in the table (no neighbours to lock), then the same names once expired
/// (made so by hand), then expired and new names interleaved. Every item is answered (no
/// batch fails), each election has at most one winner, and the server's
/// deadlock count does not move (the store would retry a batch the server
/// rolled back, so a deadlock would not show as a failure). On the private
/// server, which no other test here writes to concurrently.
#[test]
fn concurrent_batched_claims_never_deadlock() {
    let table = format!("le_batch_locks_{}", random_tag());
    let s = MySqlStore::builder(&url(PRIVATE)).table(table.clone()).pool_size(8).build().unwrap();
    s.ensure_schema().unwrap();
    let deadlocks = || -> u64 {
        let row: Option<(String, u64)> =
            admin(PRIVATE).query_first("SHOW GLOBAL STATUS LIKE 'Innodb_deadlocks'").unwrap();
        row.expect("Innodb_deadlocks").1
    };
    let before = deadlocks();
    for round in 0..4 {
        let base = format!("{round}-{}", random_tag());
        let old: Vec<String> = (0..200).map(|k| format!("{base}/{k:03}")).collect();
        let new: Vec<String> = (0..200).map(|k| format!("{base}/{k:03}+")).collect();
        let rounds: [(&str, Vec<&String>); 3] = [
            ("first claims", old.iter().collect()),
            ("expired", old.iter().collect()),
            ("mixed", old.iter().chain(&new).collect()),
        ];
        for (what, names) in rounds {
            let refs: Vec<&str> = names.iter().map(|n| n.as_str()).collect();
            if what != "first claims" {
                // Every row of the round expired, by an operator's hand.
                exec(
                    &mut admin(PRIVATE),
                    &format!(
                        "UPDATE `{table}` SET expires_at = {NOW_SQL} - 1000000 WHERE name LIKE {}",
                        hex(format!("{base}/%").as_bytes())
                    ),
                );
            }
            let results = at_once(
                4,
                |p| {
                    let mine: Vec<&str> = shuffled(refs.clone()).into_iter().take(refs.len() / 2 + 10).collect();
                    (format!("p{p}"), mine)
                },
                |(id, mine), _| {
                    let out = s.acquire_many(&id, LONG, &claims(&mine), T);
                    (id, mine.iter().map(|n| n.to_string()).zip(out).collect::<Vec<_>>())
                },
            );
            let mut winners: std::collections::HashMap<String, Vec<String>> = std::collections::HashMap::new();
            for (id, answers) in &results {
                for (n, r) in answers {
                    let l = r.as_ref().unwrap_or_else(|e| panic!("{what}: {id}: {n}: {e}"));
                    if l.held_by(id) {
                        winners.entry(n.clone()).or_default().push(id.clone());
                    }
                }
            }
            assert!(winners.values().all(|w| w.len() == 1), "{what}: two winners: {winners:?}");
            eprintln!("{what}: {} elections claimed by 4 batches at once", winners.len());
        }
    }
    let after = deadlocks();
    exec(&mut admin(PRIVATE), &format!("DROP TABLE `{table}`, `{table}_slots`, `{table}_members`, `{table}_terms`"));
    assert_eq!(after - before, 0, "the batches deadlocked {} times", after - before);
}

/// The latency of the batched calls at a group's scale (issue 20): 10,000
/// elections, every third held by each of three members; `renew_many` of
/// one member's 3,334 terms, `inspect_many` of the other 6,667 elections,
/// `acquire_many` of 3,334 expired elections (made expired by hand before
/// each round), 30 rounds each, on the shared MariaDB. Prints p50 and p99;
/// asserts nothing about time. `cargo test --features mysql,storetest
/// --test storetest_mysql -- --ignored --nocapture batch_latencies`.
#[test]
#[ignore]
fn batch_latencies() {
    use leaderelection::BatchItem;
    const ELECTIONS: usize = 10_000;
    const ROUNDS: usize = 30;
    let table = format!("le_batch_bench_{}", random_tag());
    let s = MySqlStore::builder(&url(SHARED)).table(table.clone()).build().unwrap();
    s.ensure_schema().unwrap();
    let names: Vec<String> = (0..ELECTIONS).map(|k| format!("group/election-{k:05}")).collect();
    let ids = ["member-0#0123456789abcdef", "member-1#0123456789abcdef", "member-2#0123456789abcdef"];
    let payloads: Vec<String> = ids.iter().map(|id| format!("http://{id}.internal:8080")).collect();
    let ttl = Duration::from_secs(30);
    let t = Duration::from_secs(10);
    let mut fences: Vec<u64> = vec![0; ELECTIONS];
    for (m, id) in ids.iter().enumerate() {
        let mine: Vec<usize> = (m..ELECTIONS).step_by(3).collect();
        let items: Vec<BatchItem<'_>> =
            mine.iter().map(|&k| BatchItem { name: &names[k], fence: 0, payload: payloads[m].as_bytes() }).collect();
        for (&k, r) in mine.iter().zip(s.acquire_many(id, ttl, &items, t)) {
            let l = r.unwrap_or_else(|e| panic!("setup claim of {}: {e}", names[k]));
            assert!(l.held_by(id));
            fences[k] = l.fence;
        }
    }
    // CPU time the server and this process spent, from /proc (Linux), to
    // tell the calls' own cost from waiting for a busy machine.
    let server_pid: String = admin(SHARED)
        .query_first::<String, _>("SELECT @@pid_file")
        .unwrap()
        .and_then(|f| std::fs::read_to_string(f).ok())
        .map(|p| p.trim().to_owned())
        .unwrap_or_default();
    let cpu = |pid: &str| -> Duration {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
        let ticks: u64 = [11, 12].iter().filter_map(|&k| fields.get(k).and_then(|f| f.parse::<u64>().ok())).sum();
        Duration::from_millis(ticks * 10)
    };
    let both = || (cpu(&server_pid), cpu("self"));
    let per_call = |before: (Duration, Duration), after: (Duration, Duration), n: usize| {
        format!(
            "CPU per call: server {:?}, this process {:?}",
            (after.0 - before.0) / n as u32,
            (after.1 - before.1) / n as u32
        )
    };
    let pct = |mut v: Vec<Duration>| {
        v.sort();
        let at = |p: f64| v[((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1];
        format!("p50 {:?}, p99 {:?}, max {:?}", at(0.50), at(0.99), v[v.len() - 1])
    };
    let mine: Vec<usize> = (0..ELECTIONS).step_by(3).collect();
    let renew: Vec<BatchItem<'_>> = mine
        .iter()
        .map(|&k| BatchItem { name: &names[k], fence: fences[k], payload: payloads[0].as_bytes() })
        .collect();
    let mut took = Vec::new();
    let before = both();
    for _ in 0..ROUNDS {
        let start = Instant::now();
        let out = s.renew_many(ids[0], ttl, &renew, t);
        took.push(start.elapsed());
        assert!(out.iter().all(Result::is_ok), "{:?}", out.iter().find(|r| r.is_err()));
    }
    eprintln!("renew_many, {} items: {}; {}", renew.len(), pct(took), per_call(before, both(), ROUNDS));
    // The same work in quarters (a group may spread its renewals over the
    // renew interval): each call's latency.
    let mut took = Vec::new();
    let before = both();
    for _ in 0..ROUNDS {
        for quarter in renew.chunks(renew.len().div_ceil(4)) {
            let start = Instant::now();
            let out = s.renew_many(ids[0], ttl, quarter, t);
            took.push(start.elapsed());
            assert!(out.iter().all(Result::is_ok));
        }
    }
    eprintln!("renew_many, {} items: {}; {}", renew.len().div_ceil(4), pct(took), per_call(before, both(), 4 * ROUNDS));
    let others: Vec<&str> = (0..ELECTIONS).filter(|k| k % 3 != 0).map(|k| names[k].as_str()).collect();
    let mut took = Vec::new();
    let before = both();
    for _ in 0..ROUNDS {
        let start = Instant::now();
        let out = s.inspect_many(&others, t);
        took.push(start.elapsed());
        assert!(out.iter().all(Result::is_ok));
    }
    eprintln!("inspect_many, {} names: {}; {}", others.len(), pct(took), per_call(before, both(), ROUNDS));
    let theirs: Vec<usize> = (1..ELECTIONS).step_by(3).collect();
    let list: String = theirs.iter().map(|&k| hex(names[k].as_bytes())).collect::<Vec<_>>().join(", ");
    let mut took = Vec::new();
    let mut admin = admin(SHARED);
    let mut claim_cpu = (Duration::ZERO, Duration::ZERO);
    for round in 0..ROUNDS {
        exec(&mut admin, &format!("UPDATE `{table}` SET expires_at = {NOW_SQL} - 1000000 WHERE name IN ({list})"));
        let id = format!("claimer-{round}#0123456789abcdef");
        let items: Vec<BatchItem<'_>> =
            theirs.iter().map(|&k| BatchItem { name: &names[k], fence: 0, payload: payloads[1].as_bytes() }).collect();
        let before = both();
        let start = Instant::now();
        let out = s.acquire_many(&id, ttl, &items, t);
        took.push(start.elapsed());
        let after = both();
        claim_cpu.0 += after.0 - before.0;
        claim_cpu.1 += after.1 - before.1;
        for r in &out {
            assert!(r.as_ref().is_ok_and(|l| l.held_by(&id)), "{r:?}");
        }
    }
    eprintln!(
        "acquire_many, {} expired items: {}; CPU per call: server {:?}, this process {:?}",
        theirs.len(),
        pct(took),
        claim_cpu.0 / ROUNDS as u32,
        claim_cpu.1 / ROUNDS as u32
    );

    // Three members at once, as three processes of a group would run:
    // each with a store (a pool) of its own, every `tick` a heartbeat,
    // the renewal of its 3,334 terms and the reading of the other 6,666
    // elections, starting a third of a tick apart.
    let tick = Duration::from_millis(1000);
    for (m, id) in ids.iter().enumerate() {
        let mine: Vec<usize> = (m..ELECTIONS).step_by(3).collect();
        let list: String = mine.iter().map(|&k| hex(names[k].as_bytes())).collect::<Vec<_>>().join(", ");
        exec(&mut admin, &format!("UPDATE `{table}` SET expires_at = {NOW_SQL} - 1000000 WHERE name IN ({list})"));
        let items: Vec<BatchItem<'_>> =
            mine.iter().map(|&k| BatchItem { name: &names[k], fence: 0, payload: payloads[m].as_bytes() }).collect();
        for (&k, r) in mine.iter().zip(s.acquire_many(id, ttl, &items, t)) {
            fences[k] = r.unwrap_or_else(|e| panic!("claim of {}: {e}", names[k])).fence;
        }
    }
    let calls: Vec<(&str, Duration)> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..3)
            .map(|m| {
                let (names, fences, payloads, table) = (&names, &fences, &payloads, &table);
                sc.spawn(move || {
                    let s = MySqlStore::builder(&url(SHARED)).table(table.clone()).build().unwrap();
                    let mine: Vec<BatchItem<'_>> = (m..ELECTIONS)
                        .step_by(3)
                        .map(|k| BatchItem { name: &names[k], fence: fences[k], payload: payloads[m].as_bytes() })
                        .collect();
                    let others: Vec<&str> = (0..ELECTIONS).filter(|k| k % 3 != m).map(|k| names[k].as_str()).collect();
                    std::thread::sleep(tick * m as u32 / 3);
                    let mut out = Vec::new();
                    let start = Instant::now();
                    for round in 0..ROUNDS as u32 {
                        let at = Instant::now();
                        s.heartbeat("bench", ids[m], 0, ttl, t).unwrap();
                        out.push(("heartbeat", at.elapsed()));
                        let at = Instant::now();
                        let r = s.renew_many(ids[m], ttl, &mine, t);
                        out.push(("renew_many", at.elapsed()));
                        assert!(r.iter().all(Result::is_ok), "{:?}", r.iter().find(|r| r.is_err()));
                        let at = Instant::now();
                        let r = s.inspect_many(&others, t);
                        out.push(("inspect_many", at.elapsed()));
                        assert!(r.iter().all(Result::is_ok));
                        if let Some(wait) = (start + tick * (round + 1)).checked_duration_since(Instant::now()) {
                            std::thread::sleep(wait);
                        }
                    }
                    out
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    for what in ["heartbeat", "renew_many", "inspect_many"] {
        let v: Vec<Duration> = calls.iter().filter(|c| c.0 == what).map(|c| c.1).collect();
        eprintln!("3 members at once, every {tick:?}: {what}: {}", pct(v));
    }
    eprintln!("3 members at once: every store call: {}", pct(calls.iter().map(|c| c.1).collect()));
    if std::env::var_os("LE_BENCH_KEEP").is_none() {
        exec(&mut admin, &format!("DROP TABLE `{table}`, `{table}_slots`, `{table}_members`, `{table}_terms`"));
    }
}

/// Group members (issue 20): a table made before groups existed has no
/// members table; a heartbeat then fails fatally, saying to run
/// `ensure_schema`, which makes it. A member whose heartbeat expired more
/// than an hour ago is deleted by the next heartbeat of its group (and was
/// never counted); one expired less long stays.
#[test]
fn members_need_their_table_and_long_gone_members_are_forgotten() {
    let t = Scratch::new("le_members");
    let s = t.store();
    exec(&mut admin(SHARED), MySqlStore::schema(&t.table).unwrap().split(";\n").next().unwrap());
    for e in [s.heartbeat("g", "a", 0, LONG, T).unwrap_err(), s.leave_group("g", "a", T).unwrap_err()] {
        assert!(e.is_fatal() && e.to_string().contains("ensure_schema"), "{e}");
        assert!(e.to_string().contains(&format!("{}_members", t.table)), "{e}");
    }
    s.ensure_schema().unwrap();
    assert_eq!(s.heartbeat("g", "a", 0, LONG, T).unwrap().live, 1);
    let members = format!("`{}_members`", t.table);
    exec(
        &mut admin(SHARED),
        &format!(
            "INSERT INTO {members} (group_name, member, expires_at) VALUES \
             ('g', 'gone', {NOW_SQL} - 7200000000), ('g', 'recent', {NOW_SQL} - 60000000), \
             ('other', 'gone', {NOW_SQL} - 7200000000)"
        ),
    );
    assert_eq!(s.heartbeat("g", "a", 0, LONG, T).unwrap().live, 1, "expired members are not counted");
    let left: Vec<String> =
        admin(SHARED).query(format!("SELECT CONCAT(group_name, '/', member) FROM {members} ORDER BY 1")).unwrap();
    assert_eq!(left, ["g/a", "g/recent", "other/gone"], "only the group's members gone for over an hour go");
}

/// A members table made before members reported what they lead lacks the
/// `leads` column: a heartbeat fails fatally, naming the statement that
/// adds it, and `ensure_schema` adds it; the reports then add up.
#[test]
fn a_members_table_without_leads_is_fatal_until_ensure_schema_adds_it() {
    let t = Scratch::new("le_members_leads");
    let s = t.store();
    s.ensure_schema().unwrap();
    exec(&mut admin(SHARED), &format!("ALTER TABLE `{}_members` DROP COLUMN leads", t.table));
    let e = s.heartbeat("g", "a", 4, LONG, T).unwrap_err();
    assert!(e.is_fatal() && e.to_string().contains("ADD COLUMN leads") && e.to_string().contains("1054"), "{e}");
    heartbeats_count_leads_once_the_schema_is_ensured(&s, MySqlStore::ensure_schema, ["a", "b"]);
}

/// A batched claim does not wait for a row that a transaction of a
/// program's own holds locked for long (`SELECT … FOR UPDATE` left open):
/// its look waits a second at most for the rows it must lock, then leaves
/// out what it could not get (the locked election, and the one before it,
/// whose claim's index entry would go next to the locked row's) and
/// claims the rest; a look that waited the call's own bound would fail the
/// whole batch with a lock wait timeout. After the lock goes, they are
/// claimed too.
#[test]
fn a_batched_claim_does_not_wait_for_a_row_locked_for_long() {
    let s = store();
    let base = format!("locked-{}", random_tag());
    let names: Vec<String> = (0..5).map(|k| format!("{base}/{k}")).collect();
    for n in &names {
        s.acquire(n, "x", Duration::from_millis(200), b"", T).unwrap();
    }
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    assert!(wait_for(Duration::from_secs(10), || s
        .inspect_many(&refs, T)
        .iter()
        .all(|r| r.as_ref().is_ok_and(|l| l.expired()))));
    let mut locker = lock_row(&names[2]);
    let items: Vec<leaderelection::BatchItem<'_>> =
        refs.iter().map(|n| leaderelection::BatchItem { name: n, fence: 0, payload: b"" }).collect();
    let start = Instant::now();
    let out = s.acquire_many("b", LONG, &items, Duration::from_secs(6));
    let took = start.elapsed();
    eprintln!("acquire_many beside a row locked for long: {took:?}: {out:?}");
    for (k, r) in out.iter().enumerate() {
        if k == 1 || k == 2 {
            let e = r.as_ref().expect_err("held off");
            assert!(e.is_retryable() && e.to_string().contains("locked"), "{}: {e}", names[k]);
        } else {
            assert!(r.as_ref().is_ok_and(|l| l.held_by("b")), "{}: {r:?}", names[k]);
        }
    }
    assert!(took < Duration::from_secs(4), "the batch waited {took:?}");
    exec(&mut locker, "COMMIT");
    for r in s.acquire_many("b", LONG, &items[1..3], T) {
        assert!(r.as_ref().is_ok_and(|l| l.held_by("b")), "{r:?}");
    }
}

/// A batch locks only the rows it names: while a transaction of a
/// program's own holds another election's row locked, batches of one item
/// and of two (renewals with one payload and with a payload each, reads,
/// releases, claims) answer at once. With a single `(name, fence)` pair,
/// MariaDB plans `WHERE (name, fence) IN (…)` as a scan of the whole
/// primary key (seen with `EXPLAIN`), and such an `UPDATE` locked every
/// row of the table, waiting here until its lock wait ran out.
#[test]
fn a_batch_locks_only_the_rows_it_names() {
    use leaderelection::BatchItem;
    // A table of its own: the suite's other tests hold rows of the shared
    // one locked, and a new row's insert waits for a lock on the row after
    // it, whichever test holds that.
    const OWN: &str = "le_storetest_only_rows";
    let s = mysql_support::store_on(SHARED, OWN);
    let tag = random_tag();
    let other = format!("0000-only-{tag}");
    s.acquire(&other, "x", LONG, b"", T).unwrap();
    // The locker's read also locks the gap after `other`, up to the next
    // row: this one, so the names below never fall into it, even in a
    // table just created.
    s.acquire(&format!("0001-only-{tag}"), "x", LONG, b"", T).unwrap();
    let names = [format!("only-{tag}/a"), format!("only-{tag}/b")];
    let mut locker = lock_row_in(OWN, &other);
    let t = Duration::from_secs(3);
    for n in [1, 2] {
        let items: Vec<BatchItem<'_>> =
            names[..n].iter().map(|m| BatchItem { name: m, fence: 0, payload: b"p" }).collect();
        let start = Instant::now();
        let claimed = s.acquire_many("a", LONG, &items, t);
        let fences: Vec<u64> =
            claimed.iter().map(|r| r.as_ref().unwrap_or_else(|e| panic!("{n}: acquire_many: {e}")).fence).collect();
        let renew: Vec<BatchItem<'_>> =
            items.iter().zip(&fences).map(|(it, f)| BatchItem { fence: *f, ..*it }).collect();
        for r in s.renew_many("a", LONG, &renew, t) {
            r.unwrap_or_else(|e| panic!("{n}: renew_many: {e}"));
        }
        let each: Vec<BatchItem<'_>> =
            renew.iter().zip([&b"x"[..], b"y"]).map(|(it, p)| BatchItem { payload: p, ..*it }).collect();
        for r in s.renew_many("a", LONG, &each, t) {
            r.unwrap_or_else(|e| panic!("{n}: renew_many, a payload each: {e}"));
        }
        let refs: Vec<&str> = names[..n].iter().map(String::as_str).collect();
        assert!(s.inspect_many(&refs, t).iter().all(|r| r.as_ref().is_ok_and(|l| l.held_by("a"))));
        for r in s.release_many("a", &renew, t) {
            r.unwrap_or_else(|e| panic!("{n}: release_many: {e}"));
        }
        assert!(s.inspect_many(&refs, t).iter().all(|r| r.as_ref().is_ok_and(|l| l.expired())), "{n}: not released");
        assert!(start.elapsed() < Duration::from_secs(2), "{n}: the batches waited {:?}", start.elapsed());
    }
    exec(&mut locker, "COMMIT");
}

/// Claims of one new name racing on the server are never failed by the
/// server's deadlock detection: the `SELECT … FOR UPDATE` of a name no row
/// has yet takes a gap lock, the racers' inserts then wait on each other,
/// and all but one are rolled back. The store tries such a victim again
/// while the call's time lasts, however many times it loses; before it did,
/// a store with one connection gave up after a second deadlock (the
/// acceptance suite's eight-way race failed on CI that way). Twelve stores
/// of one connection race for 15 new names; every call must answer, and
/// exactly one must win each name.
#[test]
fn racing_claims_of_a_new_name_survive_deadlocks() {
    const N: usize = 12;
    let stores: Vec<MySqlStore> =
        (0..N).map(|_| MySqlStore::builder(&url(SHARED)).table(TABLE).pool_size(1).build().expect("store")).collect();
    store();
    let mut failed = Vec::new();
    for round in 0..15 {
        let name = format!("deadlock-race/{}/{round}", random_tag());
        let results =
            at_once(N, |i| (&stores[i], format!("racer{i}")), |(s, id), _| (s.acquire(&name, &id, LONG, b"", T), id));
        let mut winners = 0;
        for (r, id) in results {
            match r {
                Ok(l) if l.held_by(&id) => winners += 1,
                Ok(_) => {}
                Err(e) => failed.push(format!("round {round}, {id}: {e}")),
            }
        }
        assert!(failed.is_empty(), "claims failed: {failed:?}");
        assert_eq!(winners, 1, "round {round}: {winners} winners");
    }
}

/// A batched renewal on MariaDB reads back each chunk's rows by scanning
/// the primary key from its first name to its last, bounded per item, and
/// looks up by name the chunks whose scan did not find every row the
/// renewal wrote. Both ways answer every item with the row as written:
/// 600 terms (two chunks) each next to another holder's election, read by
/// the scan; two terms with 300 other elections between them, past the
/// scan's bound, looked up; and a term lost among them answered LeaseLost.
#[test]
fn batched_renewals_read_back_by_scan_and_by_name() {
    let t = Scratch::new("le_renew_scan");
    let s = t.store();
    s.ensure_schema().unwrap();
    fn item(name: &str, fence: u64) -> leaderelection::BatchItem<'_> {
        leaderelection::BatchItem { name, fence, payload: b"r" }
    }
    let claim = |who: &str, names: &[String]| -> Vec<Lease> {
        let items: Vec<_> = names.iter().map(|n| item(n, 0)).collect();
        let out = s.acquire_many(who, LONG, &items, T);
        out.into_iter().map(|r| r.unwrap_or_else(|e| panic!("acquire_many: {e}"))).collect()
    };
    let check = |names: &[String], leases: &[Lease], lost: &[usize]| {
        let items: Vec<_> = names.iter().zip(leases).map(|(n, l)| item(n, l.fence)).collect();
        let out = s.renew_many("a", LONG, &items, T);
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let back = s.inspect_many(&refs, T);
        for (k, (r, b)) in out.iter().zip(&back).enumerate() {
            if lost.contains(&k) {
                assert!(r.as_ref().is_err_and(StoreError::is_lease_lost), "item {k} must be lost: {r:?}");
                continue;
            }
            let l = r.as_ref().unwrap_or_else(|e| panic!("renew_many item {k} ({}): {e}", names[k]));
            let b = b.as_ref().unwrap();
            assert!(l.held_by("a") && l.fence == leases[k].fence && l.payload == b"r", "item {k}: {l:?}");
            assert_eq!(l.acquired_at, leases[k].acquired_at, "item {k}'s term start");
            assert_eq!(
                (l.renewed_at, l.expires_at, &l.name, &l.holder),
                (b.renewed_at, b.expires_at, &b.name, &b.holder),
                "item {k}: the answer is not the row written"
            );
        }
    };
    // Dense: every other row is another holder's.
    let mine: Vec<String> = (0..600).map(|i| format!("d{i:04}a")).collect();
    let theirs: Vec<String> = (0..600).map(|i| format!("d{i:04}b")).collect();
    let held = claim("a", &mine);
    claim("b", &theirs);
    check(&mine, &held, &[]);
    // Sparse: 300 rows between two terms, and a lost term among them.
    let between: Vec<String> = (0..300).map(|i| format!("s{i:04}")).collect();
    claim("b", &between);
    let ends = ["s".to_owned(), "s9999".to_owned(), "s0150x".to_owned()];
    let mut held = claim("a", &ends);
    held[2].fence += 1; // a fence that is not the term's: lost
    check(&ends, &held, &[2]);
}

/// A renewal of 2,000 items or more runs as two halves at once, each a
/// transaction on a connection of its own, and still answers every item
/// from its own row: 2,601 items of 2,600 terms, an election named twice
/// where the halves meet (both in the second half), and a lost term (a
/// fence that is not the term's) in each half.
#[test]
fn a_large_renewal_runs_in_two_halves_and_answers_every_item() {
    use leaderelection::BatchItem;
    let t = Scratch::new("le_renew_halves");
    let s = t.store();
    s.ensure_schema().unwrap();
    let names: Vec<String> = (0..2_600).map(|i| format!("h{i:05}")).collect();
    let claims: Vec<BatchItem<'_>> = names.iter().map(|n| BatchItem { name: n, fence: 0, payload: b"p" }).collect();
    let held: Vec<Lease> =
        s.acquire_many("a", LONG, &claims, T).into_iter().map(|r| r.expect("acquire_many")).collect();
    let mut items: Vec<BatchItem<'_>> =
        names.iter().zip(&held).map(|(n, l)| BatchItem { name: n, fence: l.fence, payload: b"q" }).collect();
    items.insert(1_300, items[1_299]);
    items[10].fence += 1;
    items[2_501].fence += 1;
    let lost = [10, 2_501];
    let out = s.renew_many("a", LONG, &items, T);
    assert_eq!(out.len(), items.len());
    for (k, (it, r)) in items.iter().zip(&out).enumerate() {
        if lost.contains(&k) {
            assert!(r.as_ref().is_err_and(StoreError::is_lease_lost), "item {k} must be lost: {r:?}");
            continue;
        }
        let l = r.as_ref().unwrap_or_else(|e| panic!("item {k} ({}): {e}", it.name));
        let row = s.inspect(it.name, T).unwrap();
        assert!(l.held_by("a") && l.name == it.name && l.fence == it.fence && l.payload == b"q", "item {k}: {l:?}");
        assert_eq!((l.renewed_at, l.expires_at), (row.renewed_at, row.expires_at), "item {k}: not the row written");
    }
    // The lost terms' rows were left as they were.
    for k in [10, 2_500] {
        let row = s.inspect(&names[k], T).unwrap();
        assert_eq!((row.renewed_at, &row.payload[..]), (held[k].renewed_at, &b"p"[..]), "{}", names[k]);
    }
}

/// Another session holds one term's row (`SELECT … FOR UPDATE` left open,
/// issue 33): a renew batch renews every other term and answers the
/// locked one alone with a retryable error after the server's one-second
/// lock wait, well inside its timeout, and a release batch the same. Before,
/// the batch waited on the lock and every term of it failed at the timeout.
#[test]
fn a_renew_or_release_batch_does_not_wait_for_a_writer() {
    let s = store();
    let (names, _, fences) = four_held_by_a(&s, "writer-renew");
    let mut locker = lock_row(&names[2]);
    let unlock = || exec(&mut locker, "ROLLBACK");
    batches_skip_a_row_another_writer_locked("", &s, &names, &fences, Duration::from_secs(4), unlock);
}

/// `after_restore`, the one step after restoring the database from a backup
/// of itself (issue 34, item 6), on a table of its own.
#[test]
fn after_restore_marks_every_row_inherited() {
    let table = format!("le_restore_{}", random_tag());
    let s = MySqlStore::builder(&url(SHARED)).table(&table).build().unwrap();
    s.ensure_schema().unwrap();
    let expire = |n: &str| {
        exec(
            &mut admin(SHARED),
            &format!("UPDATE `{table}` SET expires_at = {NOW_SQL} - 1000000 WHERE name = {}", hex(n.as_bytes())),
        )
    };
    support::inherited::a_restore_marks_every_row_inherited(&s, || s.after_restore().unwrap(), expire);
    exec(&mut admin(SHARED), &format!("DROP TABLE `{table}`, `{table}_slots`, `{table}_members`, `{table}_terms`"));
}
