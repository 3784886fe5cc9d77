//! Row 10: a clean hand-over through the command-line tool, child to child
//! (issue 36): from the leading run's child exiting to the next run's child
//! starting, with the feed of releases and with the poll alone.
//!
//! `followers + 1` runs of `leaderelection run` (the release build of the
//! tool, `LE_CLI_BIN`) contend for one election, each with `bench_child`
//! (`child.rs`, built beside this benchmark) as its command: a child
//! writes `start FENCE NS` to a shared log, waits until the controller
//! creates `go.FENCE`, then writes `end FENCE NS` and exits. Its run then
//! releases the lease and exits, and the controller starts another run so
//! `followers` keep waiting. Measured on the host's clock between the `end`
//! line and the next `start` line, both written by children; a start before
//! the previous end is two children at once, a violation.

use std::fs;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::Duration;

use crate::child::CHILD_ENV;
use crate::common::{ms, pct, poll, random_below, random_tag, violation, OwnTable, Table, Verdict};

/// The runs' timings: lease 5 s (a killed run would hold it that long),
/// renew 1 s, retry 1 s (as row 9), grace 1 s.
const TIMING: [&str; 12] =
    ["--lease", "5s", "--renew", "1s", "--retry", "1s", "--op-timeout", "1s", "--margin", "1s", "--grace", "1s"];

/// The `kind` lines of the log: `(fence, ns)` in the order written.
fn lines(dir: &Path, kind: &str) -> Vec<(String, u128)> {
    let text = fs::read_to_string(dir.join("log")).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let mut f = l.split(' ');
            (f.next()? == kind).then_some(())?;
            Some((f.next()?.to_owned(), f.next()?.parse().ok()?))
        })
        .collect()
}

/// The runs, SIGKILLed when dropped: each run's sentinel then kills its
/// child's group.
struct Runs(Vec<Child>);

impl Drop for Runs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `trials` hand-overs through the tool on `dsn`, `followers` runs waiting;
/// adds a row.
pub fn run(
    label: &str, cli: &Path, dsn: &str, feed: bool, followers: usize, trials: usize, table: &mut Table,
) -> Result<(), String> {
    let own = OwnTable::new(dsn, "cli");
    let schema = Command::new(cli)
        .args(["schema", "--apply", "-q", "--dsn", dsn, "--table", &own.name])
        .status()
        .map_err(|e| format!("cannot run {}: {e}", cli.display()))?;
    if !schema.success() {
        return Err(format!("{label}: `leaderelection schema --apply` failed: {schema}"));
    }
    let tag = random_tag();
    let dir = std::env::temp_dir().join(format!("le-bench-cli-{tag}"));
    fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let result = measure(label, cli, dsn, &own.name, &format!("cli-{tag}"), feed, followers, trials, &dir);
    let _ = fs::remove_dir_all(&dir);
    let mut took = result?;
    let (p50, p99) = (pct(&mut took, 50.0), pct(&mut took, 99.0));
    table.add(
        format!("10. clean hand-over through the CLI, child to child, {label}, {followers} followers (retry 1 s)"),
        format!("p50 {}, p99 {}, max {} ({trials} hand-overs)", ms(p50), ms(p99), ms(took[took.len() - 1])),
        "p50 ≤ 5 ms, p99 ≤ 20 ms",
        Verdict::of(p50 <= 5.0 && p99 <= 20.0),
    );
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn measure(
    label: &str, cli: &Path, dsn: &str, table: &str, name: &str, feed: bool, followers: usize, trials: usize,
    dir: &Path,
) -> Result<Vec<f64>, String> {
    let me = std::env::current_exe().map_err(|e| e.to_string())?.with_file_name("bench_child");
    if !me.exists() {
        return Err(format!(
            "{} is missing: build it with `cargo build --release --example bench_child`",
            me.display()
        ));
    }
    let spawn = || {
        let mut cmd = Command::new(cli);
        cmd.args(["run", "-q", "--dsn", dsn, "--table", table, "--name", name]).args(TIMING);
        if !feed {
            cmd.arg("--no-release-feed");
        }
        cmd.arg("--").arg(&me).env(CHILD_ENV, dir);
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
        cmd.spawn().map_err(|e| format!("cannot run {}: {e}", cli.display()))
    };
    let mut runs = Runs((0..=followers).map(|_| spawn()).collect::<Result<_, _>>()?);
    let mut took = Vec::new();
    let mut ended: Option<(String, u128)> = None;
    for trial in 0..=trials {
        let done: Vec<String> = lines(dir, "end").into_iter().map(|(f, _)| f).collect();
        let (fence, start) = poll(Duration::from_secs(15), Duration::from_micros(500), || {
            lines(dir, "start").into_iter().find(|(f, _)| !done.contains(f))
        })
        .ok_or_else(|| format!("{label}: no run led within 15 s"))?;
        if let Some((prev, end)) = &ended {
            if start < *end {
                violation(&format!("{label}: the child of fence {fence} started before that of fence {prev} ended"));
            }
            took.push(start.saturating_sub(*end) as f64 / 1e6);
        }
        if trial == trials {
            break;
        }
        // The run that led last has exited: start another, so `followers`
        // wait; let it connect and look, and let the poll phases fall anywhere.
        for c in &mut runs.0 {
            if c.try_wait().map_err(|e| e.to_string())?.is_some() {
                *c = spawn()?;
            }
        }
        thread::sleep(Duration::from_millis(1500) + random_below(Duration::from_secs(1)));
        fs::write(dir.join(format!("go.{fence}")), b"").map_err(|e| e.to_string())?;
        ended = Some(
            poll(Duration::from_secs(5), Duration::from_micros(500), || {
                lines(dir, "end").into_iter().find(|(f, _)| *f == fence)
            })
            .ok_or_else(|| format!("{label}: the child of fence {fence} did not end"))?,
        );
    }
    Ok(took)
}
