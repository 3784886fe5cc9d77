//! A Patroni-managed PostgreSQL pair under the chaos oracle (issue 34, item
//! 7): three participants reach the primary through one multi-host DSN with
//! `target_session_attrs=read-write` (`support/patroni.rs`), and Patroni
//! moves the primary under them three times: `patronictl switchover`,
//! `patronictl failover`, and a primary killed whole (Patroni and
//! PostgreSQL, SIGKILL), promoted once Patroni's leader key runs out. After
//! each, someone must lead again, and over the whole run no two guards may
//! be valid at once and fences must rise. Each event prints how long
//! nobody led (`chaos-patroni …` lines).
//!
//! Needs root, PostgreSQL, patroni and etcd-server: `bash scripts/test.sh`.

mod support;

use std::time::{Duration, Instant};

use leaderelection::postgres::PostgresStore;
use support::oracle::{Oracle, Participant};
use support::patroni::{Patroni, TTL};
use support::{random_tag, wait_for, TIMING};

/// Someone leads again within this of a move: Patroni's TTL (a killed
/// primary is noticed only then), a lease, and slack for the promotion and
/// reconnecting.
const AGAIN_WITHIN: Duration = Duration::from_secs(TTL.as_secs() + 20);

fn store(dsn: &str) -> PostgresStore {
    PostgresStore::builder(dsn)
        .table("public", "le_patroni")
        .pool_size(2)
        .connect_timeout(Duration::from_secs(1))
        .build()
        .expect("store")
}

/// Waits, after a move that started at `at`, for the oracle to see nobody
/// lead and then somebody again; returns how long nobody led (zero when a
/// leader kept its term through the move).
fn leaderless_after(oracle: &Oracle, at: Instant, what: &str, p: &Patroni, fleet: &[Participant]) -> Duration {
    // The leader may keep its term (the new primary has its renewals) or
    // lose it; either way somebody leads within the bound.
    let mut gap_from = None;
    let again = wait_for(AGAIN_WITHIN, || {
        let leads = oracle.leader_now().is_some();
        if !leads && gap_from.is_none() {
            gap_from = Some(Instant::now());
        }
        leads && (gap_from.is_some() || at.elapsed() > TIMING.lease_duration * 2)
    });
    assert!(
        again,
        "{what}: nobody led within {AGAIN_WITHIN:?}; oracle: {:?}; participants: {}\n{}",
        oracle.check().err(),
        statuses(fleet),
        p.logs()
    );
    gap_from.map_or(Duration::ZERO, |g| g.elapsed())
}

/// Each participant's status, for a failure's message.
fn statuses(fleet: &[Participant]) -> String {
    fleet.iter().map(|f| format!("{}: {}", f.id(), f.elector().status())).collect::<Vec<_>>().join(" | ")
}

/// A planned move (`patronictl switchover` or `failover`): it waits for
/// the replica to catch up, as an operator's would (asynchronous
/// replication: otherwise the new primary may lack even the table), then
/// moves the primary and prints how long nobody led.
fn planned_move(p: &Patroni, oracle: &Oracle, fleet: &[Participant], what: &str, move_it: fn(&Patroni) -> usize) {
    assert!(p.wait_caught_up(Duration::from_secs(20)), "{what}: the replica did not catch up\n{}", p.logs());
    let at = Instant::now();
    let to = move_it(p);
    assert!(p.wait_healthy(to, Duration::from_secs(60)), "{what} did not settle\n{}", p.logs());
    let gap = leaderless_after(oracle, at, what, p, fleet);
    eprintln!("chaos-patroni {what}: primary now n{}; nobody led for {:.0} ms", to + 1, gap.as_secs_f64() * 1e3);
}

#[test]
fn patroni_switchover_failover_and_a_killed_primary_keep_one_leader() {
    let began = Instant::now();
    let p = Patroni::start();
    eprintln!("chaos-patroni: etcd and two nodes up in {:.1} s", began.elapsed().as_secs_f64());
    store(&p.dsn()).ensure_schema().expect("ensure_schema");
    let name = format!("patroni-{}", random_tag());
    let oracle = Oracle::new(TIMING.lease_duration);
    let fleet: Vec<Participant> =
        (0..3).map(|k| Participant::start(&oracle, &format!("p{k}"), store(&p.dsn()), &name, TIMING)).collect();
    assert!(oracle.wait_leader(Duration::from_secs(20)).is_some(), "nobody led at first\n{}", p.logs());

    planned_move(&p, &oracle, &fleet, "switchover", Patroni::switchover);
    planned_move(&p, &oracle, &fleet, "failover", Patroni::failover);

    let at = Instant::now();
    let dead = p.primary().expect("a primary");
    p.kill(dead);
    // Nobody can lead until the replica is promoted: the gap runs from the
    // dead leader's deadline to a claim on the new primary.
    let (mut gap_from, mut promoted_after) = (None, None);
    let again = wait_for(AGAIN_WITHIN, || {
        if promoted_after.is_none() && p.primary() == Some(1 - dead) {
            promoted_after = Some(at.elapsed());
        }
        let leads = oracle.leader_now().is_some();
        if !leads && gap_from.is_none() {
            gap_from = Some(Instant::now());
        }
        leads && gap_from.is_some() && promoted_after.is_some()
    });
    assert!(again, "killed primary: nobody led again within {AGAIN_WITHIN:?}; {}\n{}", statuses(&fleet), p.logs());
    let (gap, promoted_after) = (gap_from.unwrap().elapsed(), promoted_after.unwrap());
    eprintln!(
        "chaos-patroni killed primary: n{} promoted {:.0} ms after the kill; nobody led for {:.0} ms",
        2 - dead,
        promoted_after.as_secs_f64() * 1e3,
        gap.as_secs_f64() * 1e3
    );

    for f in fleet {
        f.stop();
    }
    let report = oracle
        .check()
        .unwrap_or_else(|v| panic!("{}\n{}", v.iter().map(|v| v.to_string()).collect::<Vec<_>>().join("; "), p.logs()));
    eprintln!("chaos-patroni result [{:.1} s]: {report}", began.elapsed().as_secs_f64());
}
