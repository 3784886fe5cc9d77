//! The library's log lines on stderr: one per term start, term end (with
//! its cause when it ended early), leader seen, failed store call. `--quiet`
//! keeps only warnings and errors: the lines that say something is wrong.

use std::io::{self, Write};

use log::{Level, Log, Metadata, Record};

/// The modules whose lines are printed.
const ELECTOR: [&str; 2] = ["leaderelection::handoff", "leaderelection::elector"];

struct Stderr {
    level: Level,
}

impl Log for Stderr {
    fn enabled(&self, m: &Metadata<'_>) -> bool {
        // The elector's lines; the stores' own (a failed connect) would
        // repeat what the elector or the tool reports of the same failure.
        m.level() <= self.level && ELECTOR.contains(&m.target())
    }

    fn log(&self, r: &Record<'_>) {
        if self.enabled(r.metadata()) {
            // The library's lines start with `leaderelection: ` already.
            let _ = writeln!(io::stderr(), "{}", r.args());
        }
    }

    fn flush(&self) {}
}

/// Installs the logger for `run`: info lines, or with `quiet` warnings only.
pub fn install(quiet: bool) {
    let level = if quiet { Level::Warn } else { Level::Info };
    if log::set_boxed_logger(Box::new(Stderr { level })).is_ok() {
        log::set_max_level(level.to_level_filter());
    }
}
