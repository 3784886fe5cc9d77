//! What the simulation's test binaries (`sim`, `sim_group`) share.

use std::io::Write;
use std::time::Duration;

use leaderelection_sim::{from_hex, Host, Timeline};

/// A host on a steady link (requests 100-200 ms, replies 50-300 ms) whose
/// clock runs at `rate_ppm`, starting at once: the liveness formulas' tests.
pub fn steady_host(rate_ppm: u64) -> Host {
    Host {
        rate_ppm,
        clock_offset: Duration::from_secs(86_400),
        req_delay: (Duration::from_millis(100), Duration::from_millis(200)),
        rep_delay: (Duration::from_millis(50), Duration::from_millis(300)),
        start_at: Duration::ZERO,
        release_on_shutdown: true,
        guard_hold: Duration::ZERO,
        phase: Duration::ZERO,
    }
}

/// The number in variable `name`, if set; a value that is not one fails
/// the test, saying so.
pub fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| v.trim().parse().unwrap_or_else(|_| panic!("{name}={v:?} is not a number")))
}

/// Prints past the test harness's capture, so plain `cargo test` shows what
/// was explored.
pub fn report(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// The threads an exploration runs on: one per core.
pub fn threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

/// What a `replay` test runs: the variant named in `{prefix}_VARIANT`
/// (`normal` if unset) and the schedule decoded from the hex in
/// `{prefix}_BYTES`, else drawn from the seed in `{prefix}_SEED`, else
/// from seed 42, with its seed.
pub fn replay_choice<V, S>(
    prefix: &str, variant: impl Fn(&str) -> Option<V>, from_bytes: impl Fn(&[u8], V) -> S,
    from_seed: impl Fn(u64, V) -> S,
) -> (Option<u64>, S) {
    let v = std::env::var(format!("{prefix}_VARIANT")).unwrap_or_else(|_| "normal".to_owned());
    let v = variant(&v).unwrap_or_else(|| panic!("unknown {prefix}_VARIANT {v:?}"));
    match (std::env::var(format!("{prefix}_BYTES")), env_u64(&format!("{prefix}_SEED"))) {
        (Ok(hex), _) => (None, from_bytes(&from_hex(&hex).unwrap_or_else(|| panic!("{prefix}_BYTES is not hex")), v)),
        (_, Some(seed)) => (Some(seed), from_seed(seed, v)),
        _ => (Some(42), from_seed(42, v)),
    }
}

/// Prints a replayed run: its schedule, its trace, then its report.
pub fn print_run(schedule: &dyn std::fmt::Display, trace: &[String], summary: &dyn std::fmt::Debug) {
    println!("schedule: {schedule}");
    for line in trace {
        println!("{line}");
    }
    println!("{summary:#?}");
}

/// Two traced runs of seed `seed`'s schedule (`a`, `b`) went the same
/// way, a quiet one too (its trace's hash), and the trace is longer than
/// `min`.
pub fn assert_same_runs(seed: u64, min: usize, a: &Timeline, b: &Timeline, quiet: &Timeline) {
    assert!(a.trace.len() > min, "trace too short: {}", a.trace.len());
    assert_eq!(a.trace, b.trace, "seed {seed} ran differently twice");
    assert_eq!(a.trace_hash, b.trace_hash);
    assert_eq!(a.trace_hash, quiet.trace_hash, "tracing changed the run");
}

/// `command` sets `env` (the variables before the command) and names this
/// package, this test binary and the test `replay` in it, so it breaks if
/// either is moved or renamed.
pub fn assert_replays_here(command: &str, env: &str) {
    let this =
        format!("cargo test -p {} --test {} replay -- --nocapture", env!("CARGO_PKG_NAME"), env!("CARGO_CRATE_NAME"));
    assert!(command.ends_with(&this), "{command}");
    assert!(command.starts_with(env), "{command}");
}
