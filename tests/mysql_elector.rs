//! Real electors over MariaDB. Run with `bash scripts/test.sh` (it exports
//! the URLs). Timings are those of the PostgreSQL elector tests (lease
//! 2.5 s, renew 400 ms, retry 300 ms, operation timeout 500 ms, margin
//! 250 ms). The scenarios are those of tests/postgres_elector.rs, written
//! once in tests/support/elector.rs; this file adds what is MariaDB's own.

mod mysql_support;
mod support;

use std::sync::Once;
use std::time::Duration;

use leaderelection::mysql::MySqlStore;
use leaderelection::{ElectionError, Elector};
use mysql_support::{admin, exec, port, url, url_via, SHARED};
use support::elector as scenario;
use support::{config, random_tag, wait_for, Proxy, TIMING};

const TABLE: &str = "le_elector";
const LEASE: Duration = TIMING.lease_duration;

fn store_on(u: &str, table: &str) -> MySqlStore {
    MySqlStore::builder(u).table(table).build().expect("store")
}

fn store() -> MySqlStore {
    let s = store_on(&url(SHARED), TABLE);
    s.ensure_schema().unwrap_or_else(|e| panic!("ensure_schema: {e}"));
    s
}

#[test]
fn fleet_of_three_elects_exactly_one() {
    scenario::fleet_elects_exactly_one(store);
}

#[test]
fn crashed_leader_is_replaced_after_the_lease() {
    scenario::crashed_leader_is_replaced("mysql", store);
}

#[test]
fn clean_shutdown_hands_over_within_a_retry_period() {
    scenario::clean_shutdown_hands_over("mysql", store);
}

static LIMITED_USER: Once = Once::new();

/// A user with only SELECT, INSERT and UPDATE on the table can elect.
#[test]
fn user_with_select_insert_update_only_works() {
    store();
    LIMITED_USER.call_once(|| {
        let mut c = admin(SHARED);
        exec(&mut c, "CREATE USER IF NOT EXISTS 'le_limited'@'127.0.0.1'");
        exec(&mut c, &format!("GRANT SELECT, INSERT, UPDATE ON test.{TABLE} TO 'le_limited'@'127.0.0.1'"));
    });
    let u = url_via(SHARED, "le_limited", "127.0.0.1", port(SHARED), "");
    scenario::limited_login_works("user", TABLE, |t| store_on(&u, t), |t| store_on(&u, t).ensure_schema());
}

/// A missing table is fatal (error 1146).
#[test]
fn missing_table_is_fatal_and_reported() {
    scenario::missing_table_is_fatal(
        "mysql",
        |t| store_on(&url(SHARED), t),
        &["1146", "doesn't exist"],
        |t| store_on(&url(SHARED), t).ensure_schema().expect("create the table"),
        |t| exec(&mut admin(SHARED), &format!("DROP TABLE `{t}`")),
    );
}

/// The row (keyed by the election name's bytes) is locked by `SELECT ... FOR
/// UPDATE` in another session's open transaction.
#[test]
fn locked_election_row_times_out_and_recovers() {
    let (e, g) = scenario::locked_row(
        "mysql",
        store,
        |name| {
            let mut locker = admin(SHARED);
            exec(&mut locker, "START TRANSACTION");
            let key: String = name.bytes().map(|b| format!("{b:02x}")).collect();
            exec(&mut locker, &format!("SELECT * FROM {TABLE} WHERE name = X'{key}' FOR UPDATE"));
            locker
        },
        |mut locker| exec(&mut locker, "ROLLBACK"),
    );
    drop(g);
    e.shutdown().unwrap();
}

/// Behind the swallowing path the store also bounds each socket read and
/// write (`socket_timeout`).
#[test]
fn swallowing_path_steps_down_and_recovers() {
    store();
    let make = |p| {
        MySqlStore::builder(&url_via(SHARED, "root", "127.0.0.1", p, ""))
            .table(TABLE)
            .connect_timeout(Duration::from_millis(500))
            .socket_timeout(Duration::from_secs(1))
            .build()
            .unwrap()
    };
    scenario::swallowing_path("mysql", make, ("127.0.0.1", port(SHARED)));
}

/// Every log record, as text, from the moment [`capture`] is first called.
struct Capture(parking_lot::Mutex<Vec<String>>);

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, record: &log::Record<'_>) {
        self.0.lock().push(format!("{} {}: {}", record.level(), record.target(), record.args()));
    }
    fn flush(&self) {}
}

static CAPTURE: Capture = Capture(parking_lot::Mutex::new(Vec::new()));

fn capture() -> &'static Capture {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        log::set_logger(&CAPTURE).expect("no other logger in this binary");
        log::set_max_level(log::LevelFilter::Trace);
    });
    &CAPTURE
}

/// A password appears in no error, no `Debug` output and no log line (at
/// any level): a wrong password (1045), calls given up on behind a
/// swallowing path and the sessions the store then asks the server to end,
/// and URLs the store refuses. The logs are shown to hold those events, so
/// the check has something to look at.
#[test]
fn no_password_in_errors_debug_or_logs() {
    const SECRET: &str = "hunter2-Secret";
    let logs = capture();
    store();
    let mut c = admin(SHARED);
    exec(&mut c, &format!("CREATE USER IF NOT EXISTS 'le_secret'@'127.0.0.1' IDENTIFIED BY '{SECRET}'"));
    exec(&mut c, &format!("ALTER USER 'le_secret'@'127.0.0.1' IDENTIFIED BY '{SECRET}'"));
    exec(&mut c, &format!("GRANT SELECT, INSERT, UPDATE ON test.{TABLE} TO 'le_secret'@'127.0.0.1'"));
    let p = port(SHARED);
    let mut texts = Vec::new();

    // A wrong password: fatal, reported in status() and logged.
    let wrong = store_on(&format!("mysql://le_secret:{SECRET}-wrong@127.0.0.1:{p}/test"), TABLE);
    texts.push(format!("{wrong:?} {:?}", MySqlStore::builder(&format!("mysql://u:{SECRET}@h/db"))));
    let e = Elector::start(config(wrong, &format!("secret-{}", random_tag()), "wrong")).unwrap();
    let fatal =
        wait_for(Duration::from_secs(5), || e.status().last_error.as_ref().is_some_and(ElectionError::is_fatal));
    let st = e.status();
    assert!(fatal, "no fatal error for a wrong password: {st:?}");
    let err = st.last_error.clone().unwrap();
    texts.push(format!("{err} {err:?} {st:?}"));
    let mut source = std::error::Error::source(&err);
    while let Some(s) = source {
        texts.push(format!("{s} {s:?}"));
        source = s.source();
    }
    assert!(err.to_string().contains("1045"), "{err}");
    drop(e);

    // The right password behind a path that swallows: calls are given up
    // on and their sessions ended (or tried), all logged.
    let proxy = Proxy::start(("127.0.0.1", p));
    let s = MySqlStore::builder(&url_via(SHARED, &format!("le_secret:{SECRET}"), "127.0.0.1", proxy.port, ""))
        .table(TABLE)
        .connect_timeout(Duration::from_millis(500))
        .socket_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    texts.push(format!("{s:?}"));
    let e = Elector::start(config(s.clone(), &format!("secret-{}", random_tag()), "right")).unwrap();
    let g = e.wait_leader_timeout(Duration::from_secs(10)).expect("leads with the right password");
    proxy.swallow(true);
    assert!(!g.wait_lost_timeout(LEASE + Duration::from_secs(1)).timed_out(), "still leading with no path");
    drop(g);
    let st = e.status();
    texts.push(format!("{st:?} {s:?}"));
    proxy.swallow(false);
    e.shutdown().unwrap();

    // URLs refused before any connection.
    for u in [
        format!("mysql://u:{SECRET}@h/db?ssl-mode=PREFERRED"),
        format!("mysql://u:{SECRET}@h:port/db"),
        format!("mysql://u@h/db?password={SECRET}&stmt_cache_size=many"),
        format!("mysql://u:{SECRET}@h/db?danger_accept_invalid_certs=true"),
    ] {
        let err = MySqlStore::connect(&u).expect_err(&u);
        texts.push(format!("{err} {err:?}"));
    }

    let logged = logs.0.lock().clone();
    let all = logged.join("\n");
    assert!(all.contains("1045"), "the wrong password was not logged: {all}");
    assert!(all.contains("abandoned") || all.contains("no answer"), "no call given up on was logged: {all}");
    for t in texts.iter().chain(&logged) {
        assert!(!t.contains("hunter2"), "a password in: {t}");
    }
    eprintln!("mysql: {} log lines and {} errors and Debug outputs checked", logged.len(), texts.len());
}

/// A store picked from the URL by `leaderelection::connect`, boxed as a
/// `Box<dyn Store>`, elects as the concrete store does; a PostgreSQL DSN
/// names the feature this suite runs without.
#[test]
fn a_store_from_connect_in_a_box_elects() {
    let store = leaderelection::connect_table(&url(SHARED), Some(TABLE)).expect("connect");
    store.ensure_schema().expect("ensure_schema");
    let boxed: Box<dyn leaderelection::Store> = Box::new(store);
    let name = format!("connect-{}", random_tag());
    let e = Elector::start(config(boxed, &name, "a")).expect("start");
    assert!(e.wait_leader_timeout(Duration::from_secs(10)).is_ok(), "{}", e.status());
    e.shutdown().unwrap();
    let err = leaderelection::connect("postgres://app:hunter2@db.invalid/app").unwrap_err();
    assert!(err.is_fatal() && err.to_string().contains("feature `postgres`"), "{err}");
}
