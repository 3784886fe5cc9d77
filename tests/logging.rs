//! What the elector tells an operator through the `log` crate: who leads and
//! with which fence, and when a term ends. Never the payload.

use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use leaderelection::{Config, Elector, MemStore, Timing};

struct Capture(Mutex<Vec<String>>);

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, record: &log::Record<'_>) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(format!("{} {}", record.level(), record.args()));
    }
    fn flush(&self) {}
}

fn capture() -> &'static Capture {
    static LOGGER: OnceLock<&'static Capture> = OnceLock::new();
    LOGGER.get_or_init(|| {
        let logger: &'static Capture = Box::leak(Box::new(Capture(Mutex::new(Vec::new()))));
        log::set_logger(logger).expect("the only logger in this test binary");
        log::set_max_level(log::LevelFilter::Info);
        logger
    })
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn the_log_names_the_leader_the_fence_and_the_end_of_the_term_but_not_the_payload() {
    let logs = capture();
    let store = MemStore::new();
    let timing = Timing {
        lease_duration: ms(1500),
        renew_interval: ms(300),
        retry_period: ms(200),
        operation_timeout: ms(300),
        safety_margin: ms(200),
    };
    let e = Elector::start(
        Config::new(store.clone(), "invoices").identity("web-1").payload(&b"secret-address"[..]).timing(timing),
    )
    .unwrap();
    let guard = e.wait_leader_timeout(Duration::from_secs(5)).expect("leads alone");
    let fence = guard.fence();
    drop(guard); // resigns: the term ends and is logged
    let deadline = Instant::now() + Duration::from_secs(5);
    let find = |needle: &str| logs.0.lock().unwrap().iter().any(|l| l.contains("\"invoices\"") && l.contains(needle));
    let (stopped, leader) =
        (format!("stopped leading with fence {fence}"), format!("leader is \"web-1\" with fence {fence}"));
    while !(find(&stopped) && find(&leader)) {
        assert!(Instant::now() < deadline, "missing log lines: {:?}", logs.0.lock().unwrap());
        std::thread::sleep(ms(2));
    }
    e.shutdown().unwrap();
    let all = logs.0.lock().unwrap().clone();
    assert!(all.iter().any(|l| l.starts_with("INFO ") && l.contains("\"web-1\" stopped leading")), "{all:?}");
    assert!(all.iter().all(|l| !l.contains("secret")), "the payload leaked into the log: {all:?}");
}

#[test]
fn a_term_that_runs_out_is_logged_with_its_fence_and_why() {
    let logs = capture();
    let store = MemStore::new();
    let timing = Timing {
        lease_duration: ms(1500),
        renew_interval: ms(300),
        retry_period: ms(200),
        operation_timeout: ms(300),
        safety_margin: ms(200),
    };
    let e = Elector::start(Config::new(store.clone(), "reports").identity("web-2").timing(timing)).unwrap();
    let guard = e.wait_leader_timeout(Duration::from_secs(5)).expect("leads alone");
    store.pause(); // renewals hang: only the deadline ends the term
    assert!(!guard.wait_lost_timeout(Duration::from_secs(5)).timed_out());
    // The watchdog and the renewal thread both watch the deadline; whichever
    // ends the term says so: a warning from the watchdog, or the term's end
    // with its reason from the renewal thread.
    let fence = guard.fence();
    let by_watchdog = format!("\"web-2\" stepped down at its local deadline (fence {fence})");
    let by_renewal = format!("\"web-2\" stopped leading with fence {fence}: ExpiredLocally");
    let seen = |l: &String| {
        l.contains("\"reports\"")
            && ((l.starts_with("WARN ") && l.contains(&by_watchdog))
                || (l.starts_with("INFO ") && l.contains(&by_renewal)))
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while !logs.0.lock().unwrap().iter().any(seen) {
        let now = Instant::now();
        if now >= deadline {
            let all = logs.0.lock().unwrap().clone();
            panic!("the end of the term was not logged: {all:?}");
        }
        std::thread::sleep(ms(2));
    }
    store.resume();
    drop(guard);
    e.shutdown_without_release();
}
