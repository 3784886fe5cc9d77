//! `MySqlStore::from_pool`: the store on a `mysql::Pool` the application
//! built and keeps using. The acceptance suite runs on it unchanged; the
//! rest checks what the pool would get wrong on its own: a connection the
//! store gave up on must never come back out of the pool, its slot must be
//! freed, and the application's socket timeouts must be its own again.
//! Against the shared MariaDB; run with `bash scripts/test.sh`.

mod mysql_support;
mod support;

use std::time::{Duration, Instant};

use leaderelection::mysql::MySqlStore;
use leaderelection::{Config, Elector, Lease, Store};
use mysql::prelude::Queryable;
use mysql_support::{admin, exec, url, SHARED};
use support::{random_tag, wait_for, TIMING};

const TABLE: &str = "le_pooltest";
const T: Duration = Duration::from_secs(5);
const LONG: Duration = Duration::from_secs(60);

/// A pool of the application's on `user` (created with access to
/// [`TABLE`]), at most `max` connections, 7 s socket timeouts.
fn app_pool(user: &str, pass: &str, max: usize) -> mysql::Pool {
    pool_with(user, pass, max, mysql::PoolOpts::default())
}

/// [`app_pool`] with these pool options (the connection limit is set here).
fn pool_with(user: &str, pass: &str, max: usize, pool_opts: mysql::PoolOpts) -> mysql::Pool {
    let mut c = admin(SHARED);
    exec(&mut c, &format!("CREATE USER IF NOT EXISTS '{user}'@'127.0.0.1' IDENTIFIED BY '{pass}'"));
    exec(
        &mut c,
        &format!("GRANT SELECT, INSERT, UPDATE, CREATE, CREATE TEMPORARY TABLES ON test.* TO '{user}'@'127.0.0.1'"),
    );
    let shared = mysql::Opts::from_url(&url(SHARED)).expect("test URL parses");
    let opts = mysql::OptsBuilder::new()
        .ip_or_hostname(Some("127.0.0.1"))
        .tcp_port(shared.get_tcp_port())
        .db_name(shared.get_db_name())
        .user(Some(user))
        .pass(Some(pass))
        .prefer_socket(false)
        .read_timeout(Some(Duration::from_secs(7)))
        .write_timeout(Some(Duration::from_secs(7)))
        .pool_opts(pool_opts.with_constraints(mysql::PoolConstraints::new(0, max).unwrap()));
    mysql::Pool::new(opts).expect("pool")
}

/// The table, made (or brought up to date) by the admin: the application's
/// users may lack `CREATE` and `ALTER`, as in production.
fn schema() {
    let admin = MySqlStore::builder(&url(SHARED)).table(TABLE).build().expect("store");
    admin.ensure_schema().unwrap_or_else(|e| panic!("ensure_schema: {e}"));
}

fn on(pool: &mysql::Pool) -> MySqlStore {
    schema();
    MySqlStore::builder_from_pool(pool.clone()).table(TABLE).build().expect("store")
}

fn store() -> MySqlStore {
    on(&app_pool("le_pool_suite", "pool-suite-pw", 8))
}

leaderelection::storetest_suite!(store());

fn hex(b: &[u8]) -> String {
    format!("X'{}'", b.iter().map(|b| format!("{b:02x}")).collect::<String>())
}

/// The application's next connection from `pool`: its session id, and
/// whether it answers a query of its own with that query's result (a
/// connection left behind a reply would give an earlier one's).
fn next_session(pool: &mysql::Pool) -> u32 {
    let mut c = pool.try_get_conn(Duration::from_secs(2)).expect("the pool has a free slot");
    let tag = u32::from_le_bytes(random_tag().as_bytes()[..4].try_into().unwrap());
    let got: Option<u32> = c.query_first(format!("SELECT {tag}")).expect("query on the application's connection");
    assert_eq!(got, Some(tag), "the application's connection answered another query");
    c.connection_id()
}

/// A call the store gave up on (no answer behind a row lock), and one whose
/// socket timed out, leave the pool with neither that session nor its slot:
/// with a pool of one, the application's next connection is a new session
/// that answers its own query, every time, more times than the pool has
/// slots. A healthy connection goes back and is reused (the control).
#[test]
fn connections_given_up_on_never_go_back_to_the_pool() {
    let pool = app_pool("le_pool_giveup", "pool-giveup-pw", 1);
    let s = on(&pool);
    let short = MySqlStore::builder_from_pool(pool.clone())
        .table(TABLE)
        .socket_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let name = format!("giveup-{}", random_tag());
    let lease = s.acquire(&name, "a", LONG, b"", T).unwrap();
    let healthy = next_session(&pool);
    s.inspect(&name, T).unwrap();
    assert_eq!(next_session(&pool), healthy, "a healthy connection goes back to the pool");

    let mut locker = admin(SHARED);
    exec(&mut locker, "START TRANSACTION");
    exec(&mut locker, &format!("SELECT * FROM {TABLE} WHERE name = {} FOR UPDATE", hex(name.as_bytes())));
    let mut seen = vec![healthy];
    for round in 0..3 {
        let (store, timeout, what) = if round == 1 {
            (&short, Duration::from_secs(3), "socket timeout")
        } else {
            (&s, Duration::from_millis(600), "no answer")
        };
        let start = Instant::now();
        let e = store.renew(&name, "a", lease.fence, LONG, b"", timeout).expect_err("renew of a locked row");
        eprintln!("round {round}: {:?}: {e}", start.elapsed());
        assert!(e.is_retryable() && e.to_string().contains(what), "{e}");
        assert!(start.elapsed() < timeout + Duration::from_millis(300), "{:?}", start.elapsed());
        assert!(wait_for(Duration::from_secs(3), || format!("{store:?}").contains("abandoned_calls: 0")), "{store:?}");
        let next = next_session(&pool);
        assert!(!seen.contains(&next), "round {round}: the pool handed out session {next} again ({seen:?})");
        seen.push(next);
    }
    exec(&mut locker, "ROLLBACK");
    // The late renewals were ended on the server, not left to land.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(s.inspect(&name, T).unwrap().expires_at, lease.expires_at);
    assert!(s.renew(&name, "a", lease.fence, LONG, b"", T).is_ok());
}

/// The store's short socket timeouts hold only while it holds a connection:
/// on the same (only) connection, the application's query that is silent
/// for longer than the store's timeout still works afterwards.
#[test]
fn the_applications_socket_timeouts_come_back() {
    let pool = app_pool("le_pool_timeouts", "pool-timeouts-pw", 1);
    let s = MySqlStore::builder_from_pool(pool.clone())
        .table(TABLE)
        .socket_timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    schema();
    let name = format!("timeouts-{}", random_tag());
    s.acquire(&name, "a", LONG, b"", T).unwrap();
    let id = next_session(&pool);
    let mut c = pool.try_get_conn(T).unwrap();
    assert_eq!(c.connection_id(), id, "the store's connection went back to the pool");
    let slept: Option<u8> = c.query_first("SELECT SLEEP(0.6) + 7").expect("a query silent for 600 ms");
    assert_eq!(slept, Some(7));
}

/// Every connection of the application's pool busy: a store call fails in
/// time with a retryable error, and works once one comes back.
#[test]
fn a_busy_pool_fails_the_call_in_time() {
    let pool = app_pool("le_pool_busy", "pool-busy-pw", 1);
    let s = on(&pool);
    let name = format!("busy-{}", random_tag());
    let held = pool.get_conn().unwrap();
    let start = Instant::now();
    let e = s.acquire(&name, "a", LONG, b"", Duration::from_millis(500)).expect_err("pool is busy");
    let took = start.elapsed();
    // The call thread ("stayed busy") and the caller giving up at the
    // deadline ("no connection within") race; either says it.
    let said = e.to_string();
    assert!(e.is_retryable() && (said.contains("busy") || said.contains("no connection within")), "{e}");
    assert!(took >= Duration::from_millis(450) && took < Duration::from_millis(1500), "{took:?}");
    drop(held);
    assert!(s.acquire(&name, "a", LONG, b"", T).unwrap().held_by("a"));
}

/// Electors on stores sharing the application's pool elect one; no
/// password in the store's `Debug`.
#[test]
fn a_fleet_on_the_applications_pool_elects_one() {
    let pool = app_pool("le_pool_fleet", "pool-fleet-pw", 6);
    let s = on(&pool);
    assert!(!format!("{s:?}").contains("pool-fleet-pw"), "{s:?}");
    let name = format!("pool-fleet-{}", random_tag());
    let fleet: Vec<Elector> = (0..3)
        .map(|i| {
            let c = Config::new(s.clone(), &name).identity(format!("node-{i}")).timing(TIMING);
            Elector::start(c).expect("start")
        })
        .collect();
    let one = || fleet.iter().filter(|e| e.is_leader()).count() == 1;
    assert!(wait_for(Duration::from_secs(10), one), "no single leader");
    let leader = fleet.iter().position(|e| e.is_leader()).unwrap();
    let until = Instant::now() + Duration::from_secs(1);
    while Instant::now() < until {
        assert!(fleet.iter().filter(|e| e.is_leader()).count() <= 1, "two leaders");
        std::thread::sleep(Duration::from_millis(10));
    }
    fleet[leader].shutdown().unwrap();
    let others = || fleet.iter().enumerate().filter(|(i, e)| *i != leader && e.is_leader()).count() == 1;
    assert!(wait_for(Duration::from_secs(5), others), "no hand-over");
}

/// What belongs to the pool's own options is refused on the builder, with
/// a fatal error that says where to set it.
#[test]
fn settings_that_belong_to_the_pool_are_refused() {
    let pool = app_pool("le_pool_refuse", "pool-refuse-pw", 1);
    for b in [
        MySqlStore::builder_from_pool(pool.clone()).ca_file("/etc/ssl/certs/ca-certificates.crt"),
        MySqlStore::builder_from_pool(pool.clone()).connect_timeout(Duration::from_secs(1)),
    ] {
        let e = b.build().expect_err("refused");
        assert!(!e.is_retryable() && e.to_string().contains("pool's options"), "{e}");
    }
    let s = MySqlStore::from_pool(pool).unwrap();
    assert!(!s.uses_tls());
    assert_eq!(s.table(), leaderelection::mysql::DEFAULT_TABLE);
}

/// A pool of one connection that goes back as the application left it
/// (`reset_connection = false`, an option of the pool and of the URL), and
/// a way to leave things on that connection.
struct Leaky {
    pool: mysql::Pool,
}

impl Leaky {
    fn new(user: &str) -> Leaky {
        Leaky { pool: pool_with(user, "leaky-pw", 1, mysql::PoolOpts::default().with_reset_connection(false)) }
    }

    /// Runs `statements` on the pool's one connection and gives it back.
    fn leave(&self, statements: &[&str]) {
        let mut c = self.pool.try_get_conn(Duration::from_secs(2)).expect("the pool's connection");
        for q in statements {
            c.query_drop(*q).unwrap_or_else(|e| panic!("{q}: {e}"));
        }
    }

    fn store(&self) -> MySqlStore {
        on(&self.pool)
    }

    /// "a" holds a fresh election `prefix-…` through a clean pool; with
    /// `statements` left on this pool's connection, "b"'s claim through it
    /// must still lose (`what` says what a win would be). The holder's
    /// store, a's lease and the lease b's claim saw, for the case's own
    /// checks.
    fn claim_loses_to_a_live_lease(&self, prefix: &str, statements: &[&str], what: &str) -> (MySqlStore, Lease, Lease) {
        let (b, holder) = (self.store(), on(&app_pool("le_leak_holder", "leak-holder-pw", 2)));
        let name = format!("{prefix}-{}", random_tag());
        let a = holder.acquire(&name, "a", LONG, b"", T).unwrap();
        assert!(a.held_by("a"));
        self.leave(statements);
        let seen = b.acquire(&name, "b", LONG, b"", T).unwrap();
        assert!(seen.held_by("a") && seen.fence == a.fence, "{what}: {seen:?}");
        (holder, a, seen)
    }
}

/// A session clock the application moved a day ahead
/// (`SET SESSION timestamp`) made a lease valid for another minute look
/// expired, and the store's claim on that connection won it: two leaders.
/// The store resets the session it borrows and pins the clock, so the
/// claim loses and the holder keeps its term.
#[test]
fn a_session_clock_left_a_day_ahead_does_not_expire_a_live_lease() {
    let leaky = Leaky::new("le_leak_clock");
    let (holder, a, seen) = leaky.claim_loses_to_a_live_lease(
        "leak-clock",
        &["SET SESSION timestamp = UNIX_TIMESTAMP() + 86400"],
        "a live lease was claimed on a leaked clock",
    );
    assert!(seen.ttl() > LONG - Duration::from_secs(5), "{seen:?}");
    assert!(holder.renew(&a.name, "a", a.fence, LONG, b"", T).unwrap().held_by("a"));
}

/// A `sql_mode` the application left on the connection
/// (`SIMULTANEOUS_ASSIGNMENT`, which has every assignment of the claim read
/// the old row) turned a claim of an expired lease into "this holder, the
/// dead leader's fence, the old expiry", which the read-back accepted: the
/// claimer led on a row that another could claim at once. Now the claim
/// takes a new fence and a fresh expiry, and a third participant loses.
#[test]
fn a_leaked_simultaneous_assignment_mode_cannot_share_a_fence() {
    let leaky = Leaky::new("le_leak_mode");
    let (b, other) = (leaky.store(), on(&app_pool("le_leak_other", "leak-other-pw", 2)));
    let name = format!("leak-mode-{}", random_tag());
    let ttl = Duration::from_secs(1);
    let a = other.acquire(&name, "a", ttl, b"", T).unwrap();
    assert!(wait_for(Duration::from_secs(5), || other.inspect(&name, T).unwrap().expired()), "never expired");
    leaky.leave(&["SET SESSION sql_mode = CONCAT(@@sql_mode, ',SIMULTANEOUS_ASSIGNMENT')"]);
    let won = b.acquire(&name, "b", ttl, b"", T).expect("the claim of an expired lease");
    assert!(won.held_by("b") && won.fence > a.fence, "a claim that kept the dead leader's fence: {a:?} -> {won:?}");
    let row = other.inspect(&name, T).unwrap();
    assert!(row.held_by("b") && !row.expired() && row.fence == won.fence, "{row:?}");
    let third = other.acquire(&name, "c", ttl, b"", T).unwrap();
    assert!(third.held_by("b"), "a third participant claimed the new term too: {third:?}");
}

/// A temporary table the application left on the connection, named like
/// the election table, shadowed it: the store's claim landed there. The
/// session is reset before the store uses it, so the claim meets the real
/// row (and loses to its holder).
#[test]
fn a_temporary_table_left_on_the_session_does_not_shadow_the_election() {
    let leaky = Leaky::new("le_leak_temp");
    let ddl = MySqlStore::schema(TABLE).unwrap().replace("CREATE TABLE", "CREATE TEMPORARY TABLE");
    let statements = [ddl.trim_end().trim_end_matches(';')];
    leaky.claim_loses_to_a_live_lease("leak-temp", &statements, "the claim went to a shadowing table");
}

/// Work the application left uncommitted on the connection (autocommit
/// off, a row inserted) is not committed by the store's own transaction,
/// which would start by committing it: the session is reset (rolled back)
/// first, so nothing of the application's lands by the store's hand.
#[test]
fn work_left_uncommitted_on_the_session_is_not_committed_by_the_store() {
    let leaky = Leaky::new("le_leak_txn");
    let b = leaky.store();
    let scratch = format!("le_leak_scratch_{}", random_tag());
    exec(&mut admin(SHARED), &format!("CREATE TABLE test.{scratch} (id INT PRIMARY KEY)"));
    exec(&mut admin(SHARED), &format!("GRANT SELECT, INSERT ON test.{scratch} TO 'le_leak_txn'@'127.0.0.1'"));
    leaky.leave(&["SET autocommit = 0", &format!("INSERT INTO test.{scratch} VALUES (1)")]);
    let name = format!("leak-txn-{}", random_tag());
    assert!(b.acquire(&name, "b", LONG, b"", T).unwrap().held_by("b"));
    let rows: Vec<i64> = admin(SHARED).query(format!("SELECT id FROM test.{scratch}")).unwrap();
    exec(&mut admin(SHARED), &format!("DROP TABLE test.{scratch}"));
    assert!(rows.is_empty(), "the application's uncommitted insert was committed by the store: {rows:?}");
}
