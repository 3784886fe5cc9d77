//! `MySqlStore::builder_from_pool` on pools that go wrong in ways
//! `mysql_pool.rs` does not cover: a pool whose server cannot be reached,
//! an idle connection of the pool that the server killed, and a pool that
//! sets no read timeout (the store warns, once per store). Against the
//! shared MariaDB; run with `bash scripts/test.sh`.

mod mysql_support;
mod support;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use leaderelection::mysql::MySqlStore;
use leaderelection::Store;
use mysql::prelude::Queryable;
use mysql_support::{admin, url, SHARED};
use support::random_tag;

const TABLE: &str = "le_pooltest";
const T: Duration = Duration::from_secs(5);

static LOGGED: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct Capture;

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, record: &log::Record<'_>) {
        if record.level() <= log::Level::Warn {
            LOGGED.lock().unwrap().push(record.args().to_string());
        }
    }
    fn flush(&self) {}
}

fn warnings_about_read_timeout() -> usize {
    LOGGED.lock().unwrap().iter().filter(|l| l.contains("sets no read_timeout")).count()
}

/// A pool on the shared server, at most `max` connections, with these
/// socket read timeouts and health checks.
fn pool(max: usize, read_timeout: Option<Duration>, check_health: bool) -> mysql::Pool {
    let opts = mysql::OptsBuilder::from_opts(mysql::Opts::from_url(&url(SHARED)).unwrap())
        .prefer_socket(false)
        .read_timeout(read_timeout)
        .write_timeout(Some(Duration::from_secs(7)))
        .pool_opts(
            mysql::PoolOpts::default()
                .with_check_health(check_health)
                .with_constraints(mysql::PoolConstraints::new(0, max).unwrap()),
        );
    mysql::Pool::new(opts).expect("pool")
}

fn on(pool: &mysql::Pool) -> MySqlStore {
    MySqlStore::builder(&url(SHARED)).table(TABLE).build().unwrap().ensure_schema().expect("ensure_schema");
    MySqlStore::builder_from_pool(pool.clone()).table(TABLE).build().expect("store")
}

/// A pool whose server refuses connections: the call fails in time with a
/// retryable error (the server may come back), not a fatal one.
#[test]
fn a_pool_whose_server_cannot_be_reached_fails_the_call_retryable() {
    let opts = mysql::OptsBuilder::new()
        .ip_or_hostname(Some("127.0.0.1"))
        .tcp_port(1)
        .prefer_socket(false)
        .read_timeout(Some(Duration::from_secs(7)))
        .tcp_connect_timeout(Some(Duration::from_secs(1)))
        .pool_opts(mysql::PoolOpts::default().with_constraints(mysql::PoolConstraints::new(0, 2).unwrap()));
    let pool = mysql::Pool::new(opts).expect("a pool with no connection yet");
    let s = MySqlStore::builder_from_pool(pool).table(TABLE).build().expect("store");
    let started = Instant::now();
    let e = s.inspect("anything", T).unwrap_err();
    assert!(e.is_retryable(), "{e}");
    assert!(e.to_string().contains("127.0.0.1:1"), "{e}");
    assert!(started.elapsed() < T + Duration::from_secs(1), "{:?}", started.elapsed());
}

/// A pool without health checks hands out an idle connection the server
/// killed: the store's session reset on it fails, so the call fails
/// retryable (never fatal, never a wrong answer), the connection is thrown
/// away with its slot freed (the pool has one), and the next call runs on
/// a new session.
#[test]
fn an_idle_connection_the_server_killed_is_not_used() {
    let pool = pool(1, Some(Duration::from_secs(7)), false);
    let s = on(&pool);
    let name = format!("borrowed-killed-{}", random_tag());
    s.acquire(&name, "a", T, b"", T).unwrap();
    let id = pool.try_get_conn(Duration::from_secs(2)).unwrap().connection_id();
    admin(SHARED).query_drop(format!("KILL {id}")).unwrap();
    match s.inspect(&name, T) {
        Ok(lease) => assert!(lease.held_by("a"), "{lease:?}"),
        Err(e) => assert!(e.is_retryable(), "the call on the killed connection: {e}"),
    }
    let lease = s.inspect(&name, T).expect("the next call, on a new session");
    assert!(lease.held_by("a"), "{lease:?}");
    let next = pool.try_get_conn(Duration::from_secs(2)).expect("the slot was freed").connection_id();
    assert_ne!(next, id, "the killed session came back out of the pool");
}

/// A pool that sets no read timeout gets a warning (a checkout's health
/// check on a dead path could wait for TCP), once per store however many
/// calls it makes; a pool with one gets none (the control).
#[test]
fn a_pool_without_a_read_timeout_is_warned_about_once_per_store() {
    log::set_logger(&Capture).expect("the only logger in this binary");
    log::set_max_level(log::LevelFilter::Warn);
    let with = on(&pool(2, Some(Duration::from_secs(7)), true));
    for _ in 0..3 {
        with.inspect("x", T).ok();
    }
    assert_eq!(warnings_about_read_timeout(), 0, "a pool with a read timeout: {:?}", LOGGED.lock().unwrap());
    let bare = pool(2, None, true);
    let without = on(&bare);
    for _ in 0..3 {
        without.inspect("x", T).ok();
    }
    assert_eq!(warnings_about_read_timeout(), 1, "{:?}", LOGGED.lock().unwrap());
    let another = on(&bare);
    another.inspect("x", T).ok();
    assert_eq!(warnings_about_read_timeout(), 2, "a second store warns once too: {:?}", LOGGED.lock().unwrap());
}
