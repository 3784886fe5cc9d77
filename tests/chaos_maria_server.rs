//! The chaos suite's own MariaDB servers (`tests/support/maria_server.rs`)
//! do what their faults promise, seen through the real `MySqlStore`; and
//! the store on servers started with settings the shared one lacks (every
//! hostile mode at once, a small `max_allowed_packet`).
//!
//! Needs MariaDB installed (`bash scripts/test.sh` installs it) and root, to
//! run `mariadbd --user=mysql`; it touches no shared server.

mod mysql_support;
mod support;

use std::fs;
use std::net::TcpListener;
use std::path::Path;
use std::time::{Duration, Instant};

use leaderelection::mysql::MySqlStore;
use leaderelection::{BatchItem, ErrorKind, Lease, Store, StoreError};
use mysql::prelude::Queryable;
use mysql_support::claims::{current_batch_claim, current_claim, old_claim, run_claim_cases};
use mysql_support::exec;
use support::maria_server::MariaServer;
use support::wait_for;

const TABLE: &str = "leader_election";
const TTL: Duration = Duration::from_secs(30);
/// The timeout of the calls that must fail, and the bound on how long they take.
const SHORT: Duration = Duration::from_millis(500);
const FAILS_WITHIN: Duration = Duration::from_millis(1100);
/// The timeout of the calls that must work.
const LONG: Duration = Duration::from_secs(5);

fn store(server: &MariaServer) -> MySqlStore {
    let store = MySqlStore::builder(&server.url()).socket_timeout(Duration::from_secs(2)).build().unwrap();
    store.ensure_schema().expect("ensure_schema as user le");
    store
}

fn acquire(store: &MySqlStore, id: &str, timeout: Duration) -> Result<Lease, StoreError> {
    store.acquire("e", id, TTL, b"p", timeout)
}

/// `f` fails, and within [`FAILS_WITHIN`].
fn fails_in_time<T: std::fmt::Debug>(what: &str, f: impl FnOnce() -> Result<T, StoreError>) -> StoreError {
    let start = Instant::now();
    let r = f();
    let took = start.elapsed();
    eprintln!("{what}: {r:?} after {took:?}");
    let err = r.expect_err(what);
    assert!(took < FAILS_WITHIN, "{what}: took {took:?}");
    err
}

/// `f` works at once or after one retryable failure.
fn works_soon<T>(what: &str, mut f: impl FnMut() -> Result<T, StoreError>) -> T {
    match f() {
        Ok(v) => v,
        Err(e) => {
            assert!(e.is_retryable(), "{what}: {e:?}");
            eprintln!("{what}: one retryable failure first: {e}");
            f().unwrap_or_else(|e| panic!("{what}, second try: {e:?}"))
        }
    }
}

fn started(s: &MariaServer) {
    eprintln!("mariadbd on port {} (pid {}) started in {:?}", s.port(), s.pid(), s.started_in());
}

/// A server of the test's own (said started) and a store on it.
fn server_and_store() -> (MariaServer, MySqlStore) {
    let s = MariaServer::start();
    started(&s);
    let store = store(&s);
    (s, store)
}

/// Starts `s` again after `what` (a stop or a crash), saying how long it took.
fn start_again_after(s: &MariaServer, what: &str) {
    let t = Instant::now();
    s.start_again();
    eprintln!("start_again after {what}: {:?}", t.elapsed());
}

/// Once the store works again, the election is still `x`'s, with `fence`.
fn still_held(store: &MySqlStore, fence: u64, what: &str) {
    let lease = works_soon(what, || store.inspect("e", LONG));
    assert!(lease.held_by("x") && lease.fence == fence, "{lease:?}");
}

#[test]
fn two_servers_run_at_once_and_drop_leaves_nothing() {
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(MariaServer::start);
        (MariaServer::start(), a.join().unwrap())
    });
    started(&a);
    started(&b);
    assert_ne!(a.port(), b.port());
    let (sa, sb) = (store(&a), store(&b));
    assert!(acquire(&sa, "a", LONG).unwrap().held_by("a"));
    // Each its own data: b's row is b's, though a holds the same election.
    assert!(acquire(&sb, "b", LONG).unwrap().held_by("b"));
    assert_eq!(a.query("SELECT holder FROM leader_election"), ["a"]);
    assert_eq!(b.query("SELECT holder FROM leader_election"), ["b"]);
    let grants = a.query("SHOW GRANTS FOR 'le'@'127.0.0.1'").join("\n");
    assert!(!grants.contains("SUPER") && !grants.contains("READ_ONLY ADMIN"), "{grants}");

    let (dir, port, pid) = (a.dir().to_owned(), a.port(), a.pid());
    drop(a);
    assert!(!dir.exists(), "{} is still there", dir.display());
    assert!(!Path::new(&format!("/proc/{pid}")).exists(), "mariadbd {pid} still runs");
    TcpListener::bind(("127.0.0.1", port)).unwrap_or_else(|e| panic!("port {port} not freed: {e}"));
    assert!(acquire(&sb, "b", LONG).unwrap().held_by("b"), "b suffers from a's end");
}

#[test]
fn a_frozen_server_fails_calls_in_time_and_works_after_the_thaw() {
    let (s, store) = server_and_store();
    acquire(&store, "x", LONG).unwrap();
    s.freeze();
    let err = fails_in_time("acquire, frozen", || acquire(&store, "x", SHORT));
    assert!(err.is_retryable(), "{err:?}");
    s.thaw();
    assert!(acquire(&store, "x", LONG).expect("acquire after the thaw").held_by("x"));
}

#[test]
fn stop_then_start_again_keeps_port_and_data() {
    let (s, store) = server_and_store();
    let fence = acquire(&store, "x", LONG).unwrap().fence;
    let (port, pid) = (s.port(), s.pid());
    s.stop();
    assert!(!Path::new(&format!("/proc/{pid}")).exists(), "mariadbd {pid} still runs after stop");
    assert!(s.error_log().contains("Shutdown complete"), "not a clean shutdown");
    let err = fails_in_time("inspect, stopped", || store.inspect("e", SHORT));
    assert!(err.is_retryable(), "{err:?}");
    start_again_after(&s, "stop");
    assert_eq!(s.port(), port);
    still_held(&store, fence, "inspect after start_again");
}

#[test]
fn a_committed_row_survives_a_crash() {
    let (s, store) = server_and_store();
    let fence = acquire(&store, "x", LONG).unwrap().fence;
    s.crash();
    let log_before = s.error_log().len();
    start_again_after(&s, "crash");
    let log = s.error_log();
    assert!(log[log_before..].contains("crash recovery"), "no crash recovery in the log:\n{}", &log[log_before..]);
    still_held(&store, fence, "inspect after the crash");
}

#[test]
fn killed_sessions_cost_the_store_one_retryable_failure_at_most() {
    let (s, store) = server_and_store();
    acquire(&store, "x", LONG).unwrap();
    let killed = s.kill_session_ids("le");
    eprintln!("killed sessions {killed:?} of le");
    assert!(!killed.is_empty(), "the store's pooled connection was not found");
    // Only the killed ones must go: the leader's lock session (the release
    // feed) may open after the list was read, and reopens after its kill.
    let left = || {
        let ids = s.query("SELECT ID FROM information_schema.PROCESSLIST WHERE USER = 'le'");
        ids.into_iter().filter(|id| killed.iter().any(|k| k.to_string() == *id)).collect::<Vec<_>>()
    };
    assert!(wait_for(LONG, || left().is_empty()), "killed sessions of le still listed: {:?}", left());
    assert!(works_soon("acquire after the kill", || acquire(&store, "x", LONG)).held_by("x"));
    assert_eq!(s.kill_sessions("nobody"), 0);
}

#[test]
fn table_and_row_locks_block_acquire_until_released() {
    let (s, store) = server_and_store();
    acquire(&store, "x", LONG).unwrap();
    let held = s.lock_table(TABLE);
    let err = fails_in_time("acquire, table locked", || acquire(&store, "x", SHORT));
    assert!(err.is_retryable(), "{err:?}");
    drop(held);
    assert!(works_soon("acquire after UNLOCK TABLES", || acquire(&store, "x", LONG)).held_by("x"));

    let held = s.lock_row(TABLE, "e");
    let err = fails_in_time("acquire, row locked", || acquire(&store, "x", SHORT));
    assert!(err.is_retryable(), "{err:?}");
    // Another election's row is not locked.
    assert!(store.acquire("other", "x", TTL, b"", LONG).unwrap().held_by("x"));
    drop(held);
    assert!(works_soon("acquire after the rollback", || acquire(&store, "x", LONG)).held_by("x"));
}

#[test]
fn read_only_fails_writes_of_le_but_not_reads() {
    let (s, store) = server_and_store();
    let fence = acquire(&store, "x", LONG).unwrap().fence;
    s.set_read_only(true);
    assert_eq!(s.query("SELECT @@GLOBAL.read_only"), ["1"]);
    let err = acquire(&store, "y", LONG).expect_err("acquire on a read-only server");
    eprintln!("acquire, read-only: kind {:?}: {err}", err.kind());
    assert_eq!(err.kind(), ErrorKind::Retryable, "{err:?}");
    // Refused before `read_only` itself is reached: every write's
    // transaction is read-only while the server is.
    assert!(err.to_string().contains("1792") && err.to_string().contains("read_only"), "{err}");
    let renew = store.renew("e", "x", fence, TTL, b"p", LONG).expect_err("renew on a read-only server");
    eprintln!("renew, read-only: kind {:?}: {renew}", renew.kind());
    let lease = works_soon("inspect, read-only", || store.inspect("e", LONG));
    assert!(lease.held_by("x") && lease.fence == fence, "{lease:?}");
    s.set_read_only(false);
    assert!(works_soon("renew after read_only off", || store.renew("e", "x", fence, TTL, b"p", LONG)).held_by("x"));
}

/// An election user whom `read_only` does not stop by itself (root: ALL
/// PRIVILEGES includes READ_ONLY ADMIN; MySQL's SUPER is the same) must not
/// write through an operator's `read_only` either (issue 37): every write,
/// single or batched, runs in a transaction that is read-only while the
/// server is, and fails retryably with 1792 naming the setting; reads
/// work. The control: the same user's writes started `READ WRITE`, as
/// before, do get through, so the privilege is real and the test can fail.
#[test]
fn read_only_stops_a_privileged_election_user_too() {
    let s = MariaServer::start();
    started(&s);
    let root = MySqlStore::builder(&s.admin_url()).socket_timeout(Duration::from_secs(2)).build().unwrap();
    root.ensure_schema().expect("ensure_schema as root");
    let grants = s.query("SHOW GRANTS").join(" ");
    assert!(grants.contains("ALL PRIVILEGES"), "{grants}");
    let fence = acquire(&root, "x", LONG).unwrap().fence;
    let others = [BatchItem { name: "b1", fence: 0, payload: b"" }, BatchItem { name: "b2", fence: 0, payload: b"" }];
    let claimed: Vec<u64> = root.acquire_many("x", TTL, &others, LONG).into_iter().map(|r| r.unwrap().fence).collect();
    s.set_read_only(true);

    let err = acquire(&root, "y", LONG).expect_err("a privileged acquire on a read-only server");
    eprintln!("acquire as root, read-only: kind {:?}: {err}", err.kind());
    assert_eq!(err.kind(), ErrorKind::Retryable, "{err:?}");
    assert!(err.to_string().contains("1792") && err.to_string().contains("read_only"), "{err}");
    let renew = root.renew("e", "x", fence, TTL, b"p", LONG).expect_err("a privileged renew on a read-only server");
    assert!(renew.is_retryable() && renew.to_string().contains("1792"), "{renew}");
    assert!(root.release("e", "x", fence, LONG).is_err(), "a privileged release on a read-only server");
    let held: Vec<BatchItem<'_>> =
        others.iter().zip(&claimed).map(|(i, &fence)| BatchItem { name: i.name, fence, payload: b"" }).collect();
    for r in root.renew_many("x", TTL, &held, LONG) {
        let e = r.expect_err("a privileged batched renewal on a read-only server");
        assert!(e.is_retryable() && e.to_string().contains("read_only"), "{e}");
    }
    let lease = works_soon("inspect as root, read-only", || root.inspect("e", LONG));
    assert!(
        lease.held_by("x") && lease.fence == fence && lease.payload == b"p",
        "a refused write changed the row: {lease:?}"
    );

    // The control: today's writes without the read-only transaction.
    let over = MySqlStore::builder(&s.admin_url()).build().unwrap().__overriding_read_only();
    let through = over.renew("e", "x", fence, TTL, b"written through read_only", LONG);
    assert!(through.is_ok(), "root's READ WRITE renewal did not get through read_only: {through:?}");

    s.set_read_only(false);
    assert!(works_soon("renew after read_only off", || root.renew("e", "x", fence, TTL, b"p", LONG)).held_by("x"));
    for r in root.renew_many("x", TTL, &held, LONG) {
        assert!(r.expect("a batched renewal after read_only off").held_by("x"));
    }
}

#[test]
fn the_template_is_in_place_and_no_build_is_left() {
    let s = MariaServer::start();
    let template = Path::new(support::maria_server::TEMPLATE);
    assert!(template.join("data/mysql").is_dir(), "no template at {}", template.display());
    let stray: Vec<_> = fs::read_dir("/tmp")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains(&format!(".build-{}-", std::process::id())))
        .collect();
    assert!(stray.is_empty(), "half-built templates of this process left: {stray:?}");
    assert_eq!(s.query("SELECT 1"), ["1"]);
}

/// Every server mode at once that changed what a statement meant or broke
/// a call (issue 16, item 4), on a private MariaDB started with them:
/// `sql_mode=ORACLE` (which has `SIMULTANEOUS_ASSIGNMENT`),
/// `completion_type=RELEASE`, a named global time zone (New York, with its
/// daylight-saving rules), statement-based binary logging, and serializable
/// transactions by default. The acceptance suite passes on it, and a fleet
/// of four whose leader is crashed twice keeps one leader at a time by the
/// chaos oracle's sampler. The negative control: on a session of that
/// server, the old claim takes over an expired row with the dead leader's
/// fence.
#[test]
fn the_store_and_a_fleet_under_hostile_server_modes() {
    let server = MariaServer::start_with(&[
        "--sql-mode=ORACLE",
        "--completion-type=RELEASE",
        "--log-bin",
        "--binlog-format=STATEMENT",
        "--server-id=7",
        "--transaction-isolation=SERIALIZABLE",
    ]);
    // The named zone needs the server's time zone tables.
    let zone = std::process::Command::new("mariadb-tzinfo-to-sql")
        .args(["/usr/share/zoneinfo/America/New_York", "America/New_York"])
        .output()
        .expect("mariadb-tzinfo-to-sql");
    assert!(zone.status.success(), "{}", String::from_utf8_lossy(&zone.stderr));
    let mut root = mysql::Conn::new(
        mysql::OptsBuilder::from_opts(mysql::Opts::from_url(&server.admin_url()).unwrap()).prefer_socket(false),
    )
    .unwrap();
    exec(&mut root, "SET SESSION sql_mode = '', completion_type = 'NO_CHAIN', autocommit = 1");
    exec(&mut root, "USE mysql");
    root.query_drop(String::from_utf8(zone.stdout).unwrap()).expect("load America/New_York");
    exec(&mut root, "SET GLOBAL time_zone = 'America/New_York'");
    let modes: Vec<String> = server.query(
        "SELECT CONCAT_WS(' | ', @@GLOBAL.sql_mode, @@GLOBAL.completion_type, @@GLOBAL.time_zone, \
         @@GLOBAL.binlog_format, @@GLOBAL.log_bin, @@GLOBAL.tx_isolation)",
    );
    eprintln!("hostile modes: {modes:?}");
    assert!(modes[0].contains("SIMULTANEOUS_ASSIGNMENT"), "{modes:?}");
    assert!(
        modes[0].ends_with("| RELEASE | America/New_York | STATEMENT | ON | SERIALIZABLE"),
        "the server is not in the hostile modes: {modes:?}"
    );

    let store = || MySqlStore::builder(&server.url()).table("le_hostile").build().unwrap();
    store().ensure_schema().expect("ensure_schema under the hostile modes");
    leaderelection::storetest::run_all(&store());
    leaderelection::storetest::run_member_cases(&store());
    support::elector::fleet_survives_leader_crashes("mariadb, hostile modes", store, 2);

    // The negative control, on a session that keeps the server's sql_mode.
    let mut c = mysql::Conn::new(
        mysql::OptsBuilder::from_opts(mysql::Opts::from_url(&server.admin_url()).unwrap()).prefer_socket(false),
    )
    .unwrap();
    exec(&mut c, "SET SESSION completion_type = 'NO_CHAIN', autocommit = 1");
    let wrong = run_claim_cases(&mut c, "le_hostile", &old_claim);
    assert!(wrong.iter().any(|w| w.starts_with("expired, another's")), "not caught: {wrong:#?}");
    assert!(run_claim_cases(&mut c, "le_hostile", &current_claim).is_empty(), "the current claim, bare, too");
    let wrong = run_claim_cases(&mut c, "le_hostile", &current_batch_claim);
    assert!(wrong.is_empty(), "the batch's claim, bare: {wrong:#?}");
}

/// A statement over the server's `max_allowed_packet` (here 16 KiB, and a
/// payload whose claim needs more) is refused by the driver before it is
/// sent; that used to be retried for ever as a connection error. It is
/// fatal now, with both sizes and the setting named, and a payload that
/// fits works on the same store (the control).
#[test]
fn a_statement_over_max_allowed_packet_is_fatal_and_names_the_setting() {
    let server = MariaServer::start_with(&["--max-allowed-packet=16384"]);
    let s = MySqlStore::builder(&server.url()).table("le_packet").build().unwrap();
    s.ensure_schema().unwrap();
    let fits = vec![7u8; 4 * 1024];
    assert!(s.acquire("small", "a", TTL, &fits, LONG).unwrap().held_by("a"));
    let big = vec![7u8; 12 * 1024];
    let e = s.acquire("big", "a", TTL, &big, LONG).expect_err("a claim over max_allowed_packet");
    eprintln!("over max_allowed_packet: {e}");
    assert!(e.is_fatal(), "{e}");
    assert!(e.to_string().contains("more than max_allowed_packet (16384 bytes)"), "{e}");
    let e = s.renew("small", "a", 1, TTL, &big, LONG).expect_err("a renewal over max_allowed_packet");
    assert!(e.is_fatal(), "{e}");
    assert!(s.inspect("small", LONG).unwrap().held_by("a"), "the store still works");

    // A batch is split into statements that fit (issue 20): 300 elections,
    // far more than one 16 KiB statement holds, in one call of each kind,
    // in the transaction of that call; an item whose own statement cannot
    // fit is refused alone, fatal as the single call's, and the rest go on.
    let names: Vec<String> = (0..300).map(|k| format!("batch-{k:03}")).collect();
    let payloads: Vec<Vec<u8>> = (0..300).map(|k| format!("payload of {k:03} ").repeat(3).into_bytes()).collect();
    let mut items: Vec<BatchItem<'_>> =
        names.iter().zip(&payloads).map(|(n, p)| BatchItem { name: n, fence: 0, payload: p }).collect();
    items.insert(150, BatchItem { name: "batch-big", fence: 0, payload: &big });
    let claimed = s.acquire_many("a", TTL, &items, LONG);
    assert_eq!(claimed.len(), 301);
    let e = claimed[150].as_ref().expect_err("a claim over max_allowed_packet in a batch");
    assert!(e.is_fatal() && e.to_string().contains("more than max_allowed_packet (16384 bytes)"), "{e}");
    items.remove(150);
    let mut fences = Vec::new();
    for (r, it) in claimed.iter().enumerate().filter(|(k, _)| *k != 150).map(|(_, r)| r).zip(&items) {
        let l = r.as_ref().unwrap_or_else(|e| panic!("{}: {e}", it.name));
        assert!(l.held_by("a") && l.payload == it.payload, "{l:?}");
        fences.push(l.fence);
    }
    // Renewals: one payload for all (one statement form), then one each
    // (the other).
    for each in [false, true] {
        let renew: Vec<BatchItem<'_>> = items
            .iter()
            .zip(&fences)
            .map(|(it, f)| BatchItem { name: it.name, fence: *f, payload: if each { it.payload } else { b"same" } })
            .collect();
        for (r, it) in s.renew_many("a", TTL, &renew, LONG).iter().zip(&renew) {
            let l = r.as_ref().unwrap_or_else(|e| panic!("renew {} (one payload each: {each}): {e}", it.name));
            assert_eq!(l.payload, it.payload);
        }
    }
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    assert!(s.inspect_many(&refs, LONG).iter().all(|r| r.as_ref().is_ok_and(|l| l.held_by("a"))));
    let release: Vec<BatchItem<'_>> =
        items.iter().zip(&fences).map(|(it, f)| BatchItem { name: it.name, fence: *f, payload: b"" }).collect();
    assert!(s.release_many("a", &release, LONG).iter().all(Result::is_ok));
    assert!(s.inspect_many(&refs, LONG).iter().all(|r| r.as_ref().is_ok_and(|l| l.expired())), "not released");
}
