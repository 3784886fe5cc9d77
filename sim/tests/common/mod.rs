//! What the simulation's test binaries (`sim`, `sim_group`) share.

use std::io::Write;

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
