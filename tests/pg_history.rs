//! A PostgreSQL server's history is more than its timeline (issue 34, item
//! 4): rows that reach a server from elsewhere must count as inherited, so
//! that a claim never trusts an expiry the old server had since moved on.
//! Two cases, each on private servers under the chaos oracle, with a leader
//! whose acknowledged renewals the new server lacks and that is cut off at
//! the switch (so it keeps its guard until its own deadline), and a
//! contender on the new server:
//!
//! - **A logical-replication cutover**: the election table is published by
//!   server A and subscribed by server B (two `initdb` clusters, both on
//!   timeline 1); replication stops, the leader renews on A for a while
//!   longer, then the contender starts on B.
//! - **A restored snapshot**: a crash-consistent copy of the server's data
//!   directory is taken, the leader renews for a while longer, then the
//!   server is killed and the copy started in its place (same system
//!   identifier, same timeline after crash recovery).
//!
//! With the stamp `system/timeline/start` the contender holds the row for
//! nobody for a lease before it claims; the negative control stamps the
//! timeline alone, as before, and the contender leads while the leader's
//! guard is still valid.
//!
//! Needs root, PostgreSQL's server binaries: `bash scripts/test.sh`.

mod support;

use std::net::SocketAddr;
use std::thread::sleep;
use std::time::{Duration, Instant};

use leaderelection::postgres::PostgresStore;
use support::faults::{Fault, FaultProxy};
use support::oracle::{Oracle, Participant, Violation};
use support::pg_server::PgServer;
use support::{random_tag, wait_for, TIMING};

const TABLE: &str = "le_history";

/// How long the leader renews on the old server after the new one stopped
/// receiving its writes: the new server's copy of the row is this much
/// older than what the leader was told.
const LOST: Duration = Duration::from_millis(1500);

fn store(url: &str, control: bool) -> PostgresStore {
    let s = PostgresStore::builder(url)
        .table("public", TABLE)
        .pool_size(2)
        .connect_timeout(Duration::from_secs(2))
        .build()
        .expect("store");
    if control {
        s.__timeline_only_history()
    } else {
        s
    }
}

fn addr(pg: &PgServer) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], pg.port()))
}

/// What a run came to: the oracle's verdict and when the contender led.
struct Run {
    verdict: Result<String, Vec<Violation>>,
}

/// The leader `p0` on `old` through a fault proxy; `lose` stops the new
/// server from receiving writes; after [`LOST`] the leader's path goes
/// silent and `switch` makes `new` the server (its URL returned); the
/// contender `p1` starts there. Judged for two leases and a half after the
/// switch, then until the contender leads.
fn cut_over(old: &PgServer, control: bool, lose: impl FnOnce(), switch: impl FnOnce() -> String, what: &str) -> Run {
    let name = format!("history-{}", random_tag());
    let oracle = Oracle::new(TIMING.lease_duration);
    let proxy = FaultProxy::start(addr(old));
    let p0 = Participant::start(
        &oracle,
        "p0",
        store(&format!("postgres://postgres@127.0.0.1:{}/test", proxy.port()), control),
        &name,
        TIMING,
    );
    assert!(wait_for(Duration::from_secs(15), || p0.is_leader()), "{what}: p0 never led");
    sleep(TIMING.renew_interval * 2);
    lose();
    sleep(LOST);
    proxy.set(Fault::Blackhole);
    let switched = Instant::now();
    let url = switch();
    let p1 = Participant::start(&oracle, "p1", store(&url, control), &name, TIMING);
    let led = wait_for(TIMING.lease_duration * 4, || p1.is_leader()).then(|| switched.elapsed());
    // The cut-off leader's term ends at its own deadline, not at the kill.
    wait_for(TIMING.lease_duration, || !p0.is_leader());
    p0.crash();
    p1.stop();
    let verdict = oracle.check().map(|r| {
        format!(
            "p1 led {} after the switch; {r}",
            led.map_or("never".into(), |d| format!("{:.0} ms", d.as_secs_f64() * 1e3))
        )
    });
    Run { verdict }
}

/// Server A publishes the table, server B subscribes; replication is
/// disabled, A goes on taking renewals, then the contender starts on B.
fn logical_cutover(control: bool) -> Run {
    let (a, b) = (PgServer::start(), PgServer::start());
    a.sql("ALTER SYSTEM SET wal_level = logical");
    a.stop();
    a.start_again();
    for pg in [&a, &b] {
        store(&pg.url(), false).ensure_schema().expect("ensure_schema");
    }
    a.sql(&format!("CREATE PUBLICATION le_pub FOR TABLE public.{TABLE}"));
    b.sql(&format!(
        "CREATE SUBSCRIPTION le_sub CONNECTION 'host=127.0.0.1 port={} dbname=test user=postgres' PUBLICATION le_pub",
        a.port()
    ));
    let lose = || {
        // Everything so far reached B, then nothing more does.
        let terms = format!(
            "SELECT count(*)::text || ':' || coalesce(string_agg(holder || fence, ','), '') FROM public.{TABLE}"
        );
        let caught_up = wait_for(Duration::from_secs(10), || {
            let on_a = a.sql(&terms);
            on_a == b.sql(&terms) && !on_a[0].starts_with("0:")
        });
        assert!(
            caught_up,
            "the subscriber never received the leader's row; the publisher's log ends:\n{}\nthe subscriber's:\n{}",
            a.log_tail(),
            b.log_tail()
        );
        b.sql("ALTER SUBSCRIPTION le_sub DISABLE");
    };
    let run = cut_over(&a, control, lose, || b.url(), "logical cutover");
    b.sql("DROP SUBSCRIPTION le_sub");
    run
}

/// A crash-consistent snapshot of the server is taken, the server goes on
/// taking renewals, then it is killed and the snapshot started in its
/// place.
fn snapshot_restore(control: bool) -> Run {
    let pg = PgServer::start();
    store(&pg.url(), false).ensure_schema().expect("ensure_schema");
    let snap = std::cell::RefCell::new(None);
    let lose = || *snap.borrow_mut() = Some(pg.snapshot());
    let switch = || {
        pg.restore(snap.borrow().as_ref().expect("a snapshot"));
        pg.url()
    };
    cut_over(&pg, control, lose, switch, "snapshot restore")
}

fn violations(v: &[Violation]) -> String {
    v.iter().map(|v| v.to_string()).collect::<Vec<_>>().join("; ")
}

/// `run` with the full stamp: no overlap, and the contender leads.
fn no_two_leaders(what: &str, run: fn(bool) -> Run) {
    let report = run(false).verdict.unwrap_or_else(|v| panic!("{what}: {}", violations(&v)));
    eprintln!("pg history, {what}: {report}");
    assert!(!report.contains("led never"), "{what}: nobody led on the new server: {report}");
}

#[test]
fn a_logical_replication_subscriber_does_not_trust_the_publishers_rows() {
    no_two_leaders("logical cutover", logical_cutover);
}

#[test]
fn a_restored_snapshot_does_not_trust_its_own_rows() {
    no_two_leaders("snapshot restore", snapshot_restore);
}

/// The negative control: stamped with the timeline alone, the subscriber's
/// and the restored server's rows look native, and the contender leads
/// while the cut-off leader's guard is still valid.
#[test]
fn a_timeline_alone_is_caught_in_both() {
    for (what, run) in [("logical cutover", logical_cutover as fn(bool) -> Run), ("snapshot restore", snapshot_restore)]
    {
        match run(true).verdict {
            Ok(r) => panic!("{what}: no overlap with the timeline alone: {r}"),
            Err(v) => {
                assert!(v.iter().any(|v| matches!(v, Violation::Overlap { .. })), "{what}: {}", violations(&v));
                eprintln!("pg history control, {what}: caught, as it must be: {}", v[0]);
            }
        }
    }
}
