//! Chaos evidence for lease-checked writes (issue 17): a fleet of three
//! worker processes (this test binary run again, see
//! `ledger_support/worker.rs`) in one election, whose leader writes ledger
//! rows, one per transaction, each stamped with its term's fence and, as
//! the last statement before `COMMIT`, with a number from a one-row clock
//! whose row lock is held to the commit, so that stamps give the commit
//! order exactly. Each worker reaches the database through a fault proxy
//! of its own, owned by this process.
//!
//! One scenario per path (PostgreSQL direct, PostgreSQL through PgBouncer in
//! transaction mode, MariaDB) and mode, five faults in a row, each on the
//! leader of the moment, each in the middle of a transaction (after the
//! check and the insert, before the clock and `COMMIT`):
//! 1. `sigstop`: the leader is SIGSTOPped for longer than the lease and
//!    continued once a successor has committed a row;
//! 2. `sigstop_brief`: the leader is SIGSTOPped for [`BRIEF`], past the
//!    lease and short of the server's idle timeout, and continued;
//! 3. `partition_silent`: the leader's path goes silent (blackhole: the
//!    connections stay up, nothing moves), held until a successor has
//!    committed a row;
//! 4. `partition_reset`: the leader's path refuses connections and resets
//!    the ones it had, likewise;
//! 5. `sigkill`: the leader is SIGKILLed.
//!
//! The server ends a worker's transaction once it has been idle for [`IDLE`]
//! (PostgreSQL: `idle_in_transaction_session_timeout`, by `SET LOCAL` in each
//! transaction, which PgBouncer carries; MariaDB: the session's
//! `idle_transaction_timeout`): a checked transaction holds every claim off
//! while it is open, so a stopped or silent leader would otherwise hold the
//! election forever.
//!
//! The oracle (`ledger_support/oracle.rs`), on the committed rows in commit
//! order: fences never decrease, no row of term N commits after term N+1's
//! first row, one writer per fence; and the ledger agrees with what the
//! workers reported. Checked: the oracle must pass; the transactions of the
//! leaders stopped or cut off until a successor led must fail (their rows
//! absent), and no successor may lead before the server ended them; the
//! briefly stopped leader's transaction commits, nobody having led during
//! the stop; someone leads again after each fault within the stated bound
//! ([`RECOVERY`], plus [`IDLE`] where the transaction stays open on the
//! server). The negative control runs the same faults and writes, with the
//! same idle timeout, with `guard.is_valid()` before each transaction
//! instead of the check: the rows of the stopped, briefly stopped and
//! silent leaders must commit after their successors' first rows, and the
//! oracle must report each as a fence decrease and a late row.
//!
//! Each scenario prints `chaos-ledger <path>/<scenario> …` lines with what
//! it measured. Run with `bash scripts/test.sh`, or alone after
//! `source scripts/db.sh; source scripts/mysql.sh`:
//! `cargo test --features postgres,mysql,storetest --test chaos_ledger -- --test-threads 4 --nocapture`.

mod ledger_support;
mod mysql_support;
mod pg_support;
mod support;

use std::thread::sleep;
use std::time::{Duration, Instant};

use ledger_support::fleet::{Ev, Fleet, Kind};
use ledger_support::oracle::{judge, Row, Violation};
use ledger_support::{worker, Mode, Path, IDLE, RECOVERY};
use support::faults::Fault;
use support::TIMING;

/// For the first leader to commit rows: three processes start on a loaded
/// machine.
const FIRST: Duration = Duration::from_secs(20);
/// A fault lasts at least this long: longer than the lease.
const PAST_A_LEASE: Duration = Duration::from_millis(TIMING.lease_duration.as_millis() as u64 + 500);
/// How much earlier than [`IDLE`] after the paused insert a successor may
/// be seen leading (the server's timer starts when the insert's reply
/// leaves, a little before the worker reports the hold).
const IDLE_SLACK: Duration = Duration::from_millis(250);
/// From a leader's first lead to its first committed row.
const FIRST_ROW: Duration = Duration::from_secs(2);

/// The entry of a worker process: it does something only in the processes
/// the scenarios start (with `LE_LEDGER_WORKER` set); in an ordinary run it
/// returns at once.
#[test]
fn ledger_worker() {
    worker::run_if_asked();
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault4 {
    /// SIGSTOP, continued once a successor has committed a row.
    Sigstop,
    /// SIGSTOP for [`BRIEF`]: past the lease, short of [`IDLE`].
    SigstopBrief,
    /// The path goes silent (blackhole) until a successor has committed.
    PartitionSilent,
    /// The path refuses and resets its connections, likewise.
    PartitionReset,
    Sigkill,
}

impl Fault4 {
    fn name(self) -> &'static str {
        match self {
            Fault4::Sigstop => "sigstop",
            Fault4::SigstopBrief => "sigstop_brief",
            Fault4::PartitionSilent => "partition_silent",
            Fault4::PartitionReset => "partition_reset",
            Fault4::Sigkill => "sigkill",
        }
    }

    /// Whether the server learns at once that the transaction is gone (its
    /// connection closed); otherwise only the idle timeout ends it.
    fn closes_the_connection(self) -> bool {
        matches!(self, Fault4::PartitionReset | Fault4::Sigkill)
    }
}

const FAULTS: [Fault4; 5] =
    [Fault4::Sigstop, Fault4::SigstopBrief, Fault4::PartitionSilent, Fault4::PartitionReset, Fault4::Sigkill];

/// How long [`Fault4::SigstopBrief`] stops the leader: a second past the
/// lease (so the lease has run out on the database's clock), well short of
/// [`IDLE`] (so the server has not ended the transaction).
const BRIEF: Duration = Duration::from_millis(TIMING.lease_duration.as_millis() as u64 + 1000);

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

/// What one fault showed.
struct Seen {
    fault: Fault4,
    paused: usize,
    held: Ev,
    /// The paused transaction's outcome (none: killed).
    outcome: Option<Ev>,
}

fn scenario(path: Path, mode: Mode) {
    let label = match mode {
        Mode::Checked => "checked",
        Mode::Unchecked => "control",
    };
    let mut f = Fleet::start(path, mode, label, 3);
    let mut from = 0;
    let mut seen = Vec::new();
    for (n, fault) in FAULTS.into_iter().enumerate() {
        let (l, fence) = f.steady(from, if n == 0 { FIRST } else { RECOVERY + FIRST_ROW });
        seen.push(one_fault(&mut f, fault, l, fence));
        from = f.mark();
    }
    f.quiesce();
    let rows = f.tables.rows();
    assert_eq!(f.tables.unstamped(), 0, "{}: a committed row without its stamp", f.label);
    cross_check(&f, &rows, &seen);
    match mode {
        Mode::Checked => {
            let report = judge(&rows).unwrap_or_else(|v| {
                panic!(
                    "{}: the oracle found {} violation(s) with the check:\n  {}\n{}",
                    f.label,
                    v.len(),
                    v.iter().map(|v| v.to_string()).collect::<Vec<_>>().join("\n  "),
                    f.tail()
                )
            });
            assert!(report.terms.len() > FAULTS.len(), "{}: a term per fault and the first: {report}", f.label);
            let failed = seen.iter().filter(|s| s.outcome.as_ref().is_some_and(|o| o.kind == Kind::Failed)).count();
            let committed = seen.iter().filter(|s| s.outcome.as_ref().is_some_and(|o| o.kind == Kind::Committed));
            f.say(&format!(
                "RESULT ok: {report}; of the paused transactions {failed} failed, {} committed before the successor's \
                 claim, 1 was killed",
                committed.count()
            ));
        }
        Mode::Unchecked => {
            let v = judge(&rows).expect_err("the oracle passed a ledger written without the check");
            // The stopped and the silent leader committed after their successor:
            // both rows must be reported, in both ways.
            for s in seen.iter().filter(|s| !s.fault.closes_the_connection()) {
                let o = s.outcome.as_ref().unwrap();
                let worker = format!("w{}", s.paused);
                let about = |v: &&Violation| v.row().is_some_and(|r| r.worker == worker && r.seq == o.seq);
                assert!(
                    v.iter().filter(about).any(|v| matches!(v, Violation::FenceDecrease { .. })),
                    "{}: the oracle missed the fence decrease of {worker}'s late row {}: {v:?}",
                    f.label,
                    o.stamp
                );
                assert!(
                    v.iter().filter(about).any(|v| matches!(v, Violation::LateRow { .. })),
                    "{}: the oracle missed {worker}'s late row {} of term {}: {v:?}",
                    f.label,
                    o.stamp,
                    o.fence
                );
            }
            let late = v.iter().filter(|v| matches!(v, Violation::LateRow { .. })).count();
            let decreases = v.iter().filter(|v| matches!(v, Violation::FenceDecrease { .. })).count();
            f.say(&format!(
                "RESULT caught, as it must be: {late} late rows, {decreases} fence decreases; first: {}",
                v.first().map(|v| v.to_string()).unwrap_or_default()
            ));
        }
    }
}

/// Pauses leader `l` (of term `fence`) in the middle of a transaction with
/// `fault`, waits for a successor (or, checked and brief, makes sure there
/// is none), ends the fault after more than a lease, and checks what the
/// mode promises of the paused transaction.
fn one_fault(f: &mut Fleet, fault: Fault4, l: usize, fence: i64) -> Seen {
    let checked = f.mode == Mode::Checked;
    let name = format!("{}/{}", f.label, fault.name());
    let held = f.hold(l);
    let t0 = Instant::now();
    match fault {
        Fault4::Sigstop | Fault4::SigstopBrief => f.sigstop(l),
        Fault4::PartitionSilent => {
            f.proxy(l).set(Fault::Blackhole);
            f.go(l);
        }
        Fault4::PartitionReset => {
            f.proxy(l).set(Fault::Refuse);
            f.proxy(l).reset_all();
            f.go(l);
        }
        Fault4::Sigkill => f.sigkill(l),
    }
    let successor = |e: &Ev| e.kind == Kind::Lead && e.fence > fence;
    // Whether the paused transaction stays open on the server until it
    // resumes: a checked one then holds every claim off.
    let open_until_resumed = fault == Fault4::SigstopBrief && checked;
    let early = if open_until_resumed {
        let early = f.wait_event(held.idx, BRIEF, successor);
        assert!(
            early.is_none(),
            "{name}: w{} led while w{l}'s checked transaction was open ({} after the pause)\n{}",
            early.as_ref().map_or(0, |e| e.worker),
            early.as_ref().map_or_else(String::new, |e| ms(e.at - held.at)),
            f.tail()
        );
        None
    } else {
        let held_off = checked && !fault.closes_the_connection();
        let bound = if held_off { IDLE + RECOVERY } else { RECOVERY };
        let lead = f
            .wait_event(held.idx, bound, |e| successor(e) && e.worker != l)
            .unwrap_or_else(|| panic!("{name}: nobody led within {bound:?} after w{l}'s fault\n{}", f.tail()));
        if held_off {
            assert!(
                lead.at - held.at >= IDLE - IDLE_SLACK,
                "{name}: w{} led {} after w{l}'s paused insert, before the server could end that checked \
                 transaction ({IDLE:?} idle): the check did not hold the claim off",
                lead.worker,
                ms(lead.at - held.at)
            );
        }
        Some(lead)
    };
    // Hold the fault past a lease, then end it.
    let hold_for = if fault == Fault4::SigstopBrief { BRIEF } else { PAST_A_LEASE };
    if let Some(rest) = hold_for.checked_sub(t0.elapsed()) {
        sleep(rest);
    }
    let held_for = t0.elapsed();
    let ended = Instant::now();
    let outcome = match fault {
        Fault4::Sigstop | Fault4::SigstopBrief => {
            // The go is waiting in the pipe: on SIGCONT the worker goes on
            // from its hold point at once, as a paused thread would.
            f.go(l);
            f.sigcont(l);
            Some(f.outcome(l, held.seq, held.idx, Duration::from_secs(15)))
        }
        Fault4::PartitionSilent | Fault4::PartitionReset => {
            f.proxy(l).set(Fault::Pass);
            Some(f.outcome(l, held.seq, held.idx, Duration::from_secs(15)))
        }
        Fault4::Sigkill => None,
    };
    let lead = early.unwrap_or_else(|| {
        f.wait_event(held.idx, RECOVERY, successor)
            .unwrap_or_else(|| panic!("{name}: nobody led within {RECOVERY:?} after the fault ended\n{}", f.tail()))
    });
    let first_row = f
        .wait_event(lead.idx, FIRST_ROW, |e| e.kind == Kind::Committed && e.worker == lead.worker)
        .unwrap_or_else(|| panic!("{name}: the successor w{} wrote no row\n{}", lead.worker, f.tail()));
    let what = match &outcome {
        None => "was killed".to_owned(),
        Some(o) if o.kind == Kind::Committed => {
            let when = if o.stamp > first_row.stamp { "after" } else { "before" };
            format!("COMMITTED as row {} ({when} the successor's first, {})", o.stamp, first_row.stamp)
        }
        Some(o) => format!("failed at {}: {}", o.stage, o.err),
    };
    let led = if open_until_resumed {
        format!(
            "nobody led during the stop; w{} (term {}) led {} after SIGCONT",
            lead.worker,
            lead.fence,
            ms(lead.at - ended)
        )
    } else {
        format!(
            "successor w{} (term {}) led {} after the fault ({} after the paused insert)",
            lead.worker,
            lead.fence,
            ms(lead.at - t0),
            ms(lead.at - held.at)
        )
    };
    f.say(&format!(
        "{}: w{l} paused in term {fence} for {}; {led}, first row {} after the fault; the paused transaction {what}",
        fault.name(),
        ms(held_for),
        ms(first_row.at - t0),
    ));
    if let Some(o) = &outcome {
        if open_until_resumed {
            // Checked, and continued before the server ended it: it commits,
            // and before anyone's claim (the oracle checks the order).
            assert_eq!(o.kind, Kind::Committed, "{name}: the open checked transaction failed: {} {}", o.stage, o.err);
        } else if !checked && !fault.closes_the_connection() {
            assert_eq!(
                o.kind,
                Kind::Committed,
                "{name}: the control's paused transaction did not commit, so it cannot show the violation (was it \
                 idle for longer than {IDLE:?}?): {} {}",
                o.stage,
                o.err
            );
            assert!(o.stamp > first_row.stamp, "{name}: the paused row was not late");
        } else {
            assert_eq!(
                o.kind,
                Kind::Failed,
                "{name}: w{l}'s paused transaction of term {fence} committed (row {}) after its successor's row {}",
                o.stamp,
                first_row.stamp
            );
        }
    }
    Seen { fault, paused: l, held, outcome }
}

/// The ledger agrees with what the workers reported: every reported commit
/// is there with its stamp; every row was reported committed (or its
/// commit's reply was lost); no paused transaction that failed left a row.
fn cross_check(f: &Fleet, rows: &[Row], seen: &[Seen]) {
    let events = f.events();
    let key = |w: &str, seq: i64| (w.to_owned(), seq);
    let by_key: std::collections::HashMap<(String, i64), i64> =
        rows.iter().map(|r| (key(&r.worker, r.seq), r.stamp)).collect();
    for e in events.iter().filter(|e| e.kind == Kind::Committed) {
        assert_eq!(
            by_key.get(&key(&format!("w{}", e.worker), e.seq)),
            Some(&e.stamp),
            "{}: w{} reported transaction {} committed as row {}, the ledger disagrees",
            f.label,
            e.worker,
            e.seq,
            e.stamp
        );
    }
    let reported: std::collections::HashSet<(String, i64)> = events
        .iter()
        .filter(|e| e.kind == Kind::Committed || (e.kind == Kind::Failed && e.stage == "commit"))
        .map(|e| key(&format!("w{}", e.worker), e.seq))
        .collect();
    for r in rows {
        assert!(
            reported.contains(&key(&r.worker, r.seq)),
            "{}: row {} ({} seq {}) is in the ledger, but its worker did not commit it",
            f.label,
            r.stamp,
            r.worker,
            r.seq
        );
    }
    for s in seen {
        let k = key(&format!("w{}", s.paused), s.held.seq);
        match &s.outcome {
            Some(o) if o.kind == Kind::Committed => {}
            _ => assert!(
                !by_key.contains_key(&k),
                "{}/{}: the paused transaction {k:?} failed or died, yet its row is in the ledger",
                f.label,
                s.fault.name()
            ),
        }
    }
    let mut stages: std::collections::BTreeMap<&str, usize> = Default::default();
    for e in events.iter().filter(|e| e.kind == Kind::Failed) {
        *stages.entry(e.stage.as_str()).or_default() += 1;
    }
    let stages: Vec<String> = stages.iter().map(|(s, n)| format!("{s}×{n}")).collect();
    let check_lost = events.iter().filter(|e| e.kind == Kind::CheckLost).count();
    f.say(&format!(
        "{} rows committed; transactions that failed, by the statement that failed: {}; {check_lost} checks said \
         the lease was lost",
        rows.len(),
        if stages.is_empty() { "none".to_owned() } else { stages.join(" ") }
    ));
}

/// One test per row: the scenario on `path` in `mode` (its messages name
/// both).
macro_rules! scenarios {
    ($($test:ident: $path:expr, $mode:expr;)*) => {$(
        #[test]
        fn $test() {
            scenario($path, $mode);
        }
    )*};
}

scenarios! {
    checked_writes_never_commit_after_a_successor_postgres: Path::Pg, Mode::Checked;
    checked_writes_never_commit_after_a_successor_pgbouncer: Path::Bouncer, Mode::Checked;
    checked_writes_never_commit_after_a_successor_mariadb: Path::Maria, Mode::Checked;
    without_the_check_paused_writes_commit_after_a_successor_postgres: Path::Pg, Mode::Unchecked;
    without_the_check_paused_writes_commit_after_a_successor_pgbouncer: Path::Bouncer, Mode::Unchecked;
    without_the_check_paused_writes_commit_after_a_successor_mariadb: Path::Maria, Mode::Unchecked;
}

/// The oracle on hand-made ledgers: commit order with rising fences
/// passes; a row of an older term after the next term's first fails both
/// ways; one fence of two writers fails.
#[test]
fn the_ledger_oracle_judges_commit_order() {
    let row = |stamp, fence, w: &str, seq| Row { stamp, fence, worker: w.to_owned(), seq };
    let ok = [row(1, 10, "w0", 1), row(2, 10, "w0", 2), row(4, 20, "w1", 1), row(3, 10, "w0", 3)];
    let r = judge(&ok).expect("an ordered ledger");
    assert_eq!((r.rows, r.terms.len()), (4, 2));
    let late = [row(1, 10, "w0", 1), row(2, 20, "w1", 1), row(3, 10, "w0", 2), row(4, 20, "w1", 2)];
    let v = judge(&late).unwrap_err();
    assert!(
        v.iter().any(|v| matches!(v, Violation::FenceDecrease { row, after_fence: 20 } if row.stamp == 3)),
        "{v:?}"
    );
    assert!(v.iter().any(|v| matches!(v, Violation::LateRow { row, next_first_stamp: 2, .. } if row.stamp == 3)));
    assert_eq!(v.len(), 2, "{v:?}");
    let shared = [row(1, 10, "w0", 1), row(2, 10, "w1", 1)];
    assert!(matches!(&judge(&shared).unwrap_err()[..], [Violation::SharedFence { fence: 10, .. }]));
}
