//! Row 7: lease-checked transactions (issue 17), per path: PostgreSQL
//! direct and through PgBouncer (`PostgresStore::check_lease` on a
//! `postgres::Client`), MariaDB (`MySqlStore::check_lease` on a
//! `mysql::Conn`), each transaction at the server's default isolation level.
//!
//! - Cost: on one connection of a plain client (not the store's), N
//!   transactions `BEGIN; <statement>; COMMIT` of each kind, alternating,
//!   the statement either the store's `check_lease` of a live term or a
//!   plain `SELECT 1` sent the same way; the statement's round trip is
//!   timed, and so is the `COMMIT` after it (a check locks the lease row,
//!   which a `SELECT 1` does not). Then transactions that insert one row,
//!   with and without a check first, timed from `BEGIN` to `COMMIT`. The
//!   first transactions of each loop are a warm-up and not counted (the
//!   first check also reads the catalog for the index it needs).
//! - Renewals not delayed: a leader renewing every 20 ms, every store call
//!   timed by the counting wrapper, through phases with no checked
//!   transaction and phases in which 4 threads, each on a connection of its
//!   own, keep checked transactions open back to back (`BEGIN; check; 50–100
//!   ms; COMMIT`), alternating; each renewal counts for the phase it started
//!   in. A checked phase starts once every thread has made its first check
//!   and ends when they are told to stop. On MariaDB the row also gives the
//!   server's `Innodb_row_lock_waits` over the checked phases (every
//!   client's waits: a renewal that waited for a check would count). The
//!   holder must keep its one term throughout (no term ended, the fence
//!   unchanged). A design whose checks blocked renewals shows here as a
//!   MISSED latency, and lost terms, not as a failed run (tried by hand, see
//!   BENCHMARKS.md).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use leaderelection::mysql::MySqlStore;
use leaderelection::postgres::PostgresStore;
use leaderelection::{Config, Elector, LeaderGuard, Store, StoreError, Timing};
use mysql::prelude::Queryable;

use crate::common::{ms, pct, poll, random_below, random_tag, Counting, OwnTable, Table, Verdict};

/// Renew every 20 ms, so a phase of a few seconds holds a few hundred
/// renewals. Invariant: 20 ms + 2 × 0.5 s + 50 ms = 1.07 s <= 3 s − 1 s.
const TIMING: Timing = Timing {
    lease_duration: Duration::from_secs(3),
    renew_interval: Duration::from_millis(20),
    retry_period: Duration::from_secs(1),
    operation_timeout: Duration::from_millis(500),
    safety_margin: Duration::from_secs(1),
};

/// Threads keeping checked transactions open, and how long each stays open:
/// `OPEN_MIN` plus a uniformly random part of `OPEN_SPREAD`.
const THREADS: usize = 4;
const OPEN_MIN: Duration = Duration::from_millis(50);
const OPEN_SPREAD: Duration = Duration::from_millis(50);

/// Transactions of each kind left out at the start of the cost run.
const WARM_UP: usize = 50;

/// How much to measure.
struct Sizes {
    /// Transactions of each kind for the cost.
    samples: usize,
    /// Transactions of each kind that also write a row.
    writes: usize,
    /// Rounds of (phase without, phase with checked transactions).
    rounds: usize,
    phase: Duration,
}

impl Sizes {
    fn new(quick: bool) -> Sizes {
        if quick {
            Sizes { samples: 1000, writes: 200, rounds: 2, phase: Duration::from_secs(2) }
        } else {
            Sizes { samples: 3000, writes: 600, rounds: 3, phase: Duration::from_secs(8) }
        }
    }
}

/// The store whose lease check is measured, for one path.
pub enum Checker {
    Pg(PostgresStore),
    My(MySqlStore),
}

impl Checker {
    pub fn postgres(url: &str, table: &str) -> Result<Checker, String> {
        let s = PostgresStore::builder(url).table("public", table).build().map_err(|e| e.to_string())?;
        s.ensure_schema().map_err(|e| format!("ensure_schema: {e}"))?;
        Ok(Checker::Pg(s))
    }

    pub fn mysql(url: &str, table: &str) -> Result<Checker, String> {
        let s = MySqlStore::builder(url).table(table).build().map_err(|e| e.to_string())?;
        s.ensure_schema().map_err(|e| format!("ensure_schema: {e}"))?;
        Ok(Checker::My(s))
    }

    fn store(&self) -> Arc<dyn Store> {
        match self {
            Checker::Pg(s) => Arc::new(s.clone()),
            Checker::My(s) => Arc::new(s.clone()),
        }
    }

    /// A plain client of the server's own driver, for the transactions.
    fn connect(&self, url: &str) -> Result<Conn, String> {
        match self {
            Checker::Pg(_) => crate::common::pg_client(url).map(|c| Conn::Pg(Box::new(c))),
            Checker::My(_) => crate::common::my_client(url).map(Conn::My),
        }
    }
}

/// A connection of the program's own, on which it opens transactions.
enum Conn {
    Pg(Box<postgres::Client>),
    My(mysql::Conn),
}

impl Conn {
    /// One statement in one round trip (the simple query protocol).
    fn exec(&mut self, sql: &str) -> Result<(), String> {
        match self {
            Conn::Pg(c) => c.batch_execute(sql).map_err(|e| format!("{sql}: {e}")),
            Conn::My(c) => c.query_drop(sql).map_err(|e| format!("{sql}: {e}")),
        }
    }

    /// A table for the writing transactions: an id and a fence.
    fn create_ledger(&mut self, table: &str) -> Result<(), String> {
        match self {
            Conn::Pg(_) => {
                self.exec(&format!("CREATE TABLE {table} (id bigserial PRIMARY KEY, fence bigint NOT NULL)"))
            }
            Conn::My(_) => self.exec(&format!(
                "CREATE TABLE {table} (id bigint AUTO_INCREMENT PRIMARY KEY, fence bigint unsigned NOT NULL) \
                 ENGINE=InnoDB"
            )),
        }
    }

    fn begin(&mut self) -> Result<(), String> {
        match self {
            Conn::Pg(_) => self.exec("BEGIN"),
            Conn::My(_) => self.exec("START TRANSACTION"),
        }
    }

    fn commit(&mut self) -> Result<(), String> {
        self.exec("COMMIT")
    }

    /// The lease check of `guard`'s term, in the open transaction.
    fn check(&mut self, checker: &Checker, guard: &LeaderGuard) -> Result<(), StoreError> {
        match (self, checker) {
            (Conn::Pg(c), Checker::Pg(s)) => s.check_lease(c.as_mut(), guard),
            (Conn::My(c), Checker::My(s)) => s.check_lease(c, guard),
            _ => Err(StoreError::fatal("a connection of one server and a store of the other")),
        }
    }

    /// The server's count of row lock waits since it started (InnoDB's
    /// `Innodb_row_lock_waits`, every client's), where there is one.
    fn row_lock_waits(&mut self) -> Result<Option<u64>, String> {
        match self {
            Conn::Pg(_) => Ok(None),
            Conn::My(c) => c
                .query_first::<(String, u64), _>("SHOW GLOBAL STATUS LIKE 'Innodb_row_lock_waits'")
                .map(|r| r.map(|(_, n)| n))
                .map_err(|e| format!("Innodb_row_lock_waits: {e}")),
        }
    }

    /// `SELECT 1`, sent as the check is (PostgreSQL: `query_typed`, an
    /// unnamed statement: parse, bind, execute in one round trip; MySQL: a
    /// prepared statement, prepared once and then executed from the
    /// connection's statement cache, one round trip).
    fn select_one(&mut self) -> Result<(), String> {
        match self {
            Conn::Pg(c) => c.query_typed("SELECT 1", &[]).map(drop).map_err(|e| format!("SELECT 1: {e}")),
            Conn::My(c) => c.exec_first::<i64, _, _>("SELECT 1", ()).map(drop).map_err(|e| format!("SELECT 1: {e}")),
        }
    }
}

/// Row 7 on one path: the check's cost, then renewals with and without
/// checked transactions.
pub fn run(label: &str, url: &str, checker: &Checker, quick: bool, table: &mut Table) -> Result<(), String> {
    let sizes = Sizes::new(quick);
    cost(label, url, checker, &sizes, table)?;
    renewals(label, url, checker, &sizes, table)
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Milliseconds as [`ms`] writes them, without the unit.
fn num(millis: f64) -> String {
    ms(millis).trim_end_matches(" ms").to_owned()
}

/// `p50 a / b, p99 a / b` in milliseconds, of microsecond samples.
fn p50_p99(a: &mut [f64], b: &mut [f64]) -> String {
    let f = |v: &mut [f64], p| num(pct(v, p) / 1000.0);
    format!("p50 {} / {}, p99 {} / {}", f(a, 50.0), f(b, 50.0), f(a, 99.0), f(b, 99.0))
}

fn cost(label: &str, url: &str, checker: &Checker, sizes: &Sizes, table: &mut Table) -> Result<(), String> {
    let name = format!("check-cost-{}", random_tag());
    let e = Elector::start(Config::new(checker.store(), name).identity("leader")).map_err(|e| e.to_string())?;
    let guard = e.wait_leader_timeout(Duration::from_secs(20)).map_err(|e| format!("{label}: leader: {e}"))?;
    let mut conn = checker.connect(url)?;
    let n = sizes.samples;
    let (mut check, mut select) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let (mut commit_checked, mut commit_plain) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..WARM_UP + n {
        let order = if i % 2 == 0 { [true, false] } else { [false, true] };
        for checked in order {
            conn.begin()?;
            let t1 = Instant::now();
            if checked {
                conn.check(checker, &guard).map_err(|e| format!("{label}: check_lease of the live term: {e}"))?;
            } else {
                conn.select_one()?;
            }
            let t2 = Instant::now();
            conn.commit()?;
            let t3 = Instant::now();
            if i >= WARM_UP {
                let (stmt, commit) =
                    if checked { (&mut check, &mut commit_checked) } else { (&mut select, &mut commit_plain) };
                stmt.push(micros(t2 - t1));
                commit.push(micros(t3 - t2));
            }
        }
    }
    // Transactions that write a row, as a checked transaction would: the
    // whole transaction, checked and not.
    let ledger = OwnTable::new(url, "check_ledger");
    conn.create_ledger(&ledger.name)?;
    let insert = format!("INSERT INTO {} (fence) VALUES ({})", ledger.name, guard.fence());
    let w = sizes.writes;
    let (mut tx_checked, mut tx_plain) = (Vec::with_capacity(w), Vec::with_capacity(w));
    for i in 0..WARM_UP + w {
        let order = if i % 2 == 0 { [true, false] } else { [false, true] };
        for checked in order {
            let t0 = Instant::now();
            conn.begin()?;
            if checked {
                conn.check(checker, &guard).map_err(|e| format!("{label}: check_lease of the live term: {e}"))?;
            }
            conn.exec(&insert)?;
            conn.commit()?;
            if i >= WARM_UP {
                if checked { &mut tx_checked } else { &mut tx_plain }.push(micros(t0.elapsed()));
            }
        }
    }
    drop(guard);
    let _ = e.shutdown();
    table.add(
        format!("7. lease check inside a transaction, {label}: round trip of `check_lease` / of `SELECT 1`"),
        format!("{} ms ({n} transactions each, one connection)", p50_p99(&mut check, &mut select)),
        "—",
        Verdict::Info,
    );
    table.add(
        format!("7. the `COMMIT` after it, {label}: checked / `SELECT 1` only"),
        format!("{} ms", p50_p99(&mut commit_checked, &mut commit_plain)),
        "—",
        Verdict::Info,
    );
    table.add(
        format!("7. a transaction that inserts one row, `BEGIN` to `COMMIT`, {label}: checked / not"),
        format!("{} ms ({w} transactions each)", p50_p99(&mut tx_checked, &mut tx_plain)),
        "—",
        Verdict::Info,
    );
    Ok(())
}

/// What the threads keeping checked transactions open counted.
#[derive(Default)]
struct Load {
    /// Checked transactions committed.
    committed: AtomicU64,
    /// Checks that failed (the holder kept its lease, so none should).
    failed: AtomicU64,
    /// Threads that have made their first check of the phase.
    started: AtomicUsize,
    stop: AtomicBool,
}

/// Keeps checked transactions open back to back until told to stop.
fn keep_checking(conn: &mut Conn, checker: &Checker, guard: &LeaderGuard, load: &Load) -> Result<(), String> {
    let mut first = true;
    while !load.stop.load(Relaxed) {
        conn.begin()?;
        let checked = conn.check(checker, guard);
        if first {
            load.started.fetch_add(1, Relaxed);
            first = false;
        }
        if let Err(e) = checked {
            if load.failed.fetch_add(1, Relaxed) == 0 {
                eprintln!("bench: a lease check failed while the holder renewed (only the first is shown): {e}");
            }
            conn.exec("ROLLBACK")?;
            thread::sleep(Duration::from_millis(10));
            continue;
        }
        thread::sleep(OPEN_MIN + random_below(OPEN_SPREAD));
        conn.commit()?;
        load.committed.fetch_add(1, Relaxed);
    }
    Ok(())
}

fn renewals(label: &str, url: &str, checker: &Checker, sizes: &Sizes, table: &mut Table) -> Result<(), String> {
    let counting = Counting::new(checker.store(), true);
    let name = format!("check-renew-{}", random_tag());
    let e = Elector::start(Config::new(Arc::clone(&counting), name).identity("leader").timing(TIMING))
        .map_err(|e| e.to_string())?;
    let guard = e.wait_leader_timeout(Duration::from_secs(20)).map_err(|e| format!("{label}: leader: {e}"))?;
    let fence = guard.fence();
    let mut conns = (0..THREADS).map(|_| checker.connect(url)).collect::<Result<Vec<_>, _>>()?;
    let mut monitor = checker.connect(url)?;
    // Row lock waits on the server during the checked phases, where counted.
    let mut lock_waits = Some(0u64);
    thread::sleep(Duration::from_millis(200));
    let calls0 = counting.calls();
    let load = Load::default();
    // (start, end, with checked transactions)
    let mut windows: Vec<(Instant, Instant, bool)> = Vec::new();
    for _ in 0..sizes.rounds {
        let t = Instant::now();
        thread::sleep(sizes.phase);
        windows.push((t, Instant::now(), false));
        load.stop.store(false, Relaxed);
        load.started.store(0, Relaxed);
        let waits_before = monitor.row_lock_waits()?;
        thread::scope(|s| {
            let workers: Vec<_> =
                conns.iter_mut().map(|c| s.spawn(|| keep_checking(c, checker, &guard, &load))).collect();
            let all_started = poll(Duration::from_secs(5), Duration::from_millis(1), || {
                (load.started.load(Relaxed) == THREADS).then_some(())
            });
            let t = Instant::now();
            if all_started.is_some() {
                thread::sleep(sizes.phase);
            }
            load.stop.store(true, Relaxed);
            windows.push((t, Instant::now(), true));
            for w in workers {
                w.join().expect("a checking thread panicked")?;
            }
            all_started.ok_or_else(|| format!("{label}: the checking threads had not all made a check within 5 s"))
        })?;
        let waits = monitor.row_lock_waits()?.zip(waits_before).map(|(after, before)| after - before);
        lock_waits = lock_waits.zip(waits).map(|(sum, w)| sum + w);
    }
    let status = e.status();
    let calls = counting.calls().since(&calls0);
    let still = guard.is_valid() && e.fence() == Some(fence);
    drop(guard);
    let _ = e.shutdown();

    let (mut with, mut without) = (Vec::new(), Vec::new());
    for c in counting.take_timed().into_iter().filter(|c| c.renewal) {
        if let Some(&(_, _, checked)) = windows.iter().find(|(a, b, _)| c.start >= *a && c.start < *b) {
            if checked { &mut with } else { &mut without }.push(f64::from(c.micros));
        }
    }
    if without.is_empty() {
        return Err(format!("{label}: no renewal in a phase without checked transactions"));
    }
    let others = calls.total() - calls.renew;
    if others > 0 {
        eprintln!("bench: {label}: the leader also made {others} calls other than renewals: {calls:?}");
    }
    let row = format!(
        "7. the leader's renewal latency, {label} (renewing every {} ms): with {THREADS} threads keeping checked \
         transactions open ({}–{} ms each, back to back) / with none",
        TIMING.renew_interval.as_millis(),
        OPEN_MIN.as_millis(),
        (OPEN_MIN + OPEN_SPREAD).as_millis()
    );
    let target = "p99 with ≤ 2 × p99 without + 5 ms";
    if with.is_empty() {
        table.add(row, "no renewal in a phase with checked transactions", target, Verdict::Missed);
    } else {
        let (p99_with, p99_without) = (pct(&mut with, 99.0) / 1000.0, pct(&mut without, 99.0) / 1000.0);
        let (max_with, max_without) = (pct(&mut with, 100.0) / 1000.0, pct(&mut without, 100.0) / 1000.0);
        let mut measured = format!(
            "{} ms, max {} / {} ({} / {} renewals, {} phases of {:.0} s each; {} checked transactions",
            p50_p99(&mut with, &mut without),
            num(max_with),
            ms(max_without),
            with.len(),
            without.len(),
            sizes.rounds,
            sizes.phase.as_secs_f64(),
            load.committed.load(Relaxed)
        );
        if let Some(w) = lock_waits {
            let _ = write!(measured, "; InnoDB row lock waits on the server during the checked phases: {w}");
        }
        measured.push(')');
        table.add(row, measured, target, Verdict::of(p99_with <= 2.0 * p99_without + 5.0));
    }
    // Terms that ended, or began after the first (one lost and won back);
    // at least one when the guard is no longer valid under its fence.
    let lost = (status.terms_ended.total() + status.terms_started.saturating_sub(1)).max(u64::from(!still));
    let failed = load.failed.load(Relaxed);
    table.add(
        format!("7. terms the holder lost during that run, {label}"),
        format!(
            "{lost} ({} term{} started, fence {}; {} renewals failed, {failed} checks failed)",
            status.terms_started,
            if status.terms_started == 1 { "" } else { "s" },
            if still { "unchanged" } else { "changed or the term ended" },
            status.renewals_failed
        ),
        "0",
        Verdict::of(lost == 0 && failed == 0),
    );
    Ok(())
}
