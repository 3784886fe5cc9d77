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
use leaderelection::{Config, Elector, Store};
use mysql::prelude::Queryable;
use mysql_support::{admin, exec, url, SHARED};
use support::{random_tag, wait_for, TIMING};

const TABLE: &str = "le_pooltest";
const T: Duration = Duration::from_secs(5);
const LONG: Duration = Duration::from_secs(60);

/// A pool of the application's on `user` (created with access to
/// [`TABLE`]), at most `max` connections, 7 s socket timeouts.
fn app_pool(user: &str, pass: &str, max: usize) -> mysql::Pool {
    let mut c = admin(SHARED);
    exec(&mut c, &format!("CREATE USER IF NOT EXISTS '{user}'@'127.0.0.1' IDENTIFIED BY '{pass}'"));
    exec(&mut c, &format!("GRANT SELECT, INSERT, UPDATE, CREATE ON test.* TO '{user}'@'127.0.0.1'"));
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
        .pool_opts(mysql::PoolOpts::default().with_constraints(mysql::PoolConstraints::new(0, max).unwrap()));
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
