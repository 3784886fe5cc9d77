//! Real electors over PostgreSQL, directly and through PgBouncer in
//! transaction mode. Run with `bash scripts/test.sh` (it exports the DSNs).
//!
//! Timings are short (lease 2.5 s) and satisfy the invariant
//! `renew 400 ms + 2*timeout 500 ms + retry delay 100 ms <= lease 2.5 s - margin 250 ms`.

mod pg_support;

use std::sync::Once;
use std::time::{Duration, Instant};

use leaderelection::postgres::PostgresStore;
use leaderelection::{ElectionError, Elector};
use pg_support::{client, config, dsn, dsn_via, host_port, random_tag, wait_for, Proxy, BOUNCER, DIRECT, TIMING};

const TABLE: &str = "le_elector";
const LEASE: Duration = TIMING.lease_duration;
const RENEW: Duration = TIMING.renew_interval;
const RETRY: Duration = TIMING.retry_period;
const MARGIN: Duration = TIMING.safety_margin;

fn store_on(d: &str, table: &str) -> PostgresStore {
    PostgresStore::builder(d).table("public", table).build().expect("store")
}

fn store(var: &str) -> PostgresStore {
    let s = store_on(&dsn(var), TABLE);
    s.ensure_schema().unwrap_or_else(|e| panic!("ensure_schema via {var}: {e}"));
    s
}

fn fleet(var: &str, name: &str, n: usize, release: bool) -> Vec<Elector> {
    (0..n)
        .map(|i| {
            let c = config(store(var), name, &format!("node-{i}")).payload(format!("https://node-{i}.internal"));
            Elector::start(c.release_on_shutdown(release)).expect("start")
        })
        .collect()
}

fn leaders(f: &[Elector]) -> Vec<usize> {
    (0..f.len()).filter(|&i| f[i].is_leader()).collect()
}

/// Waits until exactly one member leads; returns it.
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

fn fleet_elects_exactly_one(var: &str) {
    let name = format!("fleet-{}", random_tag());
    let f = fleet(var, &name, 3, true);
    let leader = one_leader(&f, Duration::from_secs(10));
    // Across several renewals, never two leaders at once.
    let until = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < until {
        let l = leaders(&f);
        assert!(l.len() <= 1, "two leaders at once: {l:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(leaders(&f), [leader], "leadership moved without a fault");
    // Followers read the leader's payload.
    let want = format!("https://node-{leader}.internal").into_bytes();
    for (i, e) in f.iter().enumerate().filter(|(i, _)| *i != leader) {
        let ok = wait_for(Duration::from_secs(5), || {
            e.status().leader.is_some_and(|l| l.identity == format!("node-{leader}") && l.payload == want && l.valid)
        });
        assert!(ok, "follower {i} did not see the leader's payload: {:?}", e.status().leader);
    }
    let st = f[leader].status();
    assert!(st.last_error.is_none(), "the leader had an error: {:?}", st.last_error);
    assert_eq!(st.fence, f[leader].fence());
}

#[test]
fn fleet_of_three_elects_exactly_one_direct() {
    fleet_elects_exactly_one(DIRECT);
}

#[test]
fn fleet_of_three_elects_exactly_one_pgbouncer() {
    fleet_elects_exactly_one(BOUNCER);
}

/// A leader whose threads stop without releasing (a crash) is replaced once
/// its lease runs out on the database, not before.
fn crashed_leader_is_replaced(var: &str) {
    let name = format!("crash-{}", random_tag());
    let f = fleet(var, &name, 2, false);
    let leader = one_leader(&f, Duration::from_secs(10));
    let fence = f[leader].fence().unwrap();
    let crashed = Instant::now();
    f[leader].shutdown().expect("shutdown without release");
    let other = &f[1 - leader];
    let guard = other.wait_leader_timeout(LEASE + Duration::from_secs(3)).expect("no successor after the lease");
    let took = crashed.elapsed();
    eprintln!("{var}: crashed leader replaced after {took:?} (lease {LEASE:?})");
    assert!(guard.fence() > fence, "a takeover is a new term: {fence} -> {}", guard.fence());
    // It had to wait for the lease: it was renewed at most RENEW ago.
    assert!(took >= LEASE - RENEW - Duration::from_millis(300), "took over too early: {took:?}");
    assert!(took <= LEASE + RETRY + Duration::from_secs(1), "took over too late: {took:?}");
}

#[test]
fn crashed_leader_is_replaced_after_the_lease_direct() {
    crashed_leader_is_replaced(DIRECT);
}

#[test]
fn crashed_leader_is_replaced_after_the_lease_pgbouncer() {
    crashed_leader_is_replaced(BOUNCER);
}

/// A clean shutdown releases the lease: a follower takes over within about
/// one retry period.
fn clean_shutdown_hands_over(var: &str) {
    let name = format!("handover-{}", random_tag());
    let f = fleet(var, &name, 2, true);
    let leader = one_leader(&f, Duration::from_secs(10));
    let fence = f[leader].fence().unwrap();
    let start = Instant::now();
    f[leader].shutdown().expect("shutdown releases");
    let guard = f[1 - leader].wait_leader_timeout(Duration::from_secs(3)).expect("no successor");
    let took = start.elapsed();
    eprintln!("{var}: clean shutdown handed over after {took:?} (retry period {RETRY:?})");
    assert!(guard.fence() > fence, "{fence} -> {}", guard.fence());
    assert!(took < RETRY + RETRY / 5 + Duration::from_millis(600), "handover took {took:?}");
}

#[test]
fn clean_shutdown_hands_over_within_a_retry_period_direct() {
    clean_shutdown_hands_over(DIRECT);
}

#[test]
fn clean_shutdown_hands_over_within_a_retry_period_pgbouncer() {
    clean_shutdown_hands_over(BOUNCER);
}

static LIMITED_ROLE: Once = Once::new();

/// A role with only SELECT, INSERT and UPDATE on the table can elect.
fn limited_role_works(var: &str) {
    store(DIRECT);
    LIMITED_ROLE.call_once(|| {
        client(DIRECT)
            .batch_execute(&format!(
                "DO $$BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'le_limited') \
                 THEN CREATE ROLE le_limited LOGIN; END IF; END$$; \
                 REVOKE ALL ON public.{TABLE} FROM le_limited; \
                 GRANT SELECT, INSERT, UPDATE ON public.{TABLE} TO le_limited;"
            ))
            .expect("create the limited role");
    });
    let (host, port) = host_port(var);
    let d = dsn_via(var, &host, port, Some("le_limited"), "");
    let name = format!("limited-{}", random_tag());
    let e = Elector::start(config(store_on(&d, TABLE), &name, "limited")).unwrap();
    let guard = e.wait_leader_timeout(Duration::from_secs(10));
    assert!(guard.is_ok(), "a SELECT/INSERT/UPDATE role could not lead: {:?}", e.status().last_error);
    let g = guard.unwrap();
    // It renews, too: still leading after several renew intervals.
    assert!(g.wait_lost_timeout(RENEW * 4).timed_out(), "lost the lease: {:?}", e.status().last_error);
    // And the role really is limited: it cannot create tables.
    let ddl = store_on(&d, &format!("le_nope_{}", random_tag())).ensure_schema();
    assert!(ddl.as_ref().is_err_and(|e| e.is_fatal()), "{ddl:?}");
}

#[test]
fn role_with_select_insert_update_only_works_direct() {
    limited_role_works(DIRECT);
}

#[test]
fn role_with_select_insert_update_only_works_pgbouncer() {
    limited_role_works(BOUNCER);
}

/// A missing table is fatal: reported in status(), and nobody leads.
fn missing_table_is_fatal(var: &str) {
    let table = format!("le_missing_{}", random_tag());
    let name = format!("missing-{}", random_tag());
    let f: Vec<Elector> =
        (0..2).map(|i| Elector::start(config(store_on(&dsn(var), &table), &name, &format!("m{i}"))).unwrap()).collect();
    let reported = wait_for(Duration::from_secs(5), || {
        f.iter().all(|e| e.status().last_error.as_ref().is_some_and(ElectionError::is_fatal))
    });
    let errs: Vec<_> = f.iter().map(|e| e.status().last_error).collect();
    assert!(reported, "fatal error not reported: {errs:?}");
    let text = errs[0].as_ref().unwrap().to_string();
    assert!(text.contains("does not exist") && text.contains("42P01"), "{text}");
    let until = Instant::now() + Duration::from_millis(500);
    while Instant::now() < until {
        assert!(leaders(&f).is_empty(), "someone leads without a table");
        std::thread::sleep(Duration::from_millis(20));
    }
    // A person fixes it (creates the table): the fleet elects one.
    store_on(&dsn(DIRECT), &table).ensure_schema().expect("create the table");
    let fixed = Instant::now();
    one_leader(&f, Duration::from_secs(10));
    eprintln!("{var}: a leader {:?} after the table was created", fixed.elapsed());
    drop(f);
    client(DIRECT).batch_execute(&format!("DROP TABLE public.\"{table}\"")).unwrap();
}

#[test]
fn missing_table_is_fatal_and_reported_direct() {
    missing_table_is_fatal(DIRECT);
}

#[test]
fn missing_table_is_fatal_and_reported_pgbouncer() {
    missing_table_is_fatal(BOUNCER);
}

/// Another session locks the election row: the leader's renewals give up
/// within the operation timeout, it steps down by its deadline, and leads
/// again once the lock is gone.
fn locked_row(var: &str) {
    let name = format!("lockrow-{}", random_tag());
    let e = Elector::start(config(store(var), &name, "solo")).unwrap();
    let again = e.wait_leader_timeout(Duration::from_secs(10)).expect("leads");
    let fence2 = again.fence();
    let mut locker = client(var);
    let mut tx = locker.transaction().unwrap();
    tx.batch_execute(&format!("SELECT * FROM {TABLE} WHERE name = '{name}' FOR UPDATE")).unwrap();
    let locked = Instant::now();
    let lost = again.wait_lost_timeout(LEASE + Duration::from_secs(1));
    let took = locked.elapsed();
    assert!(!lost.timed_out(), "still leading with its row locked for {took:?}");
    assert!(took <= LEASE, "stepped down after {took:?}, later than the lease");
    let err = e.status().last_error;
    assert!(err.is_some(), "no error reported while the row was locked");
    eprintln!("{var}: row locked, leader stepped down after {took:?}; last error: {}", err.unwrap());
    drop(again);
    tx.rollback().unwrap();
    let back = Instant::now();
    let g = e.wait_leader_timeout(Duration::from_secs(10)).expect("leads again once the lock is gone");
    eprintln!("{var}: led again {:?} after the lock went", back.elapsed());
    assert!(g.fence() > fence2);
    e.shutdown().unwrap();
}

#[test]
fn locked_election_row_times_out_and_recovers_direct() {
    locked_row(DIRECT);
}

#[test]
fn locked_election_row_times_out_and_recovers_pgbouncer() {
    locked_row(BOUNCER);
}

/// The path to the database starts swallowing packets under a leader: its
/// calls are abandoned at the operation timeout (no hung calls pile up), it
/// steps down by its deadline, and once the path heals it leads again on
/// fresh connections.
fn swallowing_path(var: &str) {
    store(var);
    let proxy = Proxy::start(host_port(var));
    let d = dsn_via(var, "127.0.0.1", proxy.port, None, "");
    let s =
        PostgresStore::builder(&d).table("public", TABLE).connect_timeout(Duration::from_millis(500)).build().unwrap();
    let name = format!("swallow-{}", random_tag());
    let e = Elector::start(config(s, &name, "behind-a-bad-path")).unwrap();
    let g = e.wait_leader_timeout(Duration::from_secs(10)).expect("leads");
    let fence = g.fence();
    proxy.swallow(true);
    let cut = Instant::now();
    assert!(!g.wait_lost_timeout(LEASE + Duration::from_secs(1)).timed_out(), "still leading with no path");
    let took = cut.elapsed();
    eprintln!("{var}: path cut, leader stepped down after {took:?}");
    assert!(took <= LEASE - MARGIN + Duration::from_millis(100), "stepped down late: {took:?}");
    drop(g);
    // Keep the path cut a while: calls keep being abandoned at the timeout,
    // never piling up (no TooManyHungCalls) and never holding more than the
    // pool's connections.
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
    eprintln!("{var}: led again {:?} after the path healed", healed.elapsed());
    assert!(g.fence() > fence, "a new term after stepping down");
    drop(g);
    e.shutdown().unwrap();
}

#[test]
fn swallowing_path_steps_down_and_recovers_direct() {
    swallowing_path(DIRECT);
}

#[test]
fn swallowing_path_steps_down_and_recovers_pgbouncer() {
    swallowing_path(BOUNCER);
}
