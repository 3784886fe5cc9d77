//! Row 11: one election run by an `Elector` and by a `Group` of one, side
//! by side (issue 35: could the `Elector` be a `Group` of one, with one
//! driver, "without losing a test or a figure"?).
//!
//! On a `MemStore` of its own each (no database: the figures are the
//! drivers'), with the timings of rows 2, 3 and 9 (lease 3 s, renew 500 ms, retry 1 s):
//! - a leader alone for a window: its store calls per renew interval
//!   (lease calls and member heartbeats), and how often its threads woke
//!   (voluntary context switches of the whole process per second; nothing
//!   else runs in it then);
//! - a clean hand-over to one follower in the same process, from the
//!   leader's `shutdown()` to the follower's guard;
//! - the configurations an `Elector` accepts that a `Group` refuses (its
//!   timing invariant adds the grid step), over a grid of timings.

use std::time::{Duration, Instant};

use leaderelection::{Config, Election, Elector, Group, GroupConfig, LeaderGuard, MemStats, MemStore};

use crate::common::{ms, pct, Table, Verdict};
use crate::failover::TIMING;

/// Which driver runs the election.
#[derive(Clone, Copy)]
enum Driver {
    Elector,
    /// A `Group` of one, on the tick given or on its default grid.
    Group {
        tick: Option<Duration>,
    },
}

/// The group's config for `config`, on `tick` or on the default grid.
fn group_config(config: Config, tick: Option<Duration>) -> GroupConfig {
    let gc = GroupConfig::new(config);
    match tick {
        Some(t) => gc.tick(t),
        None => gc,
    }
}

/// One election, run by either driver.
enum One {
    Elector(Elector),
    Group(Group, Election),
}

impl One {
    fn start(driver: Driver, config: Config) -> Result<One, String> {
        match driver {
            Driver::Elector => Elector::start(config).map(One::Elector).map_err(|e| e.to_string()),
            Driver::Group { tick } => {
                let g = Group::start(group_config(config, tick)).map_err(|e| e.to_string())?;
                let e = g.join("one").map_err(|e| e.to_string())?;
                Ok(One::Group(g, e))
            }
        }
    }

    fn wait(&self) -> Result<LeaderGuard, String> {
        let r = match self {
            One::Elector(e) => e.wait_leader_timeout(Duration::from_secs(10)),
            One::Group(_, e) => e.wait_leader_timeout(Duration::from_secs(10)),
        };
        r.map_err(|e| format!("never led: {e}"))
    }

    fn shutdown(&self) -> Result<(), String> {
        match self {
            One::Elector(e) => e.shutdown(),
            One::Group(g, _) => g.shutdown(),
        }
        .map_err(|e| format!("release failed: {e}"))
    }
}

fn config(store: &MemStore, identity: &str) -> Config {
    Config::new(store.clone(), "one").identity(identity).timing(TIMING)
}

/// Voluntary context switches of every thread of this process.
fn wakeups() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return 0 };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("status")).ok())
        .filter_map(|s| s.lines().find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))?.trim().parse::<u64>().ok())
        .sum()
}

fn round_trips(s: &MemStats) -> u64 {
    s.acquires + s.renews + s.releases + s.inspects
}

/// The leader alone for `window`: (store calls, heartbeats) per renew
/// interval, wake-ups per second, threads added.
fn alone(driver: Driver, window: Duration) -> Result<(f64, f64, f64, u64), String> {
    let store = MemStore::new();
    let threads_before = crate::common::proc_status().2;
    let one = One::start(driver, config(&store, "leader"))?;
    let guard = one.wait()?;
    std::thread::sleep(TIMING.renew_interval);
    let threads = crate::common::proc_status().2 - threads_before;
    let (s0, w0, t) = (store.stats(), wakeups(), Instant::now());
    std::thread::sleep(window);
    let (s1, w1, took) = (store.stats(), wakeups(), t.elapsed());
    drop(guard);
    one.shutdown()?;
    let intervals = took.as_secs_f64() / TIMING.renew_interval.as_secs_f64();
    let calls = (round_trips(&s1) - round_trips(&s0)) as f64 / intervals;
    let beats = (s1.heartbeats - s0.heartbeats) as f64 / intervals;
    Ok((calls, beats, (w1 - w0) as f64 / took.as_secs_f64(), threads))
}

/// `trials` clean hand-overs to one follower: p50 and max.
fn hand_overs(driver: Driver, trials: usize) -> Result<(Duration, Duration), String> {
    let mut took = Vec::with_capacity(trials);
    for _ in 0..trials {
        let store = MemStore::new();
        let leader = One::start(driver, config(&store, "leader"))?;
        let guard = leader.wait()?;
        let follower = One::start(driver, config(&store, "follower"))?;
        std::thread::sleep(TIMING.retry_period * 2);
        drop(guard);
        let t = Instant::now();
        leader.shutdown()?;
        let next = follower.wait()?;
        took.push(t.elapsed());
        drop(next);
        follower.shutdown()?;
    }
    Ok((pct(&mut took, 50.0), pct(&mut took, 100.0)))
}

/// Over a grid of timings: how many an `Elector` accepts, and how many of
/// those a `Group` refuses (on its default grid, or with the tick at the
/// shorter of the renew interval and the retry period when `coarse`),
/// with the first refused.
fn configs(coarse: bool) -> (usize, usize, Option<String>) {
    let (mut accepted, mut refused, mut first) = (0, 0, None);
    for lease in [1, 2, 3, 5, 8, 10, 15, 20, 30, 60] {
        for renew in [100, 200, 250, 500, 1_000, 2_000, 3_000, 5_000, 10_000] {
            for retry in [50, 100, 200, 250, 500, 1_000, 2_000, 3_000, 5_000] {
                for op in [100, 250, 500, 1_000, 2_000, 3_000] {
                    let c = Config::new(MemStore::new(), "one")
                        .lease_duration(Duration::from_secs(lease))
                        .renew_interval(Duration::from_millis(renew))
                        .retry_period(Duration::from_millis(retry))
                        .operation_timeout(Duration::from_millis(op));
                    if c.validate().is_err() {
                        continue;
                    }
                    accepted += 1;
                    let shorter = coarse.then(|| Duration::from_millis(renew.min(retry)));
                    if group_config(c, shorter).validate().is_err() {
                        refused += 1;
                        first.get_or_insert(format!("lease {lease} s, renew {renew} ms, retry {retry} ms, op {op} ms"));
                    }
                }
            }
        }
    }
    (accepted, refused, first)
}

pub fn run(quick: bool, table: &mut Table) -> Result<(), String> {
    let (window, trials) = if quick { (Duration::from_secs(4), 10) } else { (Duration::from_secs(10), 20) };
    let shorter = TIMING.renew_interval.min(TIMING.retry_period);
    for (label, driver) in [
        ("Elector", Driver::Elector),
        ("Group of one", Driver::Group { tick: None }),
        ("Group of one, tick = shorter period", Driver::Group { tick: Some(shorter) }),
    ] {
        // A group refuses some timings an Elector accepts: that refusal is
        // the figure.
        if let Driver::Group { tick } = driver {
            if let Err(e) = group_config(config(&MemStore::new(), "leader"), tick).validate() {
                table.add(format!("11. one election, {label}"), format!("refused: {e}"), "—", Verdict::Info);
                continue;
            }
        }
        let (calls, beats, woke, threads) = alone(driver, window)?;
        table.add(
            format!("11. one election, {label}, leader alone"),
            format!(
                "{calls:.2} lease calls + {beats:.2} heartbeats per renew interval; \
                 {woke:.0} wake-ups/s; {threads} threads"
            ),
            "—",
            Verdict::Info,
        );
        let (p50, max) = hand_overs(driver, trials)?;
        table.add(
            format!("11. one election, {label}, clean hand-over to 1 follower ({trials} trials)"),
            format!("p50 {} / max {}", ms(p50.as_secs_f64() * 1e3), ms(max.as_secs_f64() * 1e3)),
            "—",
            Verdict::Info,
        );
    }
    for (label, coarse) in [("default grid", false), ("tick = shorter period", true)] {
        let (accepted, refused, first) = configs(coarse);
        table.add(
            format!("11. timings an Elector accepts that a Group refuses ({label})"),
            format!("{refused} of {accepted}; the first: {}", first.unwrap_or_else(|| "none".into())),
            "—",
            Verdict::Info,
        );
    }
    Ok(())
}
