//! The database fails over under a running fleet (issue 18), on real
//! replicated servers started by the test (tests/support/pg_replica.rs,
//! maria_replica.rs): a PostgreSQL primary with a streaming standby, reached
//! through a multi-host DSN with `target_session_attrs=read-write`, and a
//! MariaDB primary with a replica, reached through one address that moves.
//! Three participants on one election, judged by the chaos suite's oracle
//! (no two valid guards at once, fences increasing, every term over within
//! a lease of its last confirmed send); each scenario also states how soon
//! someone leads again.
//!
//! - `kill`: the primary is killed and the standby promoted at once
//!   (asynchronous, and synchronous or semi-synchronous replication).
//! - `switchover`: a clean one.
//! - `lost_renewals`: replication is cut, the leader renews for 3 s on the
//!   old primary alone (every renewal acknowledged, none replicated), then
//!   it is cut off from the database and the primary is killed and the
//!   standby promoted. The row there expired long ago while the leader was
//!   told its lease runs on. With the failover rule nobody claims it until
//!   the leader's deadline has passed; the negative control (stores that
//!   claim inherited rows at once) must show two leaders.
//!
//! Run with `bash scripts/test.sh` (it needs root and the servers'
//! binaries; it prints `chaos-failover …` figures).

mod support;

use std::sync::Arc;
use std::thread::sleep;
use std::time::{Duration, Instant};

use leaderelection::mysql::MySqlStore;
use leaderelection::postgres::PostgresStore;
use leaderelection::Store;
use support::maria_replica::{MariaMode, MariaPair};
use support::oracle::{Cut, Oracle, Participant, Switch, Violation};
use support::pg_replica::{PgMode, PgPair};
use support::{random_tag, TIMING};

const LEASE: Duration = TIMING.lease_duration;
const FLEET: usize = 3;
/// How long the leader renews on the old primary alone.
const CUT_FOR: Duration = Duration::from_secs(3);
/// Someone leads again within this after a failover: promotion (at most
/// 1 s here), a lease the inherited row may still run on the new server,
/// a lease it is held for nobody, a retry period and two operation
/// timeouts, and 1 s for this loaded machine.
const RECOVERY: Duration = Duration::from_millis(
    1000 + 2 * TIMING.lease_duration.as_millis() as u64
        + TIMING.retry_period.as_millis() as u64
        + 2 * TIMING.operation_timeout.as_millis() as u64
        + 1000,
);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Kill,
    Switchover,
    LostRenewals,
}

/// One replicated pair, whichever the database.
enum Pair {
    Pg(PgPair),
    Maria(MariaPair),
}

impl Pair {
    fn label(&self) -> &'static str {
        match self {
            Pair::Pg(p) if p.mode() == PgMode::Sync => "postgres-sync",
            Pair::Pg(_) => "postgres-async",
            Pair::Maria(p) if p.mode() == MariaMode::SemiSync => "mariadb-semisync",
            Pair::Maria(_) => "mariadb-async",
        }
    }

    fn store(&self, table: &str, rule: bool) -> Box<dyn Fn() -> Arc<dyn Store>> {
        match self {
            Pair::Pg(p) => {
                let s = PostgresStore::builder(&p.dsn()).table("public", table).build().expect("store");
                s.ensure_schema().expect("ensure_schema");
                let s = if rule { s } else { s.__without_failover_rule() };
                Box::new(move || Arc::new(s.clone()) as Arc<dyn Store>)
            }
            Pair::Maria(p) => {
                let s = MySqlStore::builder(&p.url()).table(table).build().expect("store");
                s.ensure_schema().expect("ensure_schema");
                let s = if rule { s } else { s.__without_failover_rule() };
                Box::new(move || Arc::new(s.clone()) as Arc<dyn Store>)
            }
        }
    }

    /// Waits until the replica has applied everything the primary wrote
    /// so far; panics after `within`.
    fn wait_caught_up(&self, within: Duration) {
        let caught_up = match self {
            Pair::Pg(p) => p.wait_caught_up(within),
            Pair::Maria(p) => p.wait_caught_up(within),
        };
        assert!(caught_up, "{}: the replica did not catch up within {within:?}", self.label());
    }

    fn cut_replication(&self) {
        match self {
            Pair::Pg(p) => p.cut_replication(),
            Pair::Maria(p) => p.cut_replication(),
        }
    }

    /// Kills the primary and promotes the other; returns how long the
    /// promotion took.
    fn fail_over(&self) -> Duration {
        match self {
            Pair::Pg(p) => {
                p.kill_primary();
                p.promote_standby()
            }
            Pair::Maria(p) => {
                p.kill_primary();
                let took = p.promote_replica();
                p.move_address();
                took
            }
        }
    }

    fn switchover(&self) -> Duration {
        match self {
            Pair::Pg(p) => p.switchover(),
            Pair::Maria(p) => p.switchover(),
        }
    }
}

/// Runs one scenario; returns the oracle's verdict and the leaderless time
/// after the failover.
fn scenario(pair: &Pair, kind: Kind, rule: bool) -> (Result<(), Vec<Violation>>, Duration) {
    let label = format!("{}/{kind:?}{}", pair.label(), if rule { "" } else { "/control" });
    let table = format!("le_failover_{}", random_tag());
    let make = pair.store(&table, rule);
    let name = format!("failover-{}", random_tag());
    let oracle = Oracle::new(LEASE);
    let switches: Vec<Switch<Arc<dyn Store>>> = (0..FLEET).map(|_| Switch::new(make())).collect();
    let fleet: Vec<Participant> =
        (0..FLEET).map(|i| Participant::start(&oracle, &format!("p{i}"), switches[i].clone(), &name, TIMING)).collect();
    assert!(oracle.wait_leader(Duration::from_secs(15)).is_some(), "{label}: nobody led at the start");
    let leader = fleet.iter().position(Participant::is_leader).expect("a leader");
    // The election must exist on the replica before the fault: a row
    // created less than the replication lag before a failover, and lost
    // with it, looks like an election that never existed and is claimed at
    // once (the documented limit, docs/design.md "Database failover"). CI
    // met it once on MariaDB, killing the primary a few milliseconds after
    // the first claim: the first leader and the new primary's claimant
    // overlapped for 110 ms. These scenarios are about a running leader.
    pair.wait_caught_up(Duration::from_secs(10));
    let began;
    let promoted = match kind {
        Kind::Kill => {
            began = Instant::now();
            pair.fail_over()
        }
        Kind::Switchover => {
            began = Instant::now();
            pair.switchover()
        }
        Kind::LostRenewals => {
            pair.cut_replication();
            sleep(CUT_FOR);
            assert!(fleet[leader].is_leader(), "{label}: the leader stopped leading while its primary was up");
            switches[leader].cut(Cut::Fail);
            began = Instant::now();
            pair.fail_over()
        }
    };
    // Someone leads through the new primary (with a guard granted by it, or
    // the old leader carrying on).
    let led = wait_for_leader_after(&oracle, began, RECOVERY);
    // Let any overlap play out: the old leader's deadline, and a lease more.
    sleep(LEASE * 2);
    for p in fleet {
        p.stop();
    }
    let verdict = oracle.check().map(drop);
    let leaderless = led.unwrap_or(RECOVERY);
    eprintln!(
        "chaos-failover {label}: promoted in {} ms; led under a term confirmed by the new primary {} ms after the failover began{}; verdict {}",
        promoted.as_millis(),
        leaderless.as_millis(),
        if led.is_none() { " (nobody led within the bound)" } else { "" },
        match &verdict {
            Ok(()) => "ok".to_owned(),
            Err(v) => format!("{} violations, first: {}", v.len(), v[0]),
        }
    );
    assert!(led.is_some() || !rule, "{label}: nobody led within {RECOVERY:?} of the failover");
    (verdict, leaderless)
}

/// How long after `began` until someone leads under a term confirmed after
/// it (a guard renewed or granted through the new primary), or `None`.
fn wait_for_leader_after(oracle: &Oracle, began: Instant, within: Duration) -> Option<Duration> {
    let deadline = began + within;
    loop {
        let confirmed = oracle.calls().iter().any(|c| c.sent >= began && c.confirmed);
        if confirmed && oracle.leader_now().is_some() {
            return Some(began.elapsed());
        }
        if Instant::now() >= deadline {
            return None;
        }
        sleep(Duration::from_millis(5));
    }
}

fn pg(mode: PgMode) -> Pair {
    Pair::Pg(PgPair::start(mode))
}

fn maria(mode: MariaMode) -> Pair {
    Pair::Maria(MariaPair::start(mode))
}

/// The failover rule's negative control: the same lost renewals with a
/// store that claims inherited rows as they stand must show two leaders.
fn control_is_caught(pair: &Pair) {
    let (verdict, _) = scenario(pair, Kind::LostRenewals, false);
    let v = verdict.expect_err("the control that claims inherited rows showed no second leader");
    assert!(v.iter().any(|v| matches!(v, Violation::Overlap { .. })), "{v:?}");
}

/// One test per row: the scenario `kind` on a new `pair`, which the oracle
/// must pass (the scenario's messages name the pair and the kind).
macro_rules! failovers {
    ($($test:ident: $pair:expr, $kind:expr;)*) => {$(
        #[test]
        fn $test() {
            scenario(&$pair, $kind, true).0.expect("no violation");
        }
    )*};
}

failovers! {
    postgres_primary_killed_standby_promoted: pg(PgMode::Async), Kind::Kill;
    postgres_switchover: pg(PgMode::Async), Kind::Switchover;
    postgres_lost_renewals_keep_one_leader: pg(PgMode::Async), Kind::LostRenewals;
    mariadb_primary_killed_replica_promoted: maria(MariaMode::Async), Kind::Kill;
    mariadb_switchover: maria(MariaMode::Async), Kind::Switchover;
    mariadb_lost_renewals_keep_one_leader: maria(MariaMode::Async), Kind::LostRenewals;
    postgres_synchronous_primary_killed_standby_promoted: pg(PgMode::Sync), Kind::Kill;
    mariadb_semisync_primary_killed_replica_promoted: maria(MariaMode::SemiSync), Kind::Kill;
}

#[test]
fn postgres_lost_renewals_control_claims_inherited_rows_and_is_caught() {
    control_is_caught(&pg(PgMode::Async));
}

#[test]
fn mariadb_lost_renewals_control_claims_inherited_rows_and_is_caught() {
    control_is_caught(&maria(MariaMode::Async));
}
