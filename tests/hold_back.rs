//! Waiting for leadership while holding a guard of the ended term: the
//! elector never campaigns while such a guard lives (two terms of one process
//! never overlap in user code), so a program written as
//! `guard = elector.wait_leader()?` waits forever. `Status::held_back` shows
//! it, and a warning says so once it has lasted a lease duration.
//!
//! Its own test binary: it installs a logger to read the warning.

use std::sync::Mutex;
use std::thread;
use std::time::Duration;

use leaderelection::{Config, Elector, ErrorKind, MemStore, Timing, WaitLeaderError};

mod threaded;
use threaded::{eventually, ms};

static LINES: Mutex<Vec<(log::Level, String)>> = Mutex::new(Vec::new());

struct Capture;

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }
    fn log(&self, record: &log::Record) {
        LINES.lock().unwrap().push((record.level(), record.args().to_string()));
    }
    fn flush(&self) {}
}

fn warnings_about_holding() -> Vec<String> {
    let lines = LINES.lock().unwrap();
    lines
        .iter()
        .filter(|(level, line)| *level == log::Level::Warn && line.contains("does not campaign"))
        .map(|(_, line)| line.clone())
        .collect()
}

#[test]
fn an_old_guard_held_while_waiting_holds_the_next_term_back_and_says_so() {
    log::set_logger(&Capture).unwrap();
    log::set_max_level(log::LevelFilter::Debug);
    // 300 + 2*300 + 75 = 975 ms <= 1500 - 200 ms.
    let timing = Timing {
        lease_duration: ms(1500),
        renew_interval: ms(300),
        retry_period: ms(100),
        operation_timeout: ms(300),
        safety_margin: ms(200),
    };
    let store = MemStore::new();
    let elector = Elector::start(Config::new(store.clone(), "held").identity("a").timing(timing)).unwrap();
    let old = elector.wait_leader_timeout(Duration::from_secs(5)).unwrap();
    assert!(!elector.status().held_back);

    // The term ends under the program (a fatal renewal), which keeps its guard.
    store.set_failing(Some(ErrorKind::Fatal));
    assert!(!old.wait_lost_timeout(Duration::from_secs(5)).timed_out(), "the term ends");
    store.set_failing(None);
    assert!(eventually(Duration::from_secs(2), || elector.status().held_back), "{:?}", elector.status());

    // The store works again, but no new term starts while the old guard lives.
    let waited = elector.wait_leader_timeout(ms(600));
    assert_eq!(waited.err(), Some(WaitLeaderError::Timeout));
    assert!(!elector.is_leader());
    assert!(warnings_about_holding().is_empty(), "no warning before a lease has passed");

    // Once the hold has lasted a lease duration, one warning names it.
    assert!(eventually(Duration::from_secs(3), || !warnings_about_holding().is_empty()), "a warning after a lease");
    let warnings = warnings_about_holding();
    assert!(warnings[0].contains("\"held\"") && warnings[0].contains(&old.fence().to_string()), "{warnings:?}");
    thread::sleep(ms(400)); // several polls later: still the one warning
    assert_eq!(warnings_about_holding().len(), 1);

    // Dropping it lets the elector campaign at once.
    let fence = old.fence();
    drop(old);
    let next = elector.wait_leader_timeout(Duration::from_secs(5)).expect("leads once the old guard is gone");
    assert!(next.fence() > fence);
    assert!(!elector.status().held_back);
    drop(next);
    elector.shutdown().unwrap();
}
