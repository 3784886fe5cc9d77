//! The project measuring itself: rows 1–5 and 7–12 of BENCHMARKS.md (row 6,
//! the build footprint, is measured by `scripts/bench.sh`, which runs this).
//!
//! ```sh
//! bash scripts/bench.sh            # the full run, with row 6
//! bash scripts/bench.sh --quick    # shorter trials, no row 6
//! ```
//!
//! Needs `LE_PG_DSN`, `LE_PGBOUNCER_DSN` and `LE_MYSQL_URL`, and for row 10
//! `LE_CLI_BIN`, the tool's release build (the script sets them all). Prints one Markdown table on stdout, progress on stderr. Exits 2
//! on a safety violation (two leaders of one election at once, or a fence
//! that did not increase), 1 when a row could not be measured; a missed
//! speed target is a `MISSED` verdict, not a failure.

mod chain;
mod check;
mod child;
mod cli_handover;
#[allow(dead_code)]
#[path = "../../tests/group_support/clock.rs"]
mod clock;
mod common;
mod cost;
mod failover;
#[allow(dead_code)]
#[path = "../../tests/support/faults.rs"]
mod faults;
#[path = "../../tests/forward/mod.rs"]
mod forward;
mod groups;
mod handover;
mod handover_procs;
mod micro;
mod one_driver;
#[allow(dead_code)]
#[path = "../../tests/support/ports.rs"]
mod ports;
mod scale;

use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{Table, Verdict, VIOLATIONS};
use cost::Kind;

struct Args {
    quick: bool,
    only: Option<Vec<u32>>,
    /// Row 8's paths by label (`--path MariaDB`); all when absent.
    paths: Option<Vec<String>>,
}

fn args() -> Result<Args, String> {
    let mut a = Args { quick: false, only: None, paths: None };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--quick" => a.quick = true,
            "--only" => {
                let list = it.next().ok_or("--only needs a list of rows, e.g. 1,4")?;
                a.only = Some(
                    list.split(',')
                        .map(|r| r.trim().parse().map_err(|_| format!("bad row {r:?}")))
                        .collect::<Result<_, _>>()?,
                );
            }
            "--path" => {
                let list = it.next().ok_or("--path needs a list of row 8's paths, e.g. PostgreSQL,MariaDB")?;
                a.paths = Some(list.split(',').map(|p| p.trim().to_owned()).collect());
            }
            _ => return Err(format!("unknown argument {arg:?} (known: --quick, --only ROWS, --path PATHS)")),
        }
    }
    Ok(a)
}

fn env(name: &str) -> Result<String, String> {
    std::env::var(name).map_err(|_| {
        format!("{name} is not set: run `bash scripts/bench.sh`, which sources scripts/db.sh and scripts/mysql.sh")
    })
}

fn run(a: &Args, table: &mut Table) -> Result<(), String> {
    let want = |row| a.only.as_ref().is_none_or(|o| o.contains(&row));
    let t = Instant::now();
    let step = |what: &str| eprintln!("bench: [{:6.1} s] {what}", t.elapsed().as_secs_f64());
    let (pg, bouncer, my) = (env("LE_PG_DSN")?, env("LE_PGBOUNCER_DSN")?, env("LE_MYSQL_URL")?);
    // The rows that measure every path to a database run on these three.
    let every_path =
        [("PostgreSQL", Kind::Postgres, &pg), ("PgBouncer", Kind::Postgres, &bouncer), ("MariaDB", Kind::MariaDb, &my)];
    if want(1) {
        step("row 1: is_valid / is_leader / Instant::now");
        micro::run(a.quick, table)?;
    }
    // PostgreSQL direct and MariaDB twice: with the feed of releases and
    // without it, so the poll it replaces is measured in the same run.
    let with_poll_alone = [
        ("PostgreSQL", Kind::Postgres, &pg, true),
        ("PostgreSQL, poll only", Kind::Postgres, &pg, false),
        ("PgBouncer", Kind::Postgres, &bouncer, true),
        ("MariaDB", Kind::MariaDb, &my, true),
        ("MariaDB, poll only", Kind::MariaDb, &my, false),
    ];
    if want(2) || want(3) {
        // 10 elections at once; per path 4 rounds (40 crashes, 120 hand-overs),
        // 2 rounds and 1 hand-over per trial when quick.
        let (rounds, handovers) = if a.quick { (2, 1) } else { (4, 3) };
        for (label, kind, url, feed) in with_poll_alone {
            step(&format!("rows 2-3: takeover, failover, hand-over on {label}"));
            let own = common::OwnTable::new(url, "takeover");
            let make = || kind.store_with_feed(url, &own.name, feed);
            failover::run(label, &make, 10, rounds, handovers, table)?;
        }
    }
    if want(9) {
        let trials = if a.quick { 10 } else { 20 };
        for (label, kind, url, feed) in with_poll_alone {
            for n in [2, 100] {
                step(&format!("row 9: clean hand-over on {label}, {n} followers"));
                let own = common::OwnTable::new(url, "handover");
                let make = || kind.store_with_feed(url, &own.name, feed);
                handover::run(label, &make, n, trials, table)?;
            }
        }
        // The same with every follower in a process of its own, each with a
        // store of its own (three sessions each: the pool's, the listening
        // one, a lock waiter): on PostgreSQL on the private cluster of
        // `scripts/bench.sh` (`LE_BENCH_PG_MANY_DSN`, room for 500
        // sessions); without it, 25 followers on the shared server (100).
        let many = std::env::var("LE_BENCH_PG_MANY_DSN").ok();
        let pg_procs = match &many {
            Some(dsn) => ("PostgreSQL", Kind::Postgres, dsn, 100),
            None => ("PostgreSQL (shared server: 25 followers, not 100)", Kind::Postgres, &pg, 25),
        };
        for (label, kind, url, most) in [pg_procs, ("MariaDB", Kind::MariaDb, &my, 100)] {
            for n in [2, most] {
                step(&format!("row 9: clean hand-over on {label}, {n} followers in processes of their own"));
                handover_procs::run(label, kind, url, n, trials, table)?;
            }
        }
    }
    if want(10) {
        let cli = std::path::PathBuf::from(env("LE_CLI_BIN")?);
        let trials = if a.quick { 10 } else { 20 };
        for (label, url, feed) in
            [("PostgreSQL", &pg, true), ("PostgreSQL, poll only", &pg, false), ("MariaDB", &my, true)]
        {
            step(&format!("row 10: clean hand-over through the CLI on {label}"));
            cli_handover::run(label, &cli, url, feed, 2, trials, table)?;
        }
    }
    if want(11) {
        step("row 11: one election, Elector and Group of one");
        one_driver::run(a.quick, table)?;
    }
    if want(12) {
        // A probe of a feed not built yet (see chain.rs); like row 9's
        // process lines, 100 followers need the private cluster.
        let trials = if a.quick { 10 } else { 20 };
        let many = std::env::var("LE_BENCH_PG_MANY_DSN").ok();
        let (label, dsn, most) = match &many {
            Some(dsn) => ("PostgreSQL", dsn, 100),
            None => ("PostgreSQL (shared server: 40 followers, not 100)", &pg, 40),
        };
        for n in [2, most] {
            for mode in ["pass", "hold"] {
                step(&format!("row 12: {n} followers queued on an advisory lock, {mode}"));
                chain::run(label, dsn, n, trials, mode, table)?;
            }
        }
    }
    if want(4) {
        step("row 4: cost per election per minute (PostgreSQL and MariaDB at once)");
        let window = Duration::from_secs(if a.quick { 20 } else { 60 });
        let (p, m) = std::thread::scope(|s| {
            let p = s.spawn(|| cost::measure(Kind::Postgres, &pg, window));
            let m = s.spawn(|| cost::measure(Kind::MariaDb, &my, window));
            (p.join().expect("row 4 panicked"), m.join().expect("row 4 panicked"))
        });
        cost::report(&p?, table);
        cost::report(&m?, table);
    }
    if want(5) {
        let window = Duration::from_secs(if a.quick { 15 } else { 60 });
        for (label, kind, url) in [("PostgreSQL", Kind::Postgres, &pg), ("MariaDB", Kind::MariaDb, &my)] {
            step(&format!("row 5: 1,000 electors on {label}"));
            let own = common::OwnTable::new(url, "scale");
            scale::run(label, url, kind.store(url, &own.name)?, window, table)?;
        }
    }
    if want(7) {
        for (label, kind, url) in every_path {
            step(&format!("row 7: lease-checked transactions on {label}"));
            let own = common::OwnTable::new(url, "check");
            let checker = match kind {
                Kind::Postgres => check::Checker::postgres(url, &own.name)?,
                Kind::MariaDb => check::Checker::mysql(url, &own.name)?,
            };
            check::run(label, url, &checker, a.quick, table)?;
        }
    }
    if want(8) {
        use groups::ServerCount;
        for (label, kind, url, count) in [
            ("PostgreSQL", Kind::Postgres, &pg, ServerCount::PgDatabase),
            ("PgBouncer", Kind::Postgres, &bouncer, ServerCount::None),
            ("MariaDB", Kind::MariaDb, &my, ServerCount::MariaDbGlobal),
        ] {
            if a.paths.as_ref().is_some_and(|p| !p.iter().any(|p| p == label)) {
                continue;
            }
            step(&format!("row 8: 10,000 elections in each of 3 processes on {label}"));
            groups::run(label, kind, url, count, a.quick, table)?;
        }
    }
    step("done");
    Ok(())
}

fn main() -> ExitCode {
    if std::env::var_os(groups::WORKER_ENV).is_some() {
        return groups::worker_main();
    }
    if std::env::var_os(handover_procs::WORKER_ENV).is_some() {
        return handover_procs::worker_main();
    }
    if std::env::var_os(chain::WORKER_ENV).is_some() {
        return chain::worker_main();
    }
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("bench: {e}");
            return ExitCode::from(1);
        }
    };
    let mut table = Table::default();
    let result = run(&a, &mut table);
    let violations = VIOLATIONS.load(Ordering::Relaxed);
    if violations > 0 {
        table.add("safety", format!("{violations} violations (see stderr)"), "0", Verdict::Violation);
    }
    print!("{}", table.markdown());
    match result {
        Err(e) => {
            eprintln!("bench: FAILED: {e}");
            ExitCode::from(if violations > 0 { 2 } else { 1 })
        }
        Ok(()) if violations > 0 => ExitCode::from(2),
        Ok(()) => ExitCode::SUCCESS,
    }
}
