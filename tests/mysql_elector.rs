//! Real electors over MariaDB. Run with `bash scripts/test.sh` (it exports
//! the URLs). Timings are those of the PostgreSQL elector tests (lease
//! 2.5 s, renew 400 ms, retry 300 ms, operation timeout 500 ms, margin
//! 250 ms).

mod mysql_support;

use std::sync::Once;
use std::time::{Duration, Instant};

use leaderelection::mysql::MySqlStore;
use leaderelection::{ElectionError, Elector};
use mysql_support::{admin, config, exec, port, random_tag, url, url_via, wait_for, Proxy, SHARED, TIMING};

const TABLE: &str = "le_elector";
const LEASE: Duration = TIMING.lease_duration;
const RENEW: Duration = TIMING.renew_interval;
const RETRY: Duration = TIMING.retry_period;
const MARGIN: Duration = TIMING.safety_margin;

fn store_on(u: &str, table: &str) -> MySqlStore {
    MySqlStore::builder(u).table(table).build().expect("store")
}

fn store() -> MySqlStore {
    let s = store_on(&url(SHARED), TABLE);
    s.ensure_schema().unwrap_or_else(|e| panic!("ensure_schema: {e}"));
    s
}

fn fleet(name: &str, n: usize, release: bool) -> Vec<Elector> {
    (0..n)
        .map(|i| {
            let c = config(store(), name, &format!("node-{i}")).payload(format!("https://node-{i}.internal"));
            Elector::start(c.release_on_shutdown(release)).expect("start")
        })
        .collect()
}

fn leaders(f: &[Elector]) -> Vec<usize> {
    (0..f.len()).filter(|&i| f[i].is_leader()).collect()
}

fn one_leader(f: &[Elector], within: Duration) -> usize {
    let mut found = None;
    let ok = wait_for(within, || {
        let l = leaders(f);
        found = (l.len() == 1).then(|| l[0]);
        found.is_some()
    });
    assert!(ok, "no single leader within {within:?}: leaders {:?}", leaders(f));
    found.unwrap()
}

#[test]
fn fleet_of_three_elects_exactly_one() {
    let name = format!("fleet-{}", random_tag());
    let f = fleet(&name, 3, true);
    let leader = one_leader(&f, Duration::from_secs(10));
    let until = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < until {
        let l = leaders(&f);
        assert!(l.len() <= 1, "two leaders at once: {l:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(leaders(&f), [leader], "leadership moved without a fault");
    let want = format!("https://node-{leader}.internal").into_bytes();
    for (i, e) in f.iter().enumerate().filter(|(i, _)| *i != leader) {
        let ok = wait_for(Duration::from_secs(5), || {
            e.status().leader.is_some_and(|l| l.identity == format!("node-{leader}") && l.payload == want && l.valid)
        });
        assert!(ok, "follower {i} did not see the leader's payload: {:?}", e.status().leader);
    }
    let st = f[leader].status();
    assert!(st.last_error.is_none(), "the leader had an error: {:?}", st.last_error);
}

/// A leader that stops without releasing (a crash) is replaced once its
/// lease runs out on the database, not before.
#[test]
fn crashed_leader_is_replaced_after_the_lease() {
    let name = format!("crash-{}", random_tag());
    let f = fleet(&name, 2, false);
    let leader = one_leader(&f, Duration::from_secs(10));
    let fence = f[leader].fence().unwrap();
    let crashed = Instant::now();
    f[leader].shutdown().expect("shutdown without release");
    let guard = f[1 - leader].wait_leader_timeout(LEASE + Duration::from_secs(3)).expect("no successor");
    let took = crashed.elapsed();
    eprintln!("mysql: crashed leader replaced after {took:?} (lease {LEASE:?})");
    assert!(guard.fence() > fence, "a takeover is a new term");
    assert!(took >= LEASE - RENEW - Duration::from_millis(300), "took over too early: {took:?}");
    assert!(took <= LEASE + RETRY + Duration::from_secs(1), "took over too late: {took:?}");
}

/// A clean shutdown releases: a follower takes over within about one retry
/// period.
#[test]
fn clean_shutdown_hands_over_within_a_retry_period() {
    let name = format!("handover-{}", random_tag());
    let f = fleet(&name, 2, true);
    let leader = one_leader(&f, Duration::from_secs(10));
    let fence = f[leader].fence().unwrap();
    let start = Instant::now();
    f[leader].shutdown().expect("shutdown releases");
    let guard = f[1 - leader].wait_leader_timeout(Duration::from_secs(3)).expect("no successor");
    let took = start.elapsed();
    eprintln!("mysql: clean shutdown handed over after {took:?} (retry period {RETRY:?})");
    assert!(guard.fence() > fence);
    assert!(took < RETRY + RETRY / 5 + Duration::from_millis(600), "handover took {took:?}");
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
    let name = format!("limited-{}", random_tag());
    let e = Elector::start(config(store_on(&u, TABLE), &name, "limited")).unwrap();
    let guard = e.wait_leader_timeout(Duration::from_secs(10));
    assert!(guard.is_ok(), "a SELECT/INSERT/UPDATE user could not lead: {:?}", e.status().last_error);
    let g = guard.unwrap();
    assert!(g.wait_lost_timeout(RENEW * 4).timed_out(), "lost the lease: {:?}", e.status().last_error);
    drop(g);
    let ddl = store_on(&u, &format!("le_nope_{}", random_tag())).ensure_schema();
    assert!(ddl.as_ref().is_err_and(|e| e.is_fatal()), "{ddl:?}");
}

/// A missing table is fatal: reported in status(), nobody leads, and once a
/// person creates it the fleet elects one.
#[test]
fn missing_table_is_fatal_and_reported() {
    let table = format!("le_missing_{}", random_tag());
    let name = format!("missing-{}", random_tag());
    let f: Vec<Elector> = (0..2)
        .map(|i| Elector::start(config(store_on(&url(SHARED), &table), &name, &format!("m{i}"))).unwrap())
        .collect();
    let reported = wait_for(Duration::from_secs(5), || {
        f.iter().all(|e| e.status().last_error.as_ref().is_some_and(ElectionError::is_fatal))
    });
    let errs: Vec<_> = f.iter().map(|e| e.status().last_error).collect();
    assert!(reported, "fatal error not reported: {errs:?}");
    let text = errs[0].as_ref().unwrap().to_string();
    assert!(text.contains("1146") && text.contains("doesn't exist"), "{text}");
    let until = Instant::now() + Duration::from_millis(500);
    while Instant::now() < until {
        assert!(leaders(&f).is_empty(), "someone leads without a table");
        std::thread::sleep(Duration::from_millis(20));
    }
    store_on(&url(SHARED), &table).ensure_schema().expect("create the table");
    let fixed = Instant::now();
    one_leader(&f, Duration::from_secs(10));
    eprintln!("mysql: a leader {:?} after the table was created", fixed.elapsed());
    drop(f);
    exec(&mut admin(SHARED), &format!("DROP TABLE `{table}`"));
}

/// Another session locks the election row: renewals give up within the
/// operation timeout, the leader steps down by its deadline, and leads again
/// once the lock is gone.
#[test]
fn locked_election_row_times_out_and_recovers() {
    let name = format!("lockrow-{}", random_tag());
    let e = Elector::start(config(store(), &name, "solo")).unwrap();
    let g = e.wait_leader_timeout(Duration::from_secs(10)).expect("leads");
    let fence = g.fence();
    let mut locker = admin(SHARED);
    exec(&mut locker, "START TRANSACTION");
    let key: String = name.bytes().map(|b| format!("{b:02x}")).collect();
    exec(&mut locker, &format!("SELECT * FROM {TABLE} WHERE name = X'{key}' FOR UPDATE"));
    let locked = Instant::now();
    let lost = g.wait_lost_timeout(LEASE + Duration::from_secs(1));
    let took = locked.elapsed();
    assert!(!lost.timed_out(), "still leading with its row locked for {took:?}");
    assert!(took <= LEASE, "stepped down after {took:?}, later than the lease");
    let err = e.status().last_error;
    assert!(err.is_some(), "no error reported while the row was locked");
    eprintln!("mysql: row locked, leader stepped down after {took:?}; last error: {}", err.unwrap());
    drop(g);
    exec(&mut locker, "ROLLBACK");
    let back = Instant::now();
    let g = e.wait_leader_timeout(Duration::from_secs(10)).expect("leads again once the lock is gone");
    eprintln!("mysql: led again {:?} after the lock went", back.elapsed());
    assert!(g.fence() > fence);
    drop(g);
    e.shutdown().unwrap();
}

/// The path starts swallowing packets under a leader: calls are abandoned at
/// the operation timeout without piling up, it steps down by its deadline,
/// and once the path heals it leads again on fresh connections.
#[test]
fn swallowing_path_steps_down_and_recovers() {
    store();
    let proxy = Proxy::start(port(SHARED));
    let s = MySqlStore::builder(&url_via(SHARED, "root", "127.0.0.1", proxy.port, ""))
        .table(TABLE)
        .connect_timeout(Duration::from_millis(500))
        .socket_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let name = format!("swallow-{}", random_tag());
    let e = Elector::start(config(s, &name, "behind-a-bad-path")).unwrap();
    let g = e.wait_leader_timeout(Duration::from_secs(10)).expect("leads");
    let fence = g.fence();
    proxy.swallow(true);
    let cut = Instant::now();
    assert!(!g.wait_lost_timeout(LEASE + Duration::from_secs(1)).timed_out(), "still leading with no path");
    let took = cut.elapsed();
    eprintln!("mysql: path cut, leader stepped down after {took:?}");
    assert!(took <= LEASE - MARGIN + Duration::from_millis(100), "stepped down late: {took:?}");
    drop(g);
    let until = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < until {
        let st = e.status();
        assert!(
            !matches!(st.last_error, Some(ElectionError::TooManyHungCalls { .. })),
            "store calls piled up: {:?}",
            st.last_error
        );
        assert!(proxy.open_connections() <= 5, "{} connections held open", proxy.open_connections());
        assert!(!st.is_leader);
        std::thread::sleep(Duration::from_millis(20));
    }
    proxy.swallow(false);
    let healed = Instant::now();
    let g = e.wait_leader_timeout(Duration::from_secs(10)).expect("leads again once the path heals");
    eprintln!("mysql: led again {:?} after the path healed", healed.elapsed());
    assert!(g.fence() > fence, "a new term after stepping down");
    drop(g);
    e.shutdown().unwrap();
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
    let proxy = Proxy::start(p);
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
