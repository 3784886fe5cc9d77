//! Row 10's command: the child each `leaderelection run` starts while it
//! leads (issue 36). A program of its own with nothing but the standard
//! library, so that what row 10 measures is the tool's hand-over, not the
//! start of a large command (the benchmark's own executable, which loads
//! the TLS libraries, took about 3 ms more to reach its `main`).
//!
//! It writes `start FENCE NS` to `$LE_BENCH_CLI_CHILD/log`, waits until
//! the controller creates `go.FENCE` (at most a minute), then writes
//! `end FENCE NS` and exits.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Set (to the log's directory) in each run's environment.
pub const CHILD_ENV: &str = "LE_BENCH_CLI_CHILD";

/// The host's clock, in nanoseconds since the epoch: the controller and
/// every child read the same one.
pub fn now_ns() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos())
}

fn log(dir: &Path, line: &str) -> std::io::Result<()> {
    // One write of one short line to a file opened for appending: the
    // lines of several children never interleave.
    OpenOptions::new().create(true).append(true).open(dir.join("log"))?.write_all(line.as_bytes())
}

/// The child's whole life.
pub fn child_main() -> ExitCode {
    let dir = PathBuf::from(std::env::var_os(CHILD_ENV).unwrap_or_default());
    let fence = std::env::var("LEADERELECTION_FENCE").unwrap_or_default();
    if log(&dir, &format!("start {fence} {}\n", now_ns())).is_err() {
        return ExitCode::from(1);
    }
    let go = dir.join(format!("go.{fence}"));
    let until = Instant::now() + Duration::from_secs(60);
    while !go.exists() {
        if Instant::now() >= until {
            return ExitCode::from(1);
        }
        thread::sleep(Duration::from_millis(1));
    }
    match log(&dir, &format!("end {fence} {}\n", now_ns())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) => ExitCode::from(1),
    }
}

// The benchmark includes this file for `CHILD_ENV`; there `main` is unused.
#[allow(dead_code)]
fn main() -> ExitCode {
    child_main()
}
