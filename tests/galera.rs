//! The MySQL store on a MariaDB Galera cluster (issue 34): three nodes that
//! all take writes, started by the test (`support/galera.rs`), each
//! participant connected to a node of its own.
//!
//! **Racing claims.** Galera decides which of two conflicting transactions
//! on different nodes commits when the second is certified, at its
//! `COMMIT`, and rolls the other back. When the claims of one free election
//! reach every node at once, every claimant's statements see the row free
//! and claim it; only one `COMMIT` takes. The server reported the others'
//! failure (error 1213) only when the `COMMIT` ended the query: with
//! statements after it the error was lost, and a claimant whose claim was
//! rolled back was told it won. Each test here runs many such races and
//! requires at most one winner per election; the negative control (a store
//! that trusts the server's answer, as every store did) must show two.
//!
//! **Lease checks across nodes.** A checked transaction on one node and
//! the next term's claim on another. The single server's check (a shared
//! lock) holds nothing off across nodes, and the claim commits at once; so
//! does the multi-primary check's claim, but the two write one row of
//! `{table}_terms`, so the cluster rolls the checked transaction back
//! instead of committing it after the claim.
//!
//! **Clocks.** Every node reads its own clock. On a cluster whose second
//! node runs 4 s ahead and third 4 s behind (libfaketime), a leader renews
//! through one node and a contender runs on another whose clock is 4 s
//! ahead of it, with the chaos oracle sampling both guards: with the
//! store's skew bound (`max_clock_skew`) above the difference nobody claims
//! early; without it (the control) the contender leads while the leader's
//! guard is still valid.
//!
//! Needs root, MariaDB, Galera, rsync and faketime: `bash scripts/test.sh`
//! installs and runs everything.

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Barrier, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use leaderelection::mysql::MySqlStore;
use leaderelection::{Elector, Lease, Store, StoreError};
use mysql::prelude::Queryable;
use support::galera::{Galera, NodeOptions};
use support::oracle::{Oracle, Participant, Violation};
use support::{claim, config, random_tag, wait_for, TIMING};

const TTL: Duration = Duration::from_secs(30);
const CALL: Duration = Duration::from_secs(5);
/// Races per test: every one must have at most one winner.
const TRIALS: usize = 200;
/// How long the negative control may race to show two winners: about one
/// race in 100 of single claims had them when this was measured, one in
/// 200-300 of batched ones, and a race takes about 10 ms.
const CONTROL_FOR: Duration = Duration::from_secs(90);

/// One three-node cluster for the whole binary, with the election table.
fn cluster() -> &'static Galera {
    static CLUSTER: OnceLock<Galera> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        let g = Galera::start(3);
        eprintln!("galera: 3 nodes synced in {:.1} s", g.started_in.as_secs_f64());
        store(&g, 0, "").ensure_schema().expect("ensure_schema");
        g.settle(0);
        g
    })
}

const TABLE: &str = "galera_election";

/// A store on node `k`; `"control"` for the negative control's.
fn store(g: &Galera, k: usize, kind: &str) -> MySqlStore {
    let s = MySqlStore::builder(&g.url(k)).table(TABLE).pool_size(2).build().expect("store");
    if kind == "control" {
        s.__without_commit_check()
    } else {
        s
    }
}

/// What one race came to.
#[derive(Default, Debug)]
struct Tally {
    trials: usize,
    /// Races with more than one winner of one election.
    doubled: usize,
    /// Claims the store answered with an error (the commit check, a
    /// deadlock it gave up on): lost, never won.
    errors: usize,
    /// Errors that name the commit check.
    unseen: usize,
    first_doubled: Option<String>,
}

/// Races the claims of `per_race` fresh elections, each claimant on a node
/// of its own starting at one instant, single calls (`per_race == 1`) or
/// one batch each, until `trials` races ran, `within` passed, or (with
/// `stop_when_doubled`) one had two winners.
fn race(kind: &str, per_race: usize, trials: usize, within: Duration, stop_when_doubled: bool) -> Tally {
    let until = Instant::now() + within;
    let g = cluster();
    let stores: Vec<Arc<MySqlStore>> = (0..g.len()).map(|k| Arc::new(store(g, k, kind))).collect();
    let mut t = Tally::default();
    let tag = random_tag();
    for trial in 0..trials {
        if Instant::now() >= until {
            break;
        }
        let names: Vec<String> = (0..per_race).map(|e| format!("race-{tag}-{trial}-{e}")).collect();
        let start = Arc::new(Barrier::new(stores.len()));
        let answers: Vec<(usize, Vec<Result<Lease, StoreError>>)> = thread::scope(|s| {
            let handles: Vec<_> = stores
                .iter()
                .enumerate()
                .map(|(k, st)| {
                    let (start, names) = (Arc::clone(&start), &names);
                    s.spawn(move || {
                        let id = format!("p{k}");
                        start.wait();
                        (k, claim(&**st, &id, names, TTL, CALL))
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("a claimant panicked")).collect()
        });
        let mut winners: HashMap<usize, Vec<(usize, u64)>> = HashMap::new();
        for (k, answers) in &answers {
            for (e, a) in answers.iter().enumerate() {
                match a {
                    Ok(l) if l.held_by(&format!("p{k}")) => winners.entry(e).or_default().push((*k, l.fence)),
                    Ok(_) => {}
                    Err(err) => {
                        t.errors += 1;
                        t.unseen += usize::from(err.to_string().contains("did not commit"));
                    }
                }
            }
        }
        t.trials += 1;
        if let Some((e, w)) = winners.iter().find(|(_, w)| w.len() > 1) {
            t.doubled += 1;
            t.first_doubled.get_or_insert_with(|| format!("{}: winners (node, fence) {w:?}", names[*e]));
            if stop_when_doubled {
                break;
            }
        }
    }
    t
}

/// Single claims of one free election from all three nodes at once: at
/// most one winner, every time.
/// `per_race` elections raced `trials` times with the commit check: no
/// election has two winners; the figures are printed.
fn one_winner_each(what: &str, per_race: usize, trials: usize) {
    let began = Instant::now();
    let t = race("", per_race, trials, Duration::from_secs(3600), false);
    eprintln!(
        "galera racing {what}: {} races of {per_race}, {} with two winners of one; {} claims answered with an error, \
         {} of them by the commit check ({:.1} s)",
        t.trials,
        t.doubled,
        t.errors,
        t.unseen,
        began.elapsed().as_secs_f64()
    );
    assert_eq!(t.doubled, 0, "{what}: two winners of one election: {:?}", t.first_doubled);
}

#[test]
fn racing_claims_on_every_node_have_one_winner() {
    one_winner_each("claims", 1, TRIALS);
}

/// Batched claims (`acquire_many`, as a `Group` sends them) of ten free
/// elections from all three nodes at once: at most one winner each.
#[test]
fn racing_batch_claims_on_every_node_have_one_winner_each() {
    one_winner_each("batch claims", 10, TRIALS / 4);
}

/// The negative control: stores that count a claim as won once the server
/// answered without an error give two winners of one election, single
/// and batched, and the tally above catches it.
#[test]
fn trusting_the_servers_answer_is_caught() {
    let began = Instant::now();
    for (what, per_race) in [("single", 1), ("batched", 10)] {
        let t = race("control", per_race, usize::MAX, CONTROL_FOR, true);
        eprintln!(
            "galera control, {what} claims: caught, as it must be: {} after {} races ({} errors) ({:.1} s)",
            t.first_doubled.as_deref().unwrap_or("NOT CAUGHT"),
            t.trials,
            t.errors,
            began.elapsed().as_secs_f64()
        );
        assert!(t.doubled > 0, "{what}: no two winners in {} races without the commit check", t.trials);
    }
}

/// A store on node `k` that knows it is on a multi-primary cluster, or
/// (`single`) one told it is not: today's check and claims, the control.
fn check_store(g: &Galera, k: usize, single: bool) -> MySqlStore {
    let b = MySqlStore::builder(&g.url(k)).table(TABLE).pool_size(2);
    let b = if single { b.multi_primary(false) } else { b };
    b.build().expect("store")
}

/// What one checked transaction against the next claim came to.
#[derive(Debug)]
struct CheckedRace {
    /// The checked transaction's COMMIT, sent after the claim returned.
    commit: Result<(), mysql::Error>,
    /// The ledger's rows of the old term, read after both ended.
    committed_rows: usize,
}

/// A leader on node 1 checks its lease in its own transaction there and
/// writes a ledger row; then it stops without releasing (its guard was
/// valid at the check), its lease runs out, and a claimant on node 2 wins
/// the election with a large payload (its write set takes node 1 a while
/// to apply); the moment that claim returned, the checked transaction
/// commits. Committing there would be a write of the old term after the
/// new term's claim.
fn checked_write_against_the_next_claim(single: bool) -> CheckedRace {
    let g = cluster();
    let (s1, s2) = (check_store(g, 0, single), check_store(g, 1, single));
    let name = format!("checked-{}", random_tag());
    let ledger = format!("ledger_{}", random_tag());
    let mut c = mysql::Conn::new(mysql::Opts::from_url(&g.url(0)).unwrap()).expect("connect to node 1");
    c.query_drop(format!(
        "CREATE TABLE `{ledger}` (id INT AUTO_INCREMENT PRIMARY KEY, fence BIGINT NOT NULL) ENGINE = InnoDB"
    ))
    .unwrap();
    g.settle(0);
    let a = Elector::start(config(s1.clone(), &name, "a").release_on_shutdown(false)).expect("start");
    let guard = a.wait_leader_timeout(Duration::from_secs(15)).expect("a leads");
    let fence = guard.fence();
    let mut tx = c.start_transaction(mysql::TxOpts::default()).unwrap();
    s1.check_lease(&mut tx, &guard).expect("the check of a live term");
    tx.exec_drop(format!("INSERT INTO `{ledger}` (fence) VALUES (?)"), (fence,)).unwrap();
    drop(guard);
    a.shutdown().expect("shutdown");
    let payload = vec![b'p'; 4 << 20];
    let mut won = None;
    let claimed = wait_for(Duration::from_secs(10), || {
        match s2.acquire(&name, "b", TTL, &payload, CALL) {
            Ok(l) if l.held_by("b") => won = Some(l),
            _ => {}
        }
        won.is_some()
    });
    assert!(claimed, "node 2 never claimed the election after a's lease ran out");
    let commit = tx.commit();
    let committed_rows: usize = {
        g.settle(1);
        let mut r = mysql::Conn::new(mysql::Opts::from_url(&g.url(1)).unwrap()).unwrap();
        r.query_first(format!("SELECT COUNT(*) FROM `{ledger}` WHERE fence = {fence}")).unwrap().unwrap_or(0)
    };
    c.query_drop(format!("DROP TABLE `{ledger}`")).unwrap();
    CheckedRace { commit, committed_rows }
}

/// The multi-primary check: the checked transaction of the old term never
/// commits after the next term's claim (its COMMIT fails, 1213), in every
/// trial.
#[test]
fn a_checked_transaction_never_commits_after_the_next_claim_on_another_node() {
    let began = Instant::now();
    for trial in 0..3 {
        let r = checked_write_against_the_next_claim(false);
        eprintln!(
            "galera checked write, trial {trial}: commit {:?}, rows of the old term {}",
            r.commit.as_ref().map_err(|e| e.to_string()),
            r.committed_rows
        );
        assert!(
            r.commit.is_err() && r.committed_rows == 0,
            "trial {trial}: the old term's write committed after the next claim: {r:?}"
        );
        assert!(matches!(&r.commit, Err(mysql::Error::MySqlError(e)) if e.code == 1213), "{r:?}");
    }
    eprintln!("galera checked write: 3 of 3 refused ({:.1} s)", began.elapsed().as_secs_f64());
}

/// The negative control: today's check (a shared lock, which no other node
/// sees) lets the old term's write commit after the new term's claim, and
/// the test above would catch it.
#[test]
fn the_single_server_check_is_caught_across_nodes() {
    let began = Instant::now();
    let mut caught = 0;
    let mut trials = 0;
    while caught == 0 && trials < 5 {
        trials += 1;
        let r = checked_write_against_the_next_claim(true);
        eprintln!(
            "galera check control, trial {trials}: commit {:?}, rows of the old term {}",
            r.commit.as_ref().map_err(|e| e.to_string()),
            r.committed_rows
        );
        caught += usize::from(r.commit.is_ok() && r.committed_rows == 1);
    }
    eprintln!(
        "galera check control: caught, as it must be, in {caught} of {trials} trials ({:.1} s)",
        began.elapsed().as_secs_f64()
    );
    assert!(
        caught > 0,
        "the single-server check never let a write of the old term commit after the claim ({trials} trials)"
    );
}

/// The multi-primary check lets the holder's renewals through (it writes
/// no lease row) and answers for the term: held while the term is the
/// election's, refused with `LeaseLost` once another term claimed it.
#[test]
fn the_multi_primary_check_answers_for_the_term_and_lets_renewals_through() {
    let g = cluster();
    let s = check_store(g, 0, false);
    let name = format!("check-{}", random_tag());
    let e = Elector::start(config(s.clone(), &name, "a")).expect("start");
    let guard = e.wait_leader_timeout(Duration::from_secs(15)).expect("leads");
    let mut c = mysql::Conn::new(mysql::Opts::from_url(&g.url(0)).unwrap()).unwrap();
    let mut tx = c.start_transaction(mysql::TxOpts::default()).unwrap();
    s.check_lease(&mut tx, &guard).expect("the check of a live term");
    // While the checked transaction stays open, the holder renews.
    let renewals = e.status().renewals_ok;
    assert!(
        wait_for(Duration::from_secs(3), || e.status().renewals_ok >= renewals + 2),
        "renewals stopped behind the check"
    );
    tx.commit().expect("commit");
    let check = guard.lease_check().unwrap();
    let literal = s.lease_check_literal(&check).unwrap();
    assert!(literal.contains("_terms`") && literal.contains("ROW_COUNT()"), "{literal}");
    let sql = s.lease_check_sql_multi_primary().unwrap();
    assert!(sql.starts_with("UPDATE `galera_election_terms`"), "{sql}");
    let params = (name.as_bytes().to_vec(), b"a".to_vec(), guard.fence());
    drop(guard);
    e.shutdown().unwrap();
    // Released; another term claims it through node 2, and the old term's
    // check changes no row.
    let b = check_store(g, 1, false).acquire(&name, "b", TTL, b"", CALL).expect("claim");
    assert!(b.held_by("b"), "{b:?}");
    g.settle(1);
    let mut tx = c.start_transaction(mysql::TxOpts::default()).unwrap();
    let changed = tx.exec_iter(&sql, params).map(|r| r.affected_rows()).unwrap();
    assert_eq!(changed, 0, "the old term's check changed the terms row after the next claim");
    tx.rollback().unwrap();
}

/// A cluster whose second node's clock is 4 s ahead of the machine's and
/// third's 4 s behind.
fn skewed() -> &'static Galera {
    static CLUSTER: OnceLock<Galera> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        let g = Galera::start_with(&[NodeOptions::default(), NodeOptions::clock("+4s"), NodeOptions::clock("-4s")]);
        let at = |k: usize| -> i64 {
            let mut c = mysql::Conn::new(mysql::Opts::from_url(&g.url(k)).unwrap()).unwrap();
            c.query_first("SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))").unwrap().unwrap()
        };
        let (n1, n2, n3) = (at(0), at(1), at(2));
        eprintln!(
            "galera skewed: 3 nodes synced in {:.1} s; clocks against node 1: node 2 {:+.2} s, node 3 {:+.2} s",
            g.started_in.as_secs_f64(),
            (n2 - n1) as f64 / 1e6,
            (n3 - n1) as f64 / 1e6
        );
        assert!(
            (n2 - n1 - 4_000_000).abs() < 1_000_000 && (n3 - n1 + 4_000_000).abs() < 1_000_000,
            "libfaketime did not take"
        );
        MySqlStore::builder(&g.url(0)).table(TABLE).build().unwrap().ensure_schema().expect("ensure_schema");
        g.settle(0);
        g
    })
}

/// The skew bound the tests set: above the 4 s between the clocks.
const SKEW: Duration = Duration::from_millis(4500);

/// A leader renewing through node `leader` and a contender on node
/// `contender` (whose clock is 4 s ahead of the leader's node), judged by
/// the chaos oracle for three leases; then the leader is killed and the
/// contender must take over. `skew`: the stores' bound.
fn leader_and_contender(leader: usize, contender: usize, skew: Duration) -> Result<String, Vec<Violation>> {
    let g = skewed();
    let store = |k: usize| MySqlStore::builder(&g.url(k)).table(TABLE).max_clock_skew(skew).build().unwrap();
    let name = format!("skew-{}", random_tag());
    let oracle = Oracle::new(TIMING.lease_duration);
    let p0 = Participant::start(&oracle, "p0", store(leader), &name, TIMING);
    assert!(wait_for(Duration::from_secs(15), || p0.is_leader()), "p0 never led");
    let p1 = Participant::start(&oracle, "p1", store(contender), &name, TIMING);
    std::thread::sleep(TIMING.lease_duration * 3);
    let steady = oracle.leader_now();
    let killed = Instant::now();
    p0.crash();
    let took = wait_for(Duration::from_secs(20), || p1.is_leader()).then(|| killed.elapsed());
    std::thread::sleep(Duration::from_millis(300));
    p1.stop();
    let report = oracle.check()?;
    Ok(format!(
        "leader during the 3 leases {steady:?}; p1 led {} after the kill; {report}",
        took.map_or("never".into(), |t| format!("{:.0} ms", t.as_secs_f64() * 1e3))
    ))
}

/// With the skew bound set above the clocks' difference, a contender on a
/// node whose clock is 4 s ahead of the leader's (node 2 against node 1,
/// and node 1 against node 3) never leads early, and takes over once the
/// killed leader's lease has run out and the bound has passed.
#[test]
fn a_node_4s_ahead_claims_nothing_early_with_the_skew_bound() {
    for (leader, contender, what) in [(0, 1, "contender's node 4 s ahead"), (2, 0, "leader's node 4 s behind")] {
        let r = leader_and_contender(leader, contender, SKEW)
            .unwrap_or_else(|v| panic!("{what}: {}", v.iter().map(|v| v.to_string()).collect::<Vec<_>>().join("; ")));
        eprintln!("galera skew bound {SKEW:?}, {what}: {r}");
        assert!(r.contains("during the 3 leases Some(\"p0\")"), "{what}: the leader lost its term: {r}");
        assert!(!r.contains("led never"), "{what}: nobody took over: {r}");
    }
}

/// The negative control: without the bound the contender on the node
/// whose clock is ahead leads while the leader's guard is still valid, and
/// the oracle catches the overlap.
#[test]
fn without_the_skew_bound_a_node_ahead_claims_early_and_is_caught() {
    for (leader, contender, what) in [(0, 1, "contender's node 4 s ahead"), (2, 0, "leader's node 4 s behind")] {
        match leader_and_contender(leader, contender, Duration::ZERO) {
            Ok(r) => panic!("{what}: no overlap without the skew bound: {r}"),
            Err(v) => {
                assert!(v.iter().any(|v| matches!(v, Violation::Overlap { .. })), "{what}: {v:?}");
                eprintln!("galera skew control, {what}: caught, as it must be: {}", v[0]);
            }
        }
    }
}
