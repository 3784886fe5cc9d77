//! What the simulation's test binaries (`sim`, `sim_group`) share.

use std::io::Write;
use std::time::Duration;

use leaderelection_sim::Host;

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
