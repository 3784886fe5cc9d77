//! Self-test of the chaos suite's own servers (tests/support/pg_server.rs):
//! each fault it injects, seen through the real `PostgresStore`.
//!
//! Needs root, PostgreSQL's server binaries and PgBouncer (`bash
//! scripts/test.sh` installs them); it starts its own servers and never
//! touches the shared ones.

mod support;

use std::fs;
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use leaderelection::postgres::PostgresStore;
use leaderelection::{ErrorKind, Lease, Store, StoreError};
use support::pg_server::{chain, Bouncer, PgServer};
use support::{random_tag, wait_for};

const TABLE: &str = "leader_election";
const TTL: Duration = Duration::from_secs(30);
/// The operation timeout of every store call here.
const OP: Duration = Duration::from_millis(500);
/// How long a call on a broken path may take to fail: the operation
/// timeout plus scheduling slack on a loaded 2-core machine.
const FAILS_WITHIN: Duration = Duration::from_millis(1200);
/// How long a store may take to work again once the fault is gone.
const RECOVERS_WITHIN: Duration = Duration::from_secs(5);

/// A store with a small pool and a short connect timeout.
fn store(url: &str) -> PostgresStore {
    PostgresStore::builder(url).pool_size(2).connect_timeout(Duration::from_secs(2)).build().expect("store")
}

/// A server with the election table, a store on it and an election name.
fn setup() -> (PgServer, PostgresStore, String) {
    let pg = PgServer::start();
    let s = store(&pg.url());
    s.ensure_schema().expect("ensure_schema");
    (pg, s, format!("e-{}", random_tag()))
}

fn acquire(s: &PostgresStore, name: &str, id: &str) -> Result<Lease, StoreError> {
    s.acquire(name, id, TTL, b"", OP)
}

/// Runs `f`, asserts that it fails retryably within [`FAILS_WITHIN`], and
/// returns the error.
fn fails_in_time<T: std::fmt::Debug>(what: &str, f: impl FnOnce() -> Result<T, StoreError>) -> StoreError {
    let t = Instant::now();
    let r = f();
    let took = t.elapsed();
    let e = r.expect_err(what);
    assert!(took <= FAILS_WITHIN, "{what}: failed only after {took:?}: {e}");
    assert_eq!(e.kind(), ErrorKind::Retryable, "{what}: {}", chain(&e));
    e
}

/// Polls `f` until it succeeds, within [`RECOVERS_WITHIN`].
fn recovers<T>(what: &str, mut f: impl FnMut() -> Result<T, StoreError>) {
    let mut last = None;
    let ok = wait_for(RECOVERS_WITHIN, || match f() {
        Ok(_) => true,
        Err(e) => {
            last = Some(chain(&e));
            false
        }
    });
    assert!(ok, "{what}: still failing after {RECOVERS_WITHIN:?}: {last:?}");
}

/// Starts `pg` again after `what` (a stop or a crash), saying how long it took.
fn start_again_after(pg: &PgServer, what: &str) {
    let t = Instant::now();
    pg.start_again();
    eprintln!("PgServer::start_again after {what}: {:?}", t.elapsed());
}

/// Once the store works again (within [`RECOVERS_WITHIN`]), `name` is still
/// a's, with `fence`.
fn still_held(s: &PostgresStore, name: &str, fence: u64, what: &str) {
    recovers(what, || s.inspect(name, OP));
    let after = s.inspect(name, OP).unwrap();
    assert_eq!((after.holder.as_str(), after.fence), ("a", fence), "{what}");
}

fn refused(port: u16) -> bool {
    TcpStream::connect(("127.0.0.1", port)).is_err()
}

fn gone(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| s[s.rfind(')').unwrap() + 1..].starts_with(" Z"))
}

#[test]
fn two_servers_start_at_once_apart_and_both_work() {
    let timed = || {
        let t = Instant::now();
        let pg = PgServer::start();
        (pg, t.elapsed())
    };
    let (a, b) = thread::scope(|s| {
        let (a, b) = (s.spawn(timed), s.spawn(timed));
        (a.join().unwrap(), b.join().unwrap())
    });
    let (c, warm) = timed();
    eprintln!("PgServer::start: {:?} and {:?} at once, then {warm:?} alone", a.1, b.1);
    assert!(warm < Duration::from_secs(3), "a start from the template took {warm:?}");
    let (a, b) = (a.0, b.0);
    assert_ne!(a.port(), b.port());
    assert_ne!(a.dir(), b.dir());
    drop(c);
    for (pg, id) in [(&a, "a"), (&b, "b")] {
        assert_eq!(pg.sql("SELECT inet_server_port()"), [pg.port().to_string()]);
        assert_eq!(pg.sql("SELECT current_database()"), ["test"]);
        let s = store(&pg.url());
        s.ensure_schema().unwrap();
        assert!(acquire(&s, "one", id).unwrap().held_by(id), "{id} leads on its own server");
    }
    // Two servers, two rows: neither saw the other's claim.
    assert_eq!(a.sql(&format!("SELECT holder FROM {TABLE}")), ["a"]);
    assert_eq!(b.sql(&format!("SELECT holder FROM {TABLE}")), ["b"]);
}

#[test]
fn freeze_makes_calls_time_out_and_thaw_brings_them_back() {
    let (pg, s, name) = setup();
    acquire(&s, &name, "a").unwrap();
    let states = |pg: &PgServer| {
        let pm = pg.pid();
        let stat = |p: u32| fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
        let kids: Vec<String> = fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .map(stat)
            .filter(|t| t.rsplit(')').next().unwrap().split_whitespace().nth(1) == Some(&pm.to_string()))
            .collect();
        (stat(pm), kids)
    };
    pg.freeze();
    let (pm, kids) = states(&pg);
    assert!(pm.rsplit(')').next().unwrap().starts_with(" T"), "postmaster not stopped: {pm}");
    assert!(kids.len() >= 3, "backends and workers: {kids:?}");
    for k in &kids {
        assert!(k.rsplit(')').next().unwrap().starts_with(" T"), "child not stopped: {k}");
    }
    fails_in_time("inspect on a frozen server", || s.inspect(&name, OP));
    fails_in_time("acquire on a frozen server", || acquire(&s, &name, "a"));
    pg.thaw();
    recovers("inspect after the thaw", || s.inspect(&name, OP));
    assert!(acquire(&s, &name, "a").unwrap().held_by("a"));
}

#[test]
fn stop_and_start_again_keep_port_and_data() {
    let (pg, s, name) = setup();
    let before = acquire(&s, &name, "a").unwrap();
    let pid = pg.pid();
    pg.stop();
    assert!(refused(pg.port()), "stopped, yet the port answers");
    assert!(gone(pid));
    fails_in_time("inspect on a stopped server", || s.inspect(&name, OP));
    start_again_after(&pg, "stop");
    assert_ne!(pg.pid(), pid);
    still_held(&s, &name, before.fence, "inspect after start_again");
}

#[test]
fn crash_keeps_committed_rows_and_recovery_runs() {
    let (pg, s, name) = setup();
    // Returned Ok: committed. Crashed at once, before any checkpoint.
    let before = acquire(&s, &name, "a").unwrap();
    let kids: Vec<u32> =
        pg.sql("SELECT pid FROM pg_stat_activity").iter().map(|p| p.parse().unwrap()).collect::<Vec<u32>>();
    let pid = pg.pid();
    pg.crash();
    assert!(gone(pid) && kids.iter().all(|&k| gone(k)), "processes left after crash()");
    assert!(refused(pg.port()));
    start_again_after(&pg, "crash (with recovery)");
    assert!(
        pg.log_tail().contains("automatic recovery in progress"),
        "no crash recovery in the log:\n{}",
        pg.log_tail()
    );
    still_held(&s, &name, before.fence, "inspect after the crash");
}

#[test]
fn terminate_backends_ends_the_stores_session_and_the_store_recovers() {
    let (pg, s, name) = setup();
    acquire(&s, &name, "a").unwrap();
    let n = pg.terminate_backends();
    assert!(n >= 1, "the store's pooled session was not terminated ({n})");
    // The pooled connection is dead: at most one call fails, retryably.
    let first = s.inspect(&name, OP);
    if let Err(e) = &first {
        assert_eq!(e.kind(), ErrorKind::Retryable, "{}", chain(e));
    }
    eprintln!("terminate_backends ended {n}; the store's next call: {:?}", first.as_ref().map(|_| "ok"));
    s.inspect(&name, OP).expect("the call after one failure works");
    assert_eq!(pg.terminate_backends(), 1, "only the store's new session is left");
}

#[test]
fn locks_make_acquire_fail_in_time_until_dropped() {
    let (pg, s, name) = setup();
    acquire(&s, &name, "a").unwrap();

    let held = pg.lock_table(TABLE);
    fails_in_time("acquire under a table lock", || acquire(&s, &name, "a"));
    fails_in_time("inspect under a table lock", || s.inspect(&name, OP));
    drop(held);
    assert!(acquire(&s, &name, "a").unwrap().held_by("a"), "acquire after the table lock");

    let held = pg.lock_row(&format!("public.{TABLE}"), &name);
    let e = fails_in_time("acquire under a row lock", || acquire(&s, &name, "a"));
    assert!(chain(&e).contains("55P03"), "lock timeout expected: {}", chain(&e));
    s.inspect(&name, OP).expect("reads pass a row lock");
    drop(held);
    assert!(acquire(&s, &name, "a").unwrap().held_by("a"), "acquire after the row lock");
}

/// A demoted server (a standby: restarted in recovery) refuses every write,
/// retryable, with the reason; reads work; writes work again once it is
/// promoted.
#[test]
fn a_standby_refuses_writes_retryably_and_reads_work() {
    let (pg, s, name) = setup();
    acquire(&s, &name, "a").unwrap();
    pg.set_read_only(true);
    // The restart ended the pool's sessions: the first calls may meet that.
    let mut last = None;
    let standby = wait_for(RECOVERS_WITHIN, || {
        let e = acquire(&s, &name, "a").expect_err("acquire on a standby");
        let seen = chain(&e).contains("standby");
        last = Some(e);
        seen
    });
    let e = last.unwrap();
    assert!(standby, "no standby error: {}", chain(&e));
    let text = chain(&e);
    eprintln!("acquire on a standby: kind {:?}: {text}", e.kind());
    assert!(text.contains("standby") && text.contains("25006"), "{text}");
    assert_eq!(e.kind(), ErrorKind::Retryable, "{text}");
    let renew = s.renew(&name, "a", 1, Duration::from_secs(60), b"", OP).expect_err("renew on a standby");
    assert!(renew.is_retryable() && chain(&renew).contains("standby"), "{}", chain(&renew));
    let seen = s.inspect(&name, OP).expect("reads work on a standby");
    assert!(seen.held_by("a"), "{seen:?}");
    pg.set_read_only(false);
    recovers("acquire after the promotion", || acquire(&s, &name, "a"));
    assert!(acquire(&s, &name, "a").unwrap().held_by("a"));
}

/// Where an operator can make a PostgreSQL server read-only without
/// demoting it (issue 37): `default_transaction_read_only` set for the
/// server, the database or the role. Sessions take a database's or role's
/// setting when they start, so each level is seen through new sessions.
#[derive(Clone, Copy, Debug)]
enum Level {
    Server,
    Database,
    Role,
}

impl Level {
    fn set(self, pg: &PgServer, on: bool) {
        match self {
            Level::Server => pg.set_default_read_only(on),
            // Under the setting the helper's own transactions are
            // read-only too: it lifts it in a read-write one.
            Level::Database | Level::Role => {
                let target = if matches!(self, Level::Database) { "DATABASE test" } else { "ROLE postgres" };
                let what =
                    if on { "SET default_transaction_read_only = on" } else { "RESET default_transaction_read_only" };
                pg.sql(&format!("BEGIN READ WRITE; ALTER {target} {what}; COMMIT"));
            }
        }
    }
}

/// An operator's read-only setting on the server, the database or the
/// role is respected, directly and through PgBouncer: writes fail
/// retryably, naming the setting, and change nothing; reads work; writes
/// work again once it is lifted. The control: a store whose writes
/// override the setting, as every write did before, writes through it.
#[test]
fn an_operators_read_only_setting_stops_the_election_writes() {
    let (pg, s, name) = setup();
    let held = acquire(&s, &name, "a").unwrap();
    for level in [Level::Server, Level::Database, Level::Role] {
        level.set(&pg, true);
        // New sessions, so a database's or role's setting applies.
        let bouncer = Bouncer::start(pg.port(), 2);
        for (path, url) in [("direct", pg.url()), ("pgbouncer", bouncer.url())] {
            let what = format!("{level:?} read-only, {path}");
            let fresh = store(&url);
            let e = fails_in_time(&format!("acquire, {what}"), || acquire(&fresh, &name, "b"));
            let text = chain(&e);
            eprintln!("acquire, {what}: {text}");
            assert!(text.contains("default_transaction_read_only") && text.contains("25006"), "{what}: {text}");
            let e = fails_in_time(&format!("renew, {what}"), || fresh.renew(&name, "a", held.fence, TTL, b"x", OP));
            assert!(chain(&e).contains("default_transaction_read_only"), "{what}: {}", chain(&e));
            let seen = fresh.inspect(&name, OP).unwrap_or_else(|e| panic!("inspect, {what}: {}", chain(&e)));
            assert!(seen.held_by("a") && seen.fence == held.fence && seen.payload.is_empty(), "{what}: {seen:?}");
            // The control: the override writes through the fence.
            let through = store(&url).__overriding_read_only().renew(&name, "a", held.fence, TTL, b"", OP);
            assert!(through.is_ok(), "{what}: the overriding renewal was refused: {through:?}");
        }
        level.set(&pg, false);
        let after = store(&pg.url());
        recovers(&format!("renew after the {level:?} setting was lifted"), || {
            after.renew(&name, "a", held.fence, TTL, b"", OP)
        });
    }
}

/// A read-only default that another client of PgBouncer left on a shared
/// server connection (a session `SET`, which transaction mode never
/// resets) is not the operator's: the store's writes override it. Behind
/// a pool of one server connection the store's calls run on that very
/// connection, as a raw write shows. With the operator's setting on as
/// well, the store's writes stop.
#[test]
fn a_read_only_default_another_pooler_client_left_is_overridden() {
    let (pg, direct, name) = setup();
    drop(direct);
    let bouncer = Bouncer::start(pg.port(), 1);
    let mut leaker = postgres::Client::connect(&bouncer.url(), postgres::NoTls).expect("connect through the bouncer");
    leaker.batch_execute("SET default_transaction_read_only = on").expect("the leaking SET");
    drop(leaker);
    let mut raw = postgres::Client::connect(&bouncer.url(), postgres::NoTls).expect("connect through the bouncer");
    let shown = |raw: &mut postgres::Client| {
        let msgs = raw.simple_query("SHOW default_transaction_read_only").unwrap();
        msgs.iter().find_map(|m| match m {
            postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
            _ => None,
        })
    };
    assert_eq!(shown(&mut raw).as_deref(), Some("on"), "the SET did not stay on the shared server connection");
    let e = raw.batch_execute(&format!("INSERT INTO public.{TABLE} (name, holder) VALUES ('raw', 'raw')"));
    assert!(
        e.as_ref().err().and_then(|e| e.code()).is_some_and(|c| c.code() == "25006"),
        "the leak did not stop a raw write: {e:?}"
    );

    let s = store(&bouncer.url());
    let lease =
        acquire(&s, &name, "a").unwrap_or_else(|e| panic!("a leaked session default stopped the store: {}", chain(&e)));
    assert!(lease.held_by("a"), "{lease:?}");
    assert!(s.renew(&name, "a", lease.fence, TTL, b"", OP).unwrap().held_by("a"));
    assert_eq!(shown(&mut raw).as_deref(), Some("on"), "the leak went away");

    pg.set_default_read_only(true);
    let e = fails_in_time("renew, leaked and server read-only", || s.renew(&name, "a", lease.fence, TTL, b"", OP));
    assert!(chain(&e).contains("default_transaction_read_only"), "{}", chain(&e));
    pg.set_default_read_only(false);
    recovers("renew after the server setting was lifted", || s.renew(&name, "a", lease.fence, TTL, b"", OP));
}

#[test]
fn bouncer_pause_resume_restart_and_kill() {
    let (pg, direct, name) = setup();
    let t = Instant::now();
    let b = Bouncer::start(pg.port(), 2);
    eprintln!("Bouncer::start: {:?}", t.elapsed());
    assert_ne!(b.port(), pg.port());
    let s = store(&b.url());
    assert!(acquire(&s, &name, "a").unwrap().held_by("a"), "acquire through the bouncer");
    assert!(direct.inspect(&name, OP).unwrap().held_by("a"), "the claim reached the server");

    b.pause();
    fails_in_time("inspect through a paused bouncer", || s.inspect(&name, OP));
    b.resume();
    recovers("inspect after resume", || s.inspect(&name, OP));

    let t = Instant::now();
    b.restart();
    eprintln!("Bouncer::restart: {:?}", t.elapsed());
    recovers("inspect after restart", || s.inspect(&name, OP));

    b.kill();
    assert!(refused(b.port()), "killed, yet the bouncer's port answers");
    fails_in_time("inspect through a killed bouncer", || s.inspect(&name, OP));
    b.start_again();
    recovers("inspect after start_again", || acquire(&s, &name, "a"));
}

#[test]
fn drop_stops_even_a_frozen_server_removes_dirs_and_frees_ports() {
    let pg = PgServer::start();
    let b = Bouncer::start(pg.port(), 1);
    let (dir, port, bport, pid) = (pg.dir().to_owned(), pg.port(), b.port(), pg.pid());
    let kids: Vec<u32> = pg.sql("SELECT pid FROM pg_stat_activity").iter().map(|p| p.parse().unwrap()).collect();
    assert!(dir.join("PG_VERSION").exists());
    pg.freeze();
    let t = Instant::now();
    drop(b);
    drop(pg);
    eprintln!("drop of a frozen PgServer and a Bouncer: {:?}", t.elapsed());
    assert!(!dir.exists(), "{} left behind", dir.display());
    assert!(gone(pid) && kids.iter().all(|&k| gone(k)), "server processes left behind");
    for p in [port, bport] {
        assert!(refused(p), "port {p} still answers");
        TcpListener::bind(("127.0.0.1", p)).unwrap_or_else(|e| panic!("port {p} not free: {e}"));
    }
}

#[test]
fn drop_after_a_crash_removes_the_shared_memory_segment() {
    let pg = PgServer::start();
    let pidfile = fs::read_to_string(pg.dir().join("postmaster.pid")).unwrap();
    let shmid = pidfile.lines().nth(6).and_then(|l| l.split_whitespace().nth(1)).unwrap().to_owned();
    // `ipcs -i` exits 0 for a missing id too: look the id up in the list.
    let exists = |id: &str| {
        let out = Command::new("ipcs").arg("-m").output().expect("ipcs");
        String::from_utf8_lossy(&out.stdout).lines().any(|l| l.split_whitespace().nth(1) == Some(id))
    };
    assert!(exists(&shmid), "segment {shmid} of a running server");
    pg.crash();
    assert!(exists(&shmid), "a crash leaves segment {shmid}");
    drop(pg);
    assert!(!exists(&shmid), "drop left segment {shmid}");
}
