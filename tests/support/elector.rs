//! The scenarios both elector suites run (tests/postgres_elector.rs and
//! tests/mysql_elector.rs), each generic over the store: the suite passes a
//! factory for its store and keeps what only its server needs (roles and
//! users, locks, error codes, extra assertions) at the call site.
//!
//! `label` names the run in what the scenarios print (`LE_PG_DSN`,
//! `LE_PGBOUNCER_DSN`, `mysql`).

use std::net::ToSocketAddrs;
use std::time::{Duration, Instant};

use leaderelection::{ElectionError, Elector, LeaderGuard, Store, StoreError};

use super::{config, random_tag, wait_for, Proxy, TIMING};

const LEASE: Duration = TIMING.lease_duration;
const RENEW: Duration = TIMING.renew_interval;
const RETRY: Duration = TIMING.retry_period;
const MARGIN: Duration = TIMING.safety_margin;

/// `n` electors in election `name`, each on a store from `make`, member `i`
/// named `node-{i}` with payload `https://node-{i}.internal`.
pub fn fleet<S: Store + 'static>(make: &impl Fn() -> S, name: &str, n: usize, release: bool) -> Vec<Elector> {
    (0..n)
        .map(|i| {
            let c = config(make(), name, &format!("node-{i}")).payload(format!("https://node-{i}.internal"));
            Elector::start(c.release_on_shutdown(release)).expect("start")
        })
        .collect()
}

pub fn leaders(f: &[Elector]) -> Vec<usize> {
    (0..f.len()).filter(|&i| f[i].is_leader()).collect()
}

/// Waits until exactly one member leads; returns it.
pub fn one_leader(f: &[Elector], within: Duration) -> usize {
    let mut found = None;
    let ok = wait_for(within, || {
        let l = leaders(f);
        found = (l.len() == 1).then(|| l[0]);
        found.is_some()
    });
    assert!(ok, "no single leader within {within:?}: leaders {:?}", leaders(f));
    found.unwrap()
}

/// A fleet of three elects exactly one, keeps it across several renewals,
/// and the followers read its payload. Returns the fleet and its leader for
/// the caller's own checks.
pub fn fleet_elects_exactly_one<S: Store + 'static>(make: impl Fn() -> S) -> (Vec<Elector>, usize) {
    let name = format!("fleet-{}", random_tag());
    let f = fleet(&make, &name, 3, true);
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
            e.status().leader.is_some_and(|l| {
                leaderelection::base_identity(&l.identity) == format!("node-{leader}") && l.payload == want && l.valid
            })
        });
        assert!(ok, "follower {i} did not see the leader's payload: {:?}", e.status().leader);
    }
    let st = f[leader].status();
    assert!(st.last_error.is_none(), "the leader had an error: {:?}", st.last_error);
    (f, leader)
}

/// The leader of a fleet of two shuts down, releasing its lease or not
/// (`release`), and the other leads within `within`, under a new term (a
/// higher fence); returns how long after the shutdown it led. `what` names
/// the election and the messages.
fn leader_shuts_down<S: Store + 'static>(
    make: impl Fn() -> S, what: &str, release: bool, within: Duration,
) -> Duration {
    let name = format!("{what}-{}", random_tag());
    let f = fleet(&make, &name, 2, release);
    let leader = one_leader(&f, Duration::from_secs(10));
    let fence = f[leader].fence().unwrap();
    let start = Instant::now();
    f[leader].shutdown().unwrap_or_else(|e| panic!("{what}: shutdown (release: {release}): {e:?}"));
    let guard = f[1 - leader].wait_leader_timeout(within).unwrap_or_else(|e| panic!("{what}: no successor: {e:?}"));
    let took = start.elapsed();
    assert!(guard.fence() > fence, "{what}: a takeover is a new term: {fence} -> {}", guard.fence());
    took
}

/// A leader whose threads stop without releasing (a crash) is replaced once
/// its lease runs out on the database, not before.
pub fn crashed_leader_is_replaced<S: Store + 'static>(label: &str, make: impl Fn() -> S) {
    let took = leader_shuts_down(make, "crash", false, LEASE + Duration::from_secs(3));
    eprintln!("{label}: crashed leader replaced after {took:?} (lease {LEASE:?})");
    // It had to wait for the lease: it was renewed at most RENEW ago.
    assert!(took >= LEASE - RENEW - Duration::from_millis(300), "took over too early: {took:?}");
    assert!(took <= LEASE + RETRY + Duration::from_secs(1), "took over too late: {took:?}");
}

/// A clean shutdown releases the lease: a follower takes over within about
/// one retry period.
pub fn clean_shutdown_hands_over<S: Store + 'static>(label: &str, make: impl Fn() -> S) {
    let took = leader_shuts_down(make, "handover", true, Duration::from_secs(3));
    eprintln!("{label}: clean shutdown handed over after {took:?} (retry period {RETRY:?})");
    assert!(took < RETRY + RETRY / 5 + Duration::from_millis(600), "handover took {took:?}");
}

/// A login (`who`: "role", "user") with only SELECT, INSERT and UPDATE on
/// `table` leads and renews on a store from `make(table)`, and really is that
/// limited: `create(other table)` fails fatally.
pub fn limited_login_works<S: Store + 'static>(
    who: &str, table: &str, make: impl Fn(&str) -> S, create: impl FnOnce(&str) -> Result<(), StoreError>,
) {
    let name = format!("limited-{}", random_tag());
    let e = Elector::start(config(make(table), &name, "limited")).unwrap();
    let guard = e.wait_leader_timeout(Duration::from_secs(10));
    assert!(guard.is_ok(), "a SELECT/INSERT/UPDATE {who} could not lead: {:?}", e.status().last_error);
    let g = guard.unwrap();
    // It renews, too: still leading after several renew intervals.
    assert!(g.wait_lost_timeout(RENEW * 4).timed_out(), "lost the lease: {:?}", e.status().last_error);
    drop(g);
    // And the login really is limited: it cannot create tables.
    let ddl = create(&format!("le_nope_{}", random_tag()));
    assert!(ddl.as_ref().is_err_and(|e| e.is_fatal()), "{ddl:?}");
}

/// A missing table is fatal: reported in status() with an error whose text
/// holds every one of `mentions`, and nobody leads. Once a person creates it
/// (`create`), the fleet elects one; `drop_table` then removes it.
pub fn missing_table_is_fatal<S: Store + 'static>(
    label: &str, make: impl Fn(&str) -> S, mentions: &[&str], create: impl FnOnce(&str), drop_table: impl FnOnce(&str),
) {
    let table = format!("le_missing_{}", random_tag());
    let name = format!("missing-{}", random_tag());
    let f: Vec<Elector> =
        (0..2).map(|i| Elector::start(config(make(&table), &name, &format!("m{i}"))).unwrap()).collect();
    let reported = wait_for(Duration::from_secs(5), || {
        f.iter().all(|e| e.status().last_error.as_ref().is_some_and(ElectionError::is_fatal))
    });
    let errs: Vec<_> = f.iter().map(|e| e.status().last_error).collect();
    assert!(reported, "fatal error not reported: {errs:?}");
    let text = errs[0].as_ref().unwrap().to_string();
    assert!(mentions.iter().all(|m| text.contains(m)), "{text}");
    let until = Instant::now() + Duration::from_millis(500);
    while Instant::now() < until {
        assert!(leaders(&f).is_empty(), "someone leads without a table");
        std::thread::sleep(Duration::from_millis(20));
    }
    // A person fixes it (creates the table): the fleet elects one.
    create(&table);
    let fixed = Instant::now();
    one_leader(&f, Duration::from_secs(10));
    eprintln!("{label}: a leader {:?} after the table was created", fixed.elapsed());
    drop(f);
    drop_table(&table);
}

/// Another session locks the election row (`lock(name)`, undone by
/// `unlock`): the leader's renewals give up within the operation timeout, it
/// steps down by its deadline, and leads again once the lock is gone, on a new
/// term. Returns the elector and its new guard for the caller to end.
pub fn locked_row<S: Store + 'static, L>(
    label: &str, make: impl FnOnce() -> S, lock: impl FnOnce(&str) -> L, unlock: impl FnOnce(L),
) -> (Elector, LeaderGuard) {
    let name = format!("lockrow-{}", random_tag());
    let e = Elector::start(config(make(), &name, "solo")).unwrap();
    let g = e.wait_leader_timeout(Duration::from_secs(10)).expect("leads");
    let fence = g.fence();
    let held = lock(&name);
    let locked = Instant::now();
    let lost = g.wait_lost_timeout(LEASE + Duration::from_secs(1));
    let took = locked.elapsed();
    assert!(!lost.timed_out(), "still leading with its row locked for {took:?}");
    assert!(took <= LEASE, "stepped down after {took:?}, later than the lease");
    let err = e.status().last_error;
    assert!(err.is_some(), "no error reported while the row was locked");
    eprintln!("{label}: row locked, leader stepped down after {took:?}; last error: {}", err.unwrap());
    drop(g);
    unlock(held);
    let back = Instant::now();
    let g = e.wait_leader_timeout(Duration::from_secs(10)).expect("leads again once the lock is gone");
    eprintln!("{label}: led again {:?} after the lock went", back.elapsed());
    assert!(g.fence() > fence);
    (e, g)
}

/// The path to the database (a [`Proxy`] to `target`; `make(proxy port)`
/// builds the store on it) starts swallowing packets under a leader: its calls
/// are abandoned at the operation timeout (no hung calls pile up), it steps
/// down by its deadline, and once the path heals it leads again on fresh
/// connections.
pub fn swallowing_path<S: Store + 'static>(
    label: &str, make: impl FnOnce(u16) -> S, target: impl ToSocketAddrs + Clone + Send + 'static,
) {
    let proxy = Proxy::start(target);
    let s = make(proxy.port);
    let name = format!("swallow-{}", random_tag());
    let e = Elector::start(config(s, &name, "behind-a-bad-path")).unwrap();
    let g = e.wait_leader_timeout(Duration::from_secs(10)).expect("leads");
    let fence = g.fence();
    proxy.swallow(true);
    let cut = Instant::now();
    assert!(!g.wait_lost_timeout(LEASE + Duration::from_secs(1)).timed_out(), "still leading with no path");
    let took = cut.elapsed();
    eprintln!("{label}: path cut, leader stepped down after {took:?}");
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
    eprintln!("{label}: led again {:?} after the path healed", healed.elapsed());
    assert!(g.fence() > fence, "a new term after stepping down");
    drop(g);
    e.shutdown().unwrap();
}

/// Four participants under the chaos oracle (its watchers sample each
/// guard every ~0.25 ms), whose leader is crashed (stopped without a
/// release) `crashes` times: a successor leads each time within the lease
/// plus a few retry periods, and the oracle finds no overlap, no fence
/// that fails to increase and no validity past a lease. Returns the
/// oracle's report for the caller to print.
pub fn fleet_survives_leader_crashes<S: Store + 'static>(
    label: &str, make: impl Fn() -> S, crashes: usize,
) -> super::oracle::Report {
    use super::oracle::{Oracle, Participant};
    let name = format!("crashes-{}", random_tag());
    let oracle = Oracle::new(LEASE);
    let mut fleet: Vec<Participant> =
        (0..4).map(|i| Participant::start(&oracle, &format!("node-{i}"), make(), &name, TIMING)).collect();
    let bound = LEASE + 4 * RETRY + Duration::from_secs(1);
    for round in 0..=crashes {
        let took = oracle.wait_leader(bound);
        assert!(took.is_some(), "{label}: nobody led within {bound:?} (round {round})");
        // Hold it for a few renewals before the next crash.
        std::thread::sleep(3 * RENEW);
        if round == crashes {
            break;
        }
        let leader = fleet.iter().position(Participant::is_leader);
        let Some(leader) = leader else { continue };
        fleet.remove(leader).crash();
    }
    for p in fleet {
        p.stop();
    }
    let report = oracle.check().unwrap_or_else(|v| panic!("{label}: the oracle found violations: {v:#?}"));
    eprintln!("{label}: {report:?}");
    assert!(report.terms > crashes, "{label}: {} terms for {crashes} crashes: {report:?}", report.terms);
    report
}
